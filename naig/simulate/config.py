"""Configuration of a simulation: a tree of common fields, rule options and one setting (docs/design.md §8).

::

    SimulateConfig          strategies, steps, seeds, lr, optimizer, batch_size, eval_every,
    │                       eval_batches, device, threads, jobs, model, data, data_bytes, sketch_seed, line,
    │                       log_dir, faults
    ├── rules               RuleOptions: beta, dc_lambda, byzantine, max_staleness, clip, reference
    └── setting             exactly one of (naig.simulate.settings):
        ├── lags            LagsSetting: lags, warmup_theta0, save_grads, save_at
        ├── arrivals        ArrivalsSetting: compute, uplink, downlink, mode, window, bandwidth,
        │   └── local       LocalUpdates: steps, outer_lr, outer_momentum, topology, gossip_step, form
        └── distributed     DistributedSetting: nproc, window, slowdown, sketch_first, timeout

Each part validates its own fields on construction; ``SimulateConfig`` checks only what
joins them (the workers the faults name, the rules a setting runs). The same tree is read
from a TOML or JSON file (``load``, ``from_dict``) and written into every result
(``to_dict``), so a result's ``config`` block loads back and reproduces the run.

``from_options`` maps the CLI's option names onto the tree (``OPTIONS``: one path per
option). An option is *given* when it is passed (not None); options of two settings are
refused with one line saying which setting each belongs to (``_wrong_setting``).

Example:
    >>> cfg = SimulateConfig.from_options(lags=(0, 5), steps=10, seeds=1, strategies=("naig", "hogwild"))
    >>> cfg.workers, cfg.total_steps, cfg.setting.lags
    (2, 20, (0, 5))
    >>> SimulateConfig.from_options(lags=(0, 5), arrivals="exp:1,exp:2")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    naig.errors.UsageError: lags=(0, 5): belongs to fixed lags, and `arrivals` chose the arrivals setting ...
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from naig.choices import ENGINES, LOCAL_METHODS, OPTIMIZERS, REFERENCES
from naig.errors import UsageError
from naig.gibbs import parse_beta
from naig.io import missing_reason
from naig.metric import DEFAULT_LINE, parse_line
from naig.simulate.checks import MAX_STEPS, as_tuple, check, check_writable_dir, is_int, is_number
from naig.simulate.faults import FAULT_KINDS, GRADIENT_FAULTS, Fault, check_faults, parse_faults
from naig.simulate.model import get_preset
from naig.simulate.options import DEFAULT_STRATEGIES, DOCS, Doc, option
from naig.simulate.parallel import MAX_JOBS, resolve_jobs
from naig.simulate.results import SCHEMA_VERSION
from naig.simulate.runs import RunRules, log_name
from naig.simulate.settings import SETTINGS, LagsSetting, LocalUpdates, Setting
from naig.simulate.strategies import STRATEGIES, StrategyOptions, parse_clip
from naig.simulate.workload import WorkloadConfig, resolve_device
from naig.sketch.core import check_seed
from naig.sketch.torch_sketch import TorchSketch
from naig.threads import check_threads

GIBBS_RULES = frozenset({"naig", "naig-exact", "diloco-naig", "diloco-naig-exact"})
"""The rules and local-update methods whose Gibbs weights ``rules.beta`` sets."""

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, from PyPI (a dependency there only)
    import tomli as tomllib

__all__ = [
    "GIBBS_RULES",
    "SimulateConfig",
    "RuleOptions",
    "OPTIONS",
    "DEFAULT_STRATEGIES",
    "MAX_STEPS",
    "config_tree",
    "SET_KEYS",
    "parse_int_list",
    "parse_float_list",
    "resolve_device",
]

MAX_CONFIG_BYTES = 64 * 2**20  # a --json result of many runs fits; a device or a runaway file does not
MAX_SEEDS = 10**6  # a run takes seconds at the least: more seeds than any experiment can finish is a typo


@dataclass(frozen=True)
class RuleOptions:
    """The options of the combination rules (each rule uses the ones it needs).

    Attributes:
        beta: Gibbs inverse temperature of the naig rules: a float ≥ 0 or ``"auto"``.
        dc_lambda: DC-ASGD's λ (measured: benchmarks/dc_lambda.py, docs/design.md §12).
        byzantine: f: trimmed-mean trims f per side; krum scores K − f − 2 neighbours.
        max_staleness: drop-stale keeps τ ≤ this (None: K).
        clip: centered-clip radius, or ``"auto"`` (median ‖g_k − v‖).
        reference: naig's reference: ``auto`` (ema for single arrivals, else batch), ``batch``
            (the freshest of the batch) or ``ema``.
    """

    beta: float | str = option("rules.beta")
    dc_lambda: float = option("rules.dc_lambda")
    byzantine: int = option("rules.byzantine")
    max_staleness: int | None = option("rules.max_staleness")
    clip: float | str = option("rules.clip")
    reference: str = option("rules.reference")

    def __post_init__(self) -> None:
        object.__setattr__(self, "beta", parse_beta(self.beta))
        object.__setattr__(self, "clip", parse_clip(self.clip))
        lam = self.dc_lambda
        check(is_number(lam) and math.isfinite(lam) and lam >= 0,
              "dc_lambda", self.dc_lambda, "DC-ASGD's λ must be finite and >= 0, e.g. 20")
        check(is_int(self.byzantine) and self.byzantine >= 0, "byzantine", self.byzantine,
              "use an int >= 0, e.g. 1")
        check(self.max_staleness is None or (is_int(self.max_staleness) and self.max_staleness >= 0),
              "max_staleness", self.max_staleness,
              "use an int >= 0 (the largest staleness drop-stale keeps), e.g. 4")
        check(self.reference in REFERENCES, "reference", self.reference,
              f"use one of {', '.join(REFERENCES)}")


_SETTING_NAMES = {"lags": "fixed lags", "arrivals": "the arrivals setting",
                  "distributed": "the distributed engine"}
_CHOSEN_BY = {"lags": "`lags`", "arrivals": "`arrivals`", "distributed": "`engine` distributed"}


@dataclass(frozen=True)
class SimulateConfig:
    """Everything that determines a simulation (defaults: under a minute on 2 CPU cores, runs side by side).

    Every part is checked on construction (``dataclasses.replace`` checks again), before
    anything is trained or written; build one from option names with ``from_options``,
    from a file with ``load``, from a result's ``config`` block with ``from_dict``.

    Raises:
        UsageError: naming the bad field (``UsageError.field``, the option's name) and the fix.
    """

    strategies: tuple[str, ...] | None = option("strategies")
    steps: int = option("steps")
    seeds: int = option("seeds")
    lr: tuple[float, ...] = option("lr")
    optimizer: str = option("optimizer")
    batch_size: int = option("batch_size")
    eval_every: int = option("eval_every")
    eval_batches: int = option("eval_batches")
    device: str = option("device")
    threads: int = option("threads")
    jobs: int = option("jobs")
    model: str = option("model")
    data: str | None = option("data")
    data_bytes: int = option("data_bytes")
    sketch_seed: int = option("sketch_seed")
    line: tuple[int, int, int] = option("line")
    log_dir: str | None = option("log_dir")
    faults: tuple[str, ...] = option("faults")
    rules: RuleOptions = field(default_factory=RuleOptions)
    setting: Setting = field(default_factory=LagsSetting)

    def __post_init__(self) -> None:
        if isinstance(self.rules, dict):
            object.__setattr__(self, "rules", RuleOptions(**self.rules))
        if self.strategies is None:
            object.__setattr__(self, "strategies", DEFAULT_STRATEGIES[self.setting.NAME])
        for name in ("strategies", "faults"):  # text: one name, or a comma list
            value = getattr(self, name)
            text = isinstance(value, str)
            example = "'naig', 'hogwild'" if name == "strategies" else "'1:nan@5'"
            object.__setattr__(self, name, tuple(v.strip() for v in value.split(",")) if text else
                               as_tuple(value, name, example))
            check(all(isinstance(v, str) for v in getattr(self, name)), name, value,
                  "use names, e.g. naig,hogwild" if name == "strategies" else "use fault texts, e.g. 1:nan@5")
        object.__setattr__(self, "lr", as_tuple(self.lr, "lr", "1e-3"))
        object.__setattr__(self, "line", parse_line(self.line))
        self._check_numbers()
        check_threads(self.threads)
        check(is_int(self.jobs) and 0 <= self.jobs <= MAX_JOBS, "jobs", self.jobs,
              f"use an int from 0 to {MAX_JOBS} (processes running runs side by side; 0: one per core), "
              "e.g. 2")
        self._check_strategies()
        check_seed(self.sketch_seed, "sketch_seed")
        get_preset(self.model)
        if self.log_dir is not None:
            check(isinstance(self.log_dir, str) and self.log_dir.strip() != "", "log_dir", self.log_dir,
                  "give a folder for the per-step CSV files, e.g. runs/logs")
            check(self.setting.ENGINE == "simulated", "log_dir", self.log_dir, "the distributed engine "
                  "writes no per-step log (each run's validation curve is in the result); drop it")
            check_writable_dir(self.log_dir, "log_dir")
            self._check_log_names()
        self._check_setting()
        self._check_faults()
        self.strategy_warnings()  # every strategy is defined in this setting and batch size
        resolve_jobs(self, self.seeds * len(self.strategies) * len(self.lr), resolve_device(self.device))

    # -- building ------------------------------------------------------------------------------

    @classmethod
    def from_options(cls, **options: Any) -> SimulateConfig:
        """A config from option names (``OPTIONS``; ``engine`` chooses the distributed setting).

        An option passed as None is not given. The setting is chosen by ``engine``
        distributed, else by ``arrivals``, else fixed lags; an option of another setting
        is refused.

        Raises:
            UsageError: naming the option (an unknown one, one of another setting, a bad value).
        """
        given = {k: v for k, v in options.items() if v is not None}
        engine = given.pop("engine", "simulated")
        check(engine in ENGINES, "engine", engine, f"use {' or '.join(ENGINES)}")
        chosen = "distributed" if engine == "distributed" else "arrivals" if "arrivals" in given else "lags"
        tree: dict[str, Any] = {"rules": {}, chosen: {}}
        for name, value in given.items():
            check(name in OPTIONS, name, value, f"unknown option; use one of {', '.join(OPTIONS)}")
            section, key = OPTIONS[name]
            _wrong_setting(name, value, section.split(".")[0], chosen)
            section = chosen if section == "setting" else section
            target = tree if not section else tree.setdefault(section.split(".")[0], {})
            if section == "arrivals.local":
                target = target.setdefault("local", {})
            target[key] = value
        return cls.from_dict(tree)

    @classmethod
    def from_dict(cls, tree: dict[str, Any]) -> SimulateConfig:
        """A config from its tree (``to_dict``'s, or a TOML/JSON file's); lists become tuples.

        Raises:
            UsageError: an unknown key, two settings, or a bad value (naming it).
        """
        tree = _tuples(dict(tree))
        for section in ("rules", *SETTINGS):
            check(section not in tree or isinstance(tree[section], dict), section, tree.get(section),
                  f"must be a table [{section}] of its keys (a TOML table, a JSON object)")
        settings = [name for name in SETTINGS if name in tree]
        if len(settings) > 1:
            tables = " and ".join(f"[{s}]" for s in settings)
            raise UsageError(f"has {tables}: give one setting table, [lags], [arrivals] or [distributed]",
                             field="config")
        common = {f.name for f in dataclasses.fields(cls)} - {"rules", "setting"}
        for key in tree:
            check(key in common or key == "rules" or key in SETTINGS, key, tree[key],
                  f"unknown key; use {', '.join(sorted(common))}, [rules] or one of [lags], [arrivals], "
                  "[distributed]")
        kind = SETTINGS[settings[0]] if settings else LagsSetting
        name = settings[0] if settings else "lags"
        setting = _build(kind, tree.get(name, {}), name)
        rules = _build(RuleOptions, tree.get("rules", {}), "rules")
        return cls(**{k: v for k, v in tree.items() if k in common}, rules=rules, setting=setting)

    @classmethod
    def load(cls, path: str | Path) -> SimulateConfig:
        """A config from a TOML (``.toml``) or JSON file: the tree of ``to_dict``.

        A simulate ``--json`` result is accepted too (its ``config`` block is read).

        Raises:
            UsageError: field ``config``: the file is missing, unreadable or not TOML/JSON, or a value
                in it is refused (named by its key, as ``rules.beta = "x": ...``).
        """
        p = Path(path)
        check(p.exists(), "config", str(path),
              f"cannot read it ({missing_reason(p)}); give a .toml or .json file")
        check(p.is_file(), "config", str(path),
              "is not a regular file (a folder, a pipe or a device); give a .toml or .json file")
        check(p.stat().st_size <= MAX_CONFIG_BYTES, "config", str(path),
              f"is {p.stat().st_size:,} bytes; a config (or a JSON result) is at most {MAX_CONFIG_BYTES:,}")
        try:
            text = p.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            why = getattr(exc, "strerror", None) or exc
            raise UsageError(f"cannot read it ({why}); give a .toml or .json file", field="config",
                             value=str(path)) from None
        kind = "JSON" if p.suffix.lower() == ".json" else "TOML"
        try:
            tree = json.loads(text, object_pairs_hook=_unique_keys) if kind == "JSON" else tomllib.loads(text)
        except (ValueError, tomllib.TOMLDecodeError) as exc:
            raise UsageError(f"is not valid {kind}: {str(exc).splitlines()[0]}", field="config",
                             value=str(path)) from None
        except RecursionError:
            raise UsageError(f"is {kind} nested too deeply to be a config", field="config",
                             value=str(path)) from None
        check(isinstance(tree, dict), "config", str(path), "must hold a table (TOML) or an object (JSON)")
        check(_depth(tree) <= MAX_CONFIG_DEPTH, "config", str(path),
              f"is nested deeper than {MAX_CONFIG_DEPTH} levels; a config is a table of tables and lists")
        try:
            tree = config_tree(tree)
        except UsageError as exc:  # the document itself: named as the file
            raise UsageError(exc.message, field="config", value=str(path)) from None
        try:
            return cls.from_dict(tree)
        except UsageError as exc:  # a key or value of the file: named as its key there, not as an option
            if exc.field is None or (exc.field == "config" and exc.value == str(path)):  # the file's own
                raise
            key = _KEY_OF_OPTION.get(exc.field, exc.field)
            given = exc.has_value and exc.value is not None  # (None: the key is missing)
            what = "" if exc.field == "config" and not given else \
                f"{key} = {json.dumps(exc.value, default=str)}: " if given else f"{key}: "
            raise UsageError(f"{what}{exc.message}", field="config", value=str(path)) from None

    def to_dict(self) -> dict[str, Any]:
        """The tree: common fields, ``rules`` and the setting's table under its name (JSON/TOML-ready)."""
        common = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                  if f.name not in ("rules", "setting")}
        return {**_lists(common), "rules": _lists(dataclasses.asdict(self.rules)),
                self.setting.NAME: _lists(dataclasses.asdict(self.setting))}

    def to_options(self) -> dict[str, Any]:
        """The options that rebuild this config with ``from_options`` (the setting's own only)."""
        out: dict[str, Any] = {"engine": self.engine}
        for name, (section, key) in OPTIONS.items():
            if name == "strategies" and self.strategies == DEFAULT_STRATEGIES[self.setting.NAME]:
                out[name] = None  # the setting's default: another setting has its own
                continue
            part = section.split(".")[0]
            if part in ("", "rules"):
                out[name] = getattr(self if not part else self.rules, key)
            elif part == self.setting.NAME or (part == "setting" and self.setting.NAME != "lags"):
                holder = self.setting.local if section == "arrivals.local" else self.setting
                out[name] = getattr(holder, key)
        return out

    def with_options(self, **changes: Any) -> SimulateConfig:
        """A copy with some options changed (None: not given), checked again.

        The setting stays unless ``changes`` choose another (``_chosen_by``: ``engine`` distributed,
        ``arrivals``, ``lags``, or ``arrivals=None`` for fixed lags): then the old setting's options
        are dropped, as a command line overrides a config file. Options of two settings in
        ``changes`` are refused, as in ``from_options``. The ``window`` of the arrivals setting
        is carried into the distributed one (and back): both have one, so it is applied, not dropped.

        Example:
            >>> base = SimulateConfig.from_options(steps=4)
            >>> base.with_options(arrivals="exp:1,exp:2").setting.NAME, base.with_options(seeds=2).setting
            ('arrivals', LagsSetting(lags=(0, 10, 20, 35), warmup_theta0=False, save_grads=None, save_at=()))
        """
        options, current = self.to_options(), self.setting.NAME
        chosen = _chosen_by(changes, current)
        if chosen != current:  # the changes choose another setting: the old one's options go, but for
            # `window`, which arrivals and distributed share: it is carried over (checked there), not dropped
            shared = {chosen, current} == {"arrivals", "distributed"}
            keep = ("", "rules", "setting") if shared else ("", "rules")
            options = {n: v for n, v in options.items() if OPTIONS.get(n, ("", ""))[0] in keep}
        return SimulateConfig.from_options(**{**options, **changes})

    def dropped_by(self, changed: SimulateConfig) -> str | None:
        """A one-line note when ``changed`` (this config after ``with_options``) runs another setting
        and so dropped this one's options that are not at their default (None otherwise): a command
        line overriding a config file's setting says what of the file it leaves out.

        Example:
            >>> base = SimulateConfig.from_options(arrivals="exp:1,exp:2", bandwidth=1e5)
            >>> base.dropped_by(base.with_options(lags=(0, 3)))
            'runs fixed lags, not the arrivals setting: `arrivals`, `bandwidth` are not used'
        """
        if changed.setting.NAME == self.setting.NAME:
            return None
        mine = (self.setting.NAME, "setting")
        dropped = [n for n, v in self.to_options().items()
                   if OPTIONS.get(n, ("", ""))[0].split(".")[0] in mine and v is not None
                   and v != _field_default(self.setting, *OPTIONS[n])
                   and not (n == "window" and changed.setting.NAME != "lags")]  # window: carried over
        if not dropped:
            return None
        names = ", ".join(f"`{n}`" for n in dropped)
        return (f"runs {_SETTING_NAMES[changed.setting.NAME]}, not {_SETTING_NAMES[self.setting.NAME]}: "
                f"{names} {'is' if len(dropped) == 1 else 'are'} not used")

    def with_set(self, assignments: Sequence[str], **options: Any) -> SimulateConfig:
        """``with_options(**options)`` and ``KEY=VALUE`` assignments (the CLI's ``--set``), checked once.

        KEY is a dotted path of the config file's tree (``to_dict``): a common key
        (``data_bytes``), ``rules.<key>``, or ``<setting>.<key>`` (``arrivals.local.<key>`` for
        local updates); ``-`` may stand for ``_``. VALUE is read as a TOML value (``5``,
        ``1e-3``, ``true``, ``[1, 2]``, ``"text"``), else taken as text; a list key also takes a
        comma list (``1,1,2,4``) and a switch its KEY alone (``true``). So ``--set K=V`` is the
        line ``K = V`` of a ``--config`` file. The assignments and ``options`` are applied
        together, then checked: one may mend what another alone would break.

        Args:
            assignments: the ``KEY=VALUE`` texts.
            **options: option names (``OPTIONS``; None: not given), as ``with_options``.

        Raises:
            UsageError: field ``set``: no ``=``, an unknown key, a table, a key set twice or also
                given in ``options``, a key of another setting than the run's; else the check of
                the option it sets (naming that option).

        Example:
            >>> cfg = SimulateConfig.from_options(lags=(0, 5), steps=4, seeds=1, strategies=("dc-asgd",))
            >>> new = cfg.with_set(["rules.dc-lambda=5", "sketch_seed=7", "lags.warmup_theta0"], steps=3)
            >>> new.rules.dc_lambda, new.sketch_seed, new.setting.warmup_theta0, new.steps
            (5, 7, True, 3)
        """
        given = {k for k, v in options.items() if v is not None}
        assigned: dict[str, tuple[str, tuple[str, ...]]] = {}  # option → (its text, its path)
        for text in assignments:
            path, value = _assignment(text)
            option = _OPTION_OF_PATH[path]
            check(option not in given, "set", text, f"sets what `{option}` gives too; give it once")
            check(option not in assigned, "set", text, "sets a key set before; give each key once")
            assigned[option], options[option] = (text, path), value
        try:
            cfg = self.with_options(**options)
        except UsageError as exc:  # name a value set here as it was typed
            if exc.field not in assigned:
                raise
            raise UsageError(exc.message, field="set", value=assigned[exc.field][0]) from None
        for text, path in assigned.values():
            if path[0] in SETTINGS and path[0] != cfg.setting.NAME:
                raise UsageError(f"is a key of {_SETTING_NAMES[path[0]]}, and this run is "
                                 f"{_SETTING_NAMES[cfg.setting.NAME]}; choose that setting with "
                                 f"{_CHOSEN_BY[path[0]]}", field="set", value=text)
        return cfg

    # -- what the engines read -----------------------------------------------------------------

    @property
    def workers(self) -> int:
        """K, the number of workers (lags, the arrivals list, or nproc − 1)."""
        return self.setting.workers

    @property
    def window(self) -> int:
        """B, gradients per update with arrivals (1 with fixed lags)."""
        return self.setting.window

    @property
    def engine(self) -> str:
        """``distributed`` (real processes) or ``simulated`` (this process)."""
        return self.setting.ENGINE

    @property
    def asynchronous(self) -> bool:
        """True when staleness emerges from worker speeds (arrivals, distributed)."""
        return self.setting.asynchronous

    @property
    def beta(self) -> float | str:
        """The Gibbs inverse temperature of the naig rules (``rules.beta``)."""
        return self.rules.beta

    @property
    def workload(self) -> WorkloadConfig:
        """What the ``Workload`` of this simulation is built from."""
        return WorkloadConfig(model=self.model, data=self.data, data_bytes=self.data_bytes,
                              batch_size=self.batch_size, device=self.device, sketch_seed=self.sketch_seed,
                              eval_batches=self.eval_batches, test_split=self.tuning)

    @property
    def run_rules(self) -> RunRules:
        """What an engine is handed besides the workload and the setting (``naig.simulate.runs``)."""
        return RunRules(self.steps, self.optimizer, self.fault_list, self.strategy_options())

    @property
    def fault_list(self) -> tuple[Fault, ...]:
        """The parsed ``faults``."""
        return parse_faults(self.faults)

    @property
    def resolved_reference(self) -> str:
        """The naig reference actually used: ``ema`` for single arrivals (B = 1), else ``batch``."""
        if self.rules.reference != "auto":
            return self.rules.reference
        return "ema" if self.asynchronous and self.window == 1 else "batch"

    @property
    def tuning(self) -> bool:
        """True with several learning rates: chosen on validation, reported on a test split."""
        return len(self.lr) > 1

    @property
    def total_steps(self) -> int:
        """Server steps over all seeds, strategies and learning rates (for progress bars)."""
        return self.steps * self.seeds * len(self.strategies) * len(self.lr)

    def strategy_options(self, sketch: TorchSketch | None = None, lr: float | None = None) -> StrategyOptions:
        """The options every strategy of a run gets (``lr``: the run's; default the first)."""
        r = self.rules
        return StrategyOptions(r.beta, r.dc_lambda, self.line, sketch, lr=self.lr[0] if lr is None else lr,
                               optimizer=self.optimizer, mode="arrivals" if self.asynchronous else "lockstep",
                               window=self.window, workers=self.workers, max_staleness=r.max_staleness,
                               byzantine=r.byzantine, clip=r.clip,
                               reference=None if r.reference == "auto" else r.reference)

    def warnings(self) -> tuple[str, ...]:
        """Every one-line warning known before training: ``strategy_warnings`` (rules that run
        degraded here), then ``ignored_options`` (options set that nothing listed uses). The CLI
        prints them before the first step, and ``SimulateResult.warnings`` starts with them.

        Raises:
            UsageError: field ``strategies`` for a rule not defined in this setting or batch size.
        """
        return (*self.strategy_warnings(), *self.ignored_options())

    def strategy_warnings(self) -> tuple[str, ...]:
        """One-line warnings of the strategies that run degraded here (e.g. krum with small K).

        Raises:
            UsageError: field ``strategies`` for a rule not defined in this setting or batch size.
        """
        options = self.strategy_options()
        rules = [n for n in self.strategies if n in STRATEGIES]  # local-update methods are not rules
        return tuple(w for name in rules for w in STRATEGIES[name].check(options))

    def ignored_options(self) -> tuple[str, ...]:
        """One-line notes for rule options set to a non-default value that no listed rule uses."""
        names, notes, r = set(self.strategies), [], self.rules
        uses = [("max_staleness", r.max_staleness is not None, {"drop-stale"}),
                ("clip", r.clip != "auto", {"centered-clip"}),
                ("byzantine", r.byzantine != 1, {"trimmed-mean", "krum", "multi-krum"}),
                ("reference", r.reference != "auto", {"naig", "naig-exact", "naig-blind"}),
                ("dc_lambda", r.dc_lambda != 20.0, {"dc-asgd"}),
                ("beta", r.beta != "auto", GIBBS_RULES),
                ("line", tuple(self.line) != DEFAULT_LINE, GIBBS_RULES),  # Ψ_ℓ of the energy E
                ("sketch_seed", self.sketch_seed != 0, {"naig", "diloco-naig"})]  # the sketched E only
        for name, given, rules in uses:
            if given and not names & rules:
                notes.append(f"`{name}` has no effect: no rule of {', '.join(sorted(rules))} is listed")
        notes += self._ignored_by_their_own_rounds(names)
        late = [str(f) for f in self.fault_list if f.start >= self.steps]
        if late:
            notes.append(f"`faults` {', '.join(late)} start(s) after the last step ({self.steps - 1})")
        return (*notes, *self.setting.notes(self.steps))

    def earlier_logs(self) -> tuple[str, ...]:
        """A one-line warning (or none) naming the finished per-run logs (``NAME.csv``) already in
        ``log_dir`` that this experiment's runs write again, each replaced when its run ends. It reads
        the folder now (one read of its entries): ask before training, not after (the runs' own logs
        are there then); the CLI says it first, on stderr and in the JSON's ``warnings``."""
        if self.log_dir is None or not Path(self.log_dir).is_dir():
            return ()
        with os.scandir(self.log_dir) as entries:
            found = sorted(e.name for e in entries if e.is_file() and not e.name.endswith(".partial.csv")
                           and self._is_log_name(e.name))
        if not found:
            return ()
        more = f" and {len(found) - 2} more" if len(found) > 2 else ""
        return (f"`log_dir` holds {len(found)} finished log(s) of these runs from an earlier run "
                f"({', '.join(found[:2])}{more}): each is replaced when its run ends",)

    def _ignored_by_their_own_rounds(self, names: set[str]) -> list[str]:
        """Notes for ``window``, ``mode`` and ``optimizer`` when every listed method keeps its own rounds:
        sync waits for all K, the local-update methods (``LOCAL_METHODS``) for their inner steps and
        step their own inner and outer optimizers, so no B-arrival window, protocol or server
        optimizer reaches them (measured: identical results with and without)."""
        notes, listed = [], ", ".join(sorted(names))
        if self.asynchronous and not names - {"sync", *LOCAL_METHODS}:
            if self.window != 1:
                notes.append(f"`window` has no effect: {listed} run their own rounds (sync waits for all "
                             "K; local-update methods for their inner steps)")
            if getattr(self.setting, "mode", "blocking") != "blocking":
                notes.append(f"`mode` has no effect: {listed} run their own rounds")
        default = next(f.default for f in dataclasses.fields(self) if f.name == "optimizer")
        if self.optimizer != default and not names & set(STRATEGIES):
            notes.append(f"`optimizer` has no effect: {listed} step their own inner and outer optimizers")
        return notes

    # -- checks of what joins the parts --------------------------------------------------------

    def _check_numbers(self) -> None:
        check(self.optimizer in OPTIMIZERS, "optimizer", self.optimizer, f"use {' or '.join(OPTIMIZERS)}")
        check(is_int(self.steps) and 0 < self.steps <= MAX_STEPS, "steps", self.steps,
              f"use a positive int up to {MAX_STEPS:,}, e.g. 100 (the default)")
        check(is_int(self.seeds) and 0 < self.seeds <= MAX_SEEDS, "seeds", self.seeds,
              f"use a positive int up to {MAX_SEEDS:,}, e.g. 3")
        check(len(self.lr) > 0
              and all(is_number(v) and v > 0 and math.isfinite(v) for v in self.lr),
              "lr", self.lr, "use finite values > 0, e.g. 1e-3 or 3e-4,1e-3,3e-3")
        check(len(set(self.lr)) == len(self.lr), "lr", self.lr, "lists a learning rate twice")
        shown = [f"{v:g}" for v in self.lr]  # runs, their lines and their logs are named by it
        check(len(set(shown)) == len(shown), "lr", self.lr, "lists learning rates that look alike to 6 "
              f"significant digits ({', '.join(sorted({n for n in shown if shown.count(n) > 1}))}), the "
              "precision runs and their logs are named with; give values that differ there")
        check(is_int(self.batch_size) and self.batch_size > 0, "batch_size", self.batch_size,
              "use a positive int, e.g. 8")
        check(is_int(self.eval_every) and self.eval_every >= 0, "eval_every", self.eval_every,
              "use an int >= 0 (0: validate only at the end)")
        check(is_int(self.eval_batches) and self.eval_batches > 0, "eval_batches", self.eval_batches,
              "use a positive int, e.g. 16")
        check(is_int(self.data_bytes) and self.data_bytes > 0, "data_bytes", self.data_bytes,
              "use a positive int, e.g. 2000000")
        check(self.data is None or isinstance(self.data, str) and self.data.strip() != "", "data", self.data,
              "use a file path (leave the option out for the default corpus)")
        check(self.log_dir is None or isinstance(self.log_dir, str), "log_dir", self.log_dir,
              "use a folder path")

    def _check_strategies(self) -> None:
        check(len(self.strategies) > 0, "strategies", self.strategies, "is empty; use e.g. naig,hogwild")
        for name in self.strategies:
            check(name in STRATEGIES or name in LOCAL_METHODS, "strategies", name,
                  f"unknown strategy; use a comma list of {', '.join((*STRATEGIES, *LOCAL_METHODS))}")
        dupes = sorted({n for n in self.strategies if self.strategies.count(n) > 1})
        check(not dupes, "strategies", self.strategies,
              f"{', '.join(dupes)} listed more than once; name each "
              "strategy once")

    def _check_log_names(self) -> None:
        """No run's log (``NAME.csv`` or ``NAME.partial.csv`` in ``log_dir``) is a folder or another
        non-file: found before training, not when the run writes it (a file is replaced). Reads the
        folder's entries once (not one look-up per run: there may be millions of runs)."""
        folder = Path(self.log_dir)
        if not folder.is_dir():
            return
        with os.scandir(folder) as entries:
            blocked = [e.name for e in entries if not e.is_file()]
        for name in blocked:
            check(not self._is_log_name(name.replace(".partial.csv", ".csv")), "log_dir", self.log_dir,
                  f"{name} there is not a file (a folder?), and a run writes its log under that name; "
                  "remove it or pass another folder")

    def _is_log_name(self, name: str) -> bool:
        """Whether ``name`` is ``log_name`` of one of this experiment's runs."""
        for rule in self.strategies:
            for lr in self.lr:
                head = f"{rule}-seed"
                tail = log_name(rule, 0, lr).removeprefix(f"{head}0")  # "-lr0.001.csv"
                seed = name[len(head):-len(tail)] if name.startswith(head) and name.endswith(tail) else ""
                if seed.isdigit() and int(seed) < self.seeds and log_name(rule, int(seed), lr) == name:
                    return True
        return False

    def _check_setting(self) -> None:
        """The setting runs the listed rules (each setting says which) and saves no file over another."""
        self.setting.check_rules(self.strategies, self.steps)
        self.setting.check_outputs(self.strategies, self.seeds, self.lr)

    def _check_faults(self) -> None:
        """Every fault names a worker and a kind that every engine of this experiment applies."""
        faults = parse_faults(self.faults)
        if self.engine == "distributed":
            check_faults(faults, self.workers, frozenset(FAULT_KINDS), "the distributed engine")
            return
        check_faults(faults, self.workers, GRADIENT_FAULTS, "the simulated engines")
        gossip = [n for n in self.strategies if n in _GOSSIP]
        check(not (faults and gossip), "faults", self.faults[0] if faults else None,
              f"{' and '.join(gossip)} {'have' if len(gossip) > 1 else 'has'} no server to receive a faulty "
              "message; drop them or the faults")


