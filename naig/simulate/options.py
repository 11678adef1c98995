"""The simulator's options, declared once: ``DOCS``, one ``Doc`` per field of the config tree.

A field's ``Doc`` holds its dotted key, its default, what it sets (its help), the flag that sets it
on the command line (or none: then it is set with ``--set KEY=VALUE`` or a ``--config`` file), its
library option name (``SimulateConfig.from_options``) and how its default is shown. The config
tree's dataclasses take each field from here (``steps: int = option("steps")``: the default and
the ``Doc`` as the field's metadata), and everything else is derived from these entries: the
option map ``naig.simulate.config.OPTIONS``, the ``--set`` keys and which are lists or switches,
the CLI's options (``naig_cli.simulate``: flag, help, panel, the default shown), the words errors
use for a field (its flag, or ``--set KEY``) and docs/simulate.md's Config keys table
(``scripts/gen_cli_reference.py``).

Why a table and not the help on the fields themselves: the CLI builds its options when it starts,
and ``naig_cli`` imports no torch (so ``naig spectrum`` starts fast), while the config tree's
modules do. This module imports only ``naig.choices``. A test checks that every field of the tree
is in ``DOCS`` under its own key, and that every flag here is a parameter of ``naig simulate``.

A new option: one ``Doc`` here and one field ``name: type = option("key")`` in its part of the
tree (its check in that part's ``__post_init__``); with a flag, also one parameter of ``naig
simulate``.

Example:
    >>> d = doc_of("arrivals.local.steps")
    >>> d.name, d.flag, d.section, d.where, d.shown_default
    ('local_steps', '--local-steps', 'arrivals.local', 'Local updates (with --arrivals)', '10')
    >>> [d.key for d in DOCS if d.flag is None][:3]
    ['eval_batches', 'sketch_seed', 'line']
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from naig.choices import DEFAULT_THREADS, MAX_TIMEOUT

__all__ = ["Doc", "DOCS", "PANELS", "OUTPUT", "DEFAULT_LAGS", "DEFAULT_LOCAL_STEPS", "DEFAULT_STRATEGIES",
           "option", "doc_of", "show"]

PANELS = {"": "Common", "rules": "Rules", "lags": "Fixed lags (the default setting)",
          "arrivals": "Arrivals (--arrivals)", "arrivals.local": "Local updates (with --arrivals)",
          "distributed": "Distributed (--engine distributed)"}
"""The help panel of each part of the tree (``naig simulate --help``), by its dotted section."""
OUTPUT = "Output"
"""The panel of the options that say where results go."""
DEFAULT_LAGS = (0, 10, 20, 35)  # the paper's Experiment B
DEFAULT_LOCAL_STEPS = 10  # inner steps H per round when the local block does not set them
DEFAULT_STRATEGIES = {  # naig, its content-blind ablation, an oracle (lockstep), baselines, the ideal
    "lags": ("naig", "naig-blind", "fresh-only", "hogwild", "staleness", "sync"),
    "arrivals": ("naig", "naig-blind", "hogwild", "staleness", "sync"),
    "distributed": ("naig", "naig-blind", "hogwild", "staleness", "sync"),
}


@dataclass(frozen=True)
class Doc:
    """One field of the config tree: where it is, its default, how it is set and described.

    Attributes:
        key: its dotted key path (``arrivals.local.steps``): ``--set KEY=VALUE``, a config file's line.
        help: what the field sets, its unit and its values (a sentence with a flag, a phrase without).
        default: the field's default (immutable: a number, text, a tuple or None).
        flag: the ``naig simulate`` flag that sets it (``--steps``); None: ``--set KEY=VALUE`` only.
        option: its name in ``from_options`` when that is not the field's name (``local_steps`` for
            ``arrivals.local.steps``).
        shown: the default as the help shows it, when ``default`` does not say it (None meaning
            "not given", whose effect is decided elsewhere, e.g. the setting's default strategies).
        panel: the help panel, when not its part's (``PANELS``).
        listed: it holds a list (``--set`` then takes a comma list too).
    """

    key: str
    help: str
    default: Any = None
    flag: str | None = None
    option: str | None = None
    shown: str | None = None
    panel: str | None = None
    listed: bool = False

    @property
    def path(self) -> tuple[str, ...]:
        """The key path (``("arrivals", "local", "steps")``)."""
        return tuple(self.key.split("."))

    @property
    def section(self) -> str:
        """The dotted part of the tree it sits in (``""`` for the common fields)."""
        return self.key.rpartition(".")[0]

    @property
    def name(self) -> str:
        """Its library option name (``from_options``)."""
        return self.option or self.path[-1]

    @property
    def where(self) -> str:
        """Its help panel."""
        return self.panel or PANELS[self.section]

    @property
    def shown_default(self) -> str | None:
        """The default as shown (None: nothing to show)."""
        return self.shown if self.shown is not None else show(self.default)

    @property
    def switch(self) -> bool:
        """Whether it is a bool (``--set KEY`` alone sets it)."""
        return isinstance(self.default, bool)


def show(value: Any) -> str | None:
    """A default as the help shows it: ``0,10,20,35`` for a tuple, ``20`` for 20.0, ``false``.

    Returns None for None and an empty tuple (nothing given).

    Example:
        >>> show((0, 10)), show(20.0), show(False), show(1e-3), show(None)
        ('0,10', '20', 'false', '0.001', None)
    """
    if value is None or value == ():
        return None
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple):
        return ",".join(str(show(v)) for v in value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _strategies_shown() -> str:
    lags, other = DEFAULT_STRATEGIES["lags"], DEFAULT_STRATEGIES["arrivals"]
    dropped = ", ".join(s for s in lags if s not in other)
    return f"{','.join(lags)} (without {dropped} beside --arrivals or --engine distributed)"


_WINDOW = "B arrivals per server update (1: ASGD; K: K-batch-async); also with --engine distributed."
_LAW = "latency of a {} message, seconds, a law (one, or one per worker), e.g. `const:0.1`"
DOCS: tuple[Doc, ...] = (
    # the common fields (SimulateConfig)
    Doc("strategies", "Comma list of rules: sync, hogwild, naig, naig-exact, naig-blind, fresh-only, "
        "drop-stale, staleness, staleness-lr, dc-asgd, dc-asgd-a, gap-aware, median, trimmed-mean, krum, "
        "multi-krum, centered-clip; with --arrivals also the local-update methods diloco, diloco-naig, "
        "diloco-naig-exact, gasloc, gossip-adam, local-sgd, allreduce.", None, "--strategies",
        shown=_strategies_shown(), listed=True),
    Doc("steps", "Server steps per run.", 100, "--steps"),
    Doc("seeds", "Number of seeds (0..N-1).", 3, "--seeds"),
    # 1e-3: every default strategy's best of 3e-4, 1e-3, 3e-3 on validation (3 seeds)
    Doc("lr", "Learning rate, or a comma list: each rule's is chosen on validation, reported on a test "
        "split (80/10/10).", (1e-3,), "--lr", shown="1e-3", listed=True),
    Doc("optimizer", "Server optimizer.", "adam", "--optimizer"),
    Doc("batch_size", "Sequences per worker minibatch.", 8, "--batch-size"),
    Doc("eval_every", "Validate every N steps (0: at the end).", 50, "--eval-every"),
    Doc("eval_batches", "validation batches (of 2 × batch size sequences) per evaluation", 16),
    Doc("device", "Where to train.", "cpu", "--device"),
    Doc("threads", "torch CPU threads per process (each worker's too with --engine distributed).",
        DEFAULT_THREADS, "--threads"),
    Doc("jobs", "Runs side by side, one process each (0: one per CPU core; 1 with --engine distributed or "
        "a GPU).", 0, "--jobs"),
    Doc("model", "Model preset.", "gpt-nano", "--model"),
    Doc("data", "Text file.", None, "--data", shown="the stdlib's .py files"),
    Doc("data_bytes", "Use the first N bytes of the text.", 2_000_000, "--data-bytes"),
    Doc("sketch_seed", "the sketch's seed, 0..2⁶⁴−1", 0),
    Doc("line", "the Fano line ℓ of Ψ_ℓ naig's energy uses, three indices of 1..7", (1, 2, 4)),
    Doc("log_dir", "Write one per-step CSV per run into DIR (simulated engines).", None, "--log-dir",
        panel=OUTPUT),
    Doc("faults", "Inject a fault, `W:KIND[:ARG][@STEP]`, once per fault: signflip:A (-A·g), scale:A, "
        "noise:S, zero, nan[:C], random, coordflip:F, inf[:C], bitflip32:B, bitflip16:B (naig.faults); "
        "kill and hang with --engine distributed; e.g. 1:signflip:10 or 0:nan@50.", (), "--faults",
        listed=True),
    # the rules' options (RuleOptions)
    Doc("rules.beta", "Gibbs inverse temperature β of naig: 'auto' or a float >= 0.", "auto", "--beta"),
    Doc("rules.dc_lambda", "dc-asgd's λ", 20.0),
    Doc("rules.byzantine", "f: trimmed-mean trims f per side; krum scores K − f − 2 neighbours", 1),
    Doc("rules.max_staleness", "drop-stale keeps staleness at most this", None, shown="K"),
    Doc("rules.clip", "centered-clip's radius, or `auto` (the median distance)", "auto"),
    Doc("rules.reference", "naig's reference: `auto` (ema at window 1 with arrivals, else the least stale), "
        "`batch`, `ema`", "auto"),
    # fixed lags (LagsSetting)
    Doc("lags.lags", "Worker lags τ_k: comma list of ints >= 0.", DEFAULT_LAGS, "--lags", listed=True),
    Doc("lags.warmup_theta0", "the first fixed-lag protocol: lagged workers start at step 0 with θ₀", False),
    Doc("lags.save_grads", "Directory for gradient files (needs --save-at; one --lr; a run's "
        "RULE-seedK-stepT folder must be new or empty).", None, "--save-grads"),
    Doc("lags.save_at", "Steps to save at, e.g. 50 or 50,100 (needs --save-grads).", (), "--save-at",
        listed=True),
    # arrivals (ArrivalsSetting) and its local updates (LocalUpdates)
    Doc("arrivals.compute", "Worker compute times in seconds, one per worker (exp:MEAN, const:MEAN, "
        "shifted-exp:MEAN:SHIFT, gamma:MEAN:SHAPE, lognormal:MEAN:SIGMA), e.g. exp:1,exp:1,exp:2,exp:4.",
        "exp:1,exp:1,exp:2,exp:4", "--arrivals", option="arrivals", shown=""),
    Doc("arrivals.uplink", _LAW.format("gradient"), None, shown="none"),
    Doc("arrivals.downlink", _LAW.format("parameter"), None, shown="none"),
    Doc("arrivals.mode", "blocking: wait for fresh parameters; non-blocking: compute back to back; "
        "shared-memory: blocking without messages.", "blocking", "--mode"),
    Doc("arrivals.window", _WINDOW, 1, "--window"),
    Doc("arrivals.bandwidth", "link bytes/s, one or one per worker: a message costs latency + bytes / "
        "bandwidth", (), shown="infinite", listed=True),
    Doc("arrivals.local.steps", "Inner steps H per round, one or one per worker, e.g. 10 or 10,10,5,2.",
        None, "--local-steps", option="local_steps", shown=str(DEFAULT_LOCAL_STEPS), listed=True),
    Doc("arrivals.local.outer_lr", "outer lr: diloco's SGD, gasloc's η (0.7), gossip-adam's Adam (`--lr`)",
        None, shown="per method"),
    Doc("arrivals.local.outer_momentum", "outer Nesterov momentum of diloco, gasloc's γ, gossip-adam's β1",
        None, shown="0.9"),
    Doc("arrivals.local.topology", "gasloc's graph: `one-peer`, `two-peer`, `complete`, `ring`", None,
        shown="one-peer"),
    Doc("arrivals.local.gossip_step", "gasloc's α in W = I − αΛ, at most 1/(largest degree)", None,
        shown="1/(d + 1)"),
    Doc("arrivals.local.form", "gasloc's momentum on the `mixed` iterates or the `summarised` proposals",
        None, option="gasloc_form", shown="mixed"),
    # real processes (DistributedSetting)
    Doc("distributed.nproc", "Processes, the server plus K workers.", None, "--nproc",
        shown="under torchrun: its world size"),
    Doc("distributed.window", _WINDOW, 1, "--window"),
    Doc("distributed.slowdown", "compute-time factor ≥ 1 per worker, e.g. `1,1,2,4`", (), shown="none",
        listed=True),
    Doc("distributed.sketch_first", "naig: workers push the sketch; the server fetches the gradient only "
        "when w ≥ 0.01", False),
    Doc("distributed.timeout", "seconds any one message may take (≤ 30); a worker silent longer is lost",
        MAX_TIMEOUT),
)
"""Every field of the config tree, in tree order: the one place each is declared."""
_BY_KEY = {d.key: d for d in DOCS}


def doc_of(key: str) -> Doc:
    """The ``Doc`` of a dotted key (``KeyError`` for a key not in ``DOCS``)."""
    return _BY_KEY[key]


def option(key: str) -> Any:
    """The dataclass field of ``key``: its default from ``DOCS``, its ``Doc`` as ``metadata["doc"]``."""
    doc = _BY_KEY[key]
    return dataclasses.field(default=doc.default, metadata={"doc": doc})