_GOSSIP = ("gasloc", "gossip-adam")  # the decentralised methods: no server, so no faults
_RENAMED = {"gasloc": "gossip-adam"}  # results before schema 4: what their names mean now


def config_tree(doc: dict[str, Any]) -> dict[str, Any]:
    """The config tree of a document: itself, or the ``config`` block of a simulate JSON result.

    A result of ``schema_version`` 3 or lower ran naig's asynchronous gossip under the name
    ``gasloc``; its block names it ``gossip-adam`` (its name since schema 4), so the run it
    describes is the run it reproduces. A config file has no version: ``gasloc`` there is
    the paper's method (docs/design.md §13).
    """
    if "schema_version" not in doc:
        return doc
    if "runs" not in doc:  # a JSON result, but not simulate's (staleness's has a `config` block too)
        others = sorted(set(doc) - {"schema_version", "warnings", "environment", "config"})[:3]
        keys = f" (its keys: {', '.join(others)})" if others else ""
        raise UsageError(f"is another command's JSON result{keys}, not a simulate result; give a "
                         "simulate result or a .toml/.json config", field="config")
    if not isinstance(doc.get("config"), dict):
        raise UsageError("is a simulate result without its 'config' block; give the whole result or a "
                         ".toml/.json config", field="config")
    tree, version = doc["config"], doc["schema_version"]
    if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= SCHEMA_VERSION:
        raise UsageError(f"is a simulate result of schema_version {version!r}; this naig reads 1 to "
                         f"{SCHEMA_VERSION}: upgrade naig, or save its 'config' block alone as a .json "
                         "config", field="config")
    names = tree.get("strategies")
    if isinstance(version, int) and version <= 3 and isinstance(names, list | tuple):
        tree = {**tree, "strategies": [_RENAMED.get(n, n) for n in names]}
    return tree


def _field_default(setting: Setting, section: str, key: str) -> Any:
    """The default of a setting's field (its ``local`` block's for ``arrivals.local``); a
    sentinel that equals nothing where the field has none."""
    holder = setting.local if section == "arrivals.local" else setting
    if holder is None:
        return object()
    f = {f.name: f for f in dataclasses.fields(holder)}.get(key)
    if f is None or f.default is dataclasses.MISSING:
        return object() if f is None or f.default_factory is dataclasses.MISSING else f.default_factory()
    return f.default


def _chosen_by(changes: dict[str, Any], current: str) -> str:
    """The setting ``changes`` choose over ``current``: ``engine`` distributed, then ``arrivals``, then
    ``lags`` (or ``arrivals=None``, or ``engine`` simulated leaving the distributed setting)."""
    if changes.get("engine") == "distributed":
        return "distributed"
    if changes.get("arrivals") is not None:
        return "arrivals"
    leaving = changes.get("engine") == "simulated" and current == "distributed"
    if changes.get("lags") is not None or ("arrivals" in changes and current == "arrivals") or leaving:
        return "lags"
    return current


def _wrong_setting(name: str, value: object, section: str, chosen: str) -> None:
    """One line for an option of another setting than the chosen one (the one table of such errors)."""
    if section in ("", "rules") or section == chosen:
        return
    if section == "setting":
        if chosen == "lags":
            raise UsageError("needs `arrivals` or `engine` distributed; fixed lags have no window",
                             field=name, value=value)
        return
    if section == "lags":
        why = {"arrivals": "staleness emerges from worker speeds",
               "distributed": "staleness emerges from the processes' speeds"}[chosen]
        raise UsageError(f"belongs to fixed lags, and {_CHOSEN_BY[chosen]} chose {_SETTING_NAMES[chosen]} "
                         f"({why}); drop one of them", field=name, value=value)
    if section == "arrivals" and chosen == "distributed":
        why = (" (real processes measure their own speeds; skew them with `slowdown`)" if name == "arrivals"
               else "")
        raise UsageError(f"is not available with `engine` distributed{why}", field=name, value=value)
    need = {"arrivals": "`arrivals` (worker compute times, e.g. exp:1,exp:2)",
            "distributed": "`engine` distributed"}[section]
    raise UsageError(f"needs {need}", field=name, value=value)


def _options(docs: tuple[Doc, ...]) -> dict[str, tuple[str, str]]:
    """Option name → (section, key); an option two settings share (``window``) → ``("setting", key)``."""
    out: dict[str, tuple[str, str]] = {}
    for d in docs:
        place = (d.section, d.path[-1])
        out[d.name] = ("setting", d.path[-1]) if out.get(d.name, place) != place else place
    return out


OPTIONS: dict[str, tuple[str, str]] = _options(DOCS)
"""Option name (``from_options``) → (section of the tree, field); ``setting``: the chosen setting's."""
_OPTION_OF_PATH = {d.path: d.name for d in DOCS}
_KEY_OF_OPTION = {d.name: d.key for d in DOCS}  # option → its dotted key in the tree (``rules.beta``)
SET_KEYS: tuple[str, ...] = tuple(d.key for d in DOCS)
"""Every key of the config tree, dotted (``rules.dc_lambda``): what ``with_set`` takes."""
_SWITCHES = {d.name for d in DOCS if d.switch}  # bool keys: KEY alone sets them
_LISTS = {d.name for d in DOCS if d.listed}


def _assignment(text: str) -> tuple[tuple[str, ...], Any]:
    """The key path and value of one ``KEY=VALUE`` (``with_set``), the key checked against the tree."""
    key, eq, raw = text.partition("=")
    path = tuple(part.strip().replace("-", "_") for part in key.split("."))
    check(all(path), "set", text, "use KEY=VALUE with a key of the config file, e.g. rules.dc_lambda=5")
    if path not in _OPTION_OF_PATH:
        below = sorted({p[len(path)] for p in _OPTION_OF_PATH if p[:len(path)] == path})
        if below:
            raise UsageError(f"is a table; set one of its keys ({', '.join(below)}), e.g. "
                             f"{'.'.join(path)}.{below[0]}=...", field="set", value=text)
        known = next(i for i in range(len(path), -1, -1) if any(p[:i] == path[:i] for p in _OPTION_OF_PATH))
        where = ".".join(path[:known]) or "the config"
        keys = sorted({p[known] for p in _OPTION_OF_PATH if p[:known] == path[:known] and len(p) > known})
        what = (f"has no key {path[known]}; its keys are {', '.join(keys)}" if keys
                else "is a value, not a table")
        raise UsageError(f"{where} {what} (docs/simulate.md, Config keys)", field="set", value=text)
    option = _OPTION_OF_PATH[path]
    if not eq:
        check(option in _SWITCHES, "set", text, "has no value; use KEY=VALUE (KEY alone is for a switch)")
        return path, True
    value = _set_value(raw.strip(), option in _LISTS)
    return path, [value] if option in _LISTS and not isinstance(value, list) else value


def _set_value(raw: str, listed: bool) -> Any:
    """A ``--set`` value: TOML, else text; for a list key (``listed``) also a comma list of them."""
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        pass
    if listed and "," in raw:
        return [_set_value(part.strip(), False) for part in raw.split(",")]
    return raw


def _build(kind: type, values: dict[str, Any], where: str) -> Any:
    """``kind(**values)``, refusing keys it does not have (naming the table and the key)."""
    known = {f.name for f in dataclasses.fields(kind)}
    for key in values:
        if key not in known:
            raise UsageError(f"is not a key of [{where}]; use {', '.join(sorted(known))}", field=key,
                             value=values[key])
    if where == "arrivals" and isinstance(values.get("local"), dict):
        values = {**values, "local": _build(LocalUpdates, values["local"], "arrivals.local")}
    return kind(**values)


MAX_CONFIG_DEPTH = 8  # tables and lists inside a config: [arrivals.local] and a list are 3


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object, refusing a key given twice (json keeps the last silently; TOML refuses it)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"the key {key!r} is given twice")
        out[key] = value
    return out


def _depth(tree: Any, limit: int = MAX_CONFIG_DEPTH + 1) -> int:
    """How deep ``tree`` nests dicts and lists (counted up to ``limit``: no recursion beyond it)."""
    if limit <= 0 or not isinstance(tree, dict | list | tuple):
        return 0
    items = tree.values() if isinstance(tree, dict) else tree
    return 1 + max((_depth(v, limit - 1) for v in items), default=0)


def _tuples(tree: Any) -> Any:
    """Lists (from JSON or TOML) as tuples, recursively."""
    if isinstance(tree, dict):
        return {k: _tuples(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return tuple(_tuples(v) for v in tree)
    return tree


def _lists(tree: Any) -> Any:
    """Tuples as lists, recursively (a JSON/TOML-ready tree)."""
    if isinstance(tree, dict):
        return {k: _lists(v) for k, v in tree.items()}
    if isinstance(tree, tuple | list):
        return [_lists(v) for v in tree]
    return tree


_EXAMPLES = {"save_at": "50 or 50,100", "local_steps": "10 or 10,10,5,2"}


def parse_int_list(text: str, field: str) -> tuple[int, ...]:
    """Parse ``"0,10,20"`` into non-negative ints.

    Args:
        text: the comma list.
        field: the option errors name (``lags``, ``save_at``).

    Raises:
        UsageError: if the text is not a comma list of non-negative ints.

    Example:
        >>> parse_int_list("0,10,20,35", "lags")
        (0, 10, 20, 35)
    """
    try:
        values = tuple(int(p) for p in text.split(","))
    except ValueError:
        values = ()
    if not values or any(v < 0 for v in values):
        raise UsageError(f"use a comma list of non-negative ints, e.g. {_EXAMPLES.get(field, '0,10,20,35')}",
                         field=field, value=text)
    return values


def parse_float_list(text: str, field: str) -> tuple[float, ...]:
    """Parse ``"3e-4,1e-3"`` into floats (range checks are the config's).

    Raises:
        UsageError: if the text is not a comma list of numbers.

    Example:
        >>> parse_float_list("3e-4,1e-3", "lr")
        (0.0003, 0.001)
    """
    try:
        return tuple(float(p) for p in text.split(","))
    except ValueError:
        raise UsageError("use a comma list of numbers, e.g. 3e-4,1e-3,3e-3", field=field,
                         value=text) from None
