"""Configuration of a simulation, validated once on construction (docs/design.md §8).

Example:
    >>> cfg = SimulateConfig(lags=(0, 5), steps=10, strategies=("naig", "hogwild"))
    >>> cfg.workers, cfg.total_steps
    (2, 60)
    >>> SimulateConfig(lags=(0, -1))
    Traceback (most recent call last):
    ...
    naig.errors.UsageError: lags=(0, -1): use non-negative ints, one per worker, e.g. 0,10,20,35
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

from naig.arrivals import ArrivalModel
from naig.errors import UsageError
from naig.gibbs import parse_beta
from naig.metric import parse_line
from naig.simulate.engines.local import LOCAL_METHODS
from naig.simulate.faults import FAULT_KINDS, GRADIENT_FAULTS, Fault, check_faults, parse_faults
from naig.simulate.model import get_preset
from naig.simulate.strategies import STRATEGIES, StrategyOptions
from naig.sketch.core import check_seed
from naig.sketch.torch_sketch import TorchSketch

__all__ = [
    "SimulateConfig",
    "DEFAULT_LAGS",
    "DEFAULT_STRATEGIES",
    "REFERENCES",
    "OPTIMIZERS",
    "DEVICES",
    "MAX_LAG",
    "MAX_STEPS",
    "parse_int_list",
    "parse_float_list",
    "resolve_device",
    "DEFAULT_LOCAL_STEPS",
]

DEFAULT_LAGS = (0, 10, 20, 35)  # the paper's Experiment B
DEFAULT_STRATEGIES = {  # naig, its content-blind ablation, an oracle (lockstep), baselines, the ideal
    "lockstep": ("naig", "naig-blind", "fresh-only", "hogwild", "staleness", "sync"),
    "arrivals": ("naig", "naig-blind", "hogwild", "staleness", "sync"),
}
REFERENCES = ("auto", "batch", "ema")
OPTIMIZERS = ("sgd", "adam")  # torch.optim.SGD / torch.optim.Adam, default settings otherwise
DEVICES = ("cpu", "cuda", "auto")
MAX_LAG = 2**31 - 1  # any lag >= steps already means "always θ_0"; beyond this: a typo
MAX_STEPS = 10**9  # server steps per run (the π history is a (steps, K) buffer)
# Local updates and gossip (docs/design.md §13): LOCAL_METHODS (naig.simulate.engines.local)
DEFAULT_LOCAL_STEPS = 10  # inner steps H per round when `local_steps` is not given


@dataclass(frozen=True)
class SimulateConfig:
    """Everything that determines a simulation (defaults: ~1 minute on 2 CPU cores).

    Every field is checked on construction (``dataclasses.replace`` checks again),
    before anything is trained or written.

    Raises:
        UsageError: naming the bad field (``UsageError.field``) and the fix.
    """

    lags: tuple[int, ...] = DEFAULT_LAGS  # τ_k of each worker, in server steps (fixed-lag mode)
    strategies: tuple[str, ...] | None = None  # rules to compare (None: DEFAULT_STRATEGIES of the mode)
    steps: int = 150  # server steps (optimizer updates) per run
    seeds: int = 3  # independent seeds 0..seeds−1 (init, data streams, val batches)
    lr: tuple[float, ...] = (1e-3,)  # learning rate (every default strategy's best of 3e-4, 1e-3, 3e-3
    #                                  on validation, 3 seeds); several: each strategy's is tuned
    optimizer: str = "adam"  # "sgd" or "adam" (torch.optim, default settings otherwise)
    beta: float | str = "auto"  # Gibbs inverse temperature for naig / naig-exact
    dc_lambda: float = 20.0  # DC-ASGD λ (measured: benchmarks/dc_lambda.py, docs/design.md §12)
    batch_size: int = 8  # sequences per worker minibatch
    eval_every: int = 50  # validation every this many steps (0: only at the end)
    eval_batches: int = 16  # validation batches (of 2 × batch_size sequences) per evaluation
    device: str = "cpu"  # "cpu", "cuda" or "auto"
    model: str = "gpt-nano"  # preset name in naig.simulate.model.PRESETS
    data: str | None = None  # text file; None = the stdlib's .py files
    data_bytes: int = 2_000_000  # use the first this many bytes of the corpus
    sketch_seed: int = 0  # seed of the sketch (docs/design.md §5)
    line: tuple[int, int, int] = (1, 2, 4)  # Fano line ℓ of Ψ_ℓ
    save_grads: str | None = None  # directory for gradient files (None: save nothing)
    save_at: tuple[int, ...] = ()  # server steps t at which to save gradients (needs save_grads)
    warmup_theta0: bool = False  # old protocol: every worker from step 0, early gradients at θ_0
    log_dir: str | None = None  # directory for one per-step CSV per run (None: no logs)
    arrivals: str | None = None  # compute-time spec(s), e.g. "exp:1,exp:2": arrival mode, K = list length
    uplink: str | None = None  # arrival mode: gradient message latency spec(s) (seconds)
    downlink: str | None = None  # arrival mode: parameter message latency spec(s) (seconds)
    mode: str = "blocking"  # arrival mode protocol: blocking, non-blocking or shared-memory
    window: int = 1  # arrival mode: B arrivals per update (1: ASGD; K: K-batch-async)
    reference: str = "auto"  # naig reference: auto, batch (least stale of the batch) or ema
    faults: tuple[str, ...] = ()  # injected faults, each W:KIND[:ARG][@STEP] (docs/design.md §12)
    byzantine: int = 1  # f: trimmed-mean trims f per side; krum scores K − f − 2 neighbours
    max_staleness: int | None = None  # drop-stale keeps τ ≤ this (None: K)
    clip: float | str = "auto"  # centered-clip radius, or "auto" (median ‖g_k − v‖)
    # Local updates and gossip (docs/design.md §13)
    local_steps: tuple[int, ...] | None = None  # inner steps H per round, one or one per worker
    #                                             (None: DEFAULT_LOCAL_STEPS for the local strategies)
    outer_lr: float | None = None  # outer learning rate (None: each local strategy's default)
    outer_momentum: float | None = None  # diloco/naig Nesterov momentum, gasloc Adam β1 (None: 0.9)
    bandwidth: tuple[float, ...] = ()  # arrival mode: link bytes/s, one or one per worker; (): infinite
    # Distributed engine (naig.distributed, docs/design.md §14)
    engine: str = "simulated"  # "simulated" (one process) or "distributed" (real processes)
    nproc: int | None = None  # distributed: processes, the server plus K = nproc − 1 workers
    slowdown: tuple[float, ...] = ()  # distributed: compute-time factor >= 1 per worker (1: full speed)
    sketch_first: bool = False  # distributed: push 14 floats; fetch the gradient when w >= 0.01
    timeout: float = 30.0  # distributed: seconds any one message may take (at most 30)

    def __post_init__(self) -> None:
        if self.strategies is None:
            mode = "arrivals" if self.arrivals is not None or self.engine == "distributed" else "lockstep"
            object.__setattr__(self, "strategies", DEFAULT_STRATEGIES[mode])
        lrs = (self.lr,) if isinstance(self.lr, int | float) else tuple(self.lr)
        object.__setattr__(self, "lr", lrs)
        object.__setattr__(self, "beta", parse_beta(self.beta))
        object.__setattr__(self, "line", parse_line(self.line))
        self._check_arrivals()
        self._check_local()  # local updates (docs/design.md §13)
        self._check_workers()
        self._check_numbers()
        check_seed(self.sketch_seed, "sketch_seed")
        get_preset(self.model)
        self._check_saving()
        self._check_faults()
        self.strategy_warnings()  # every strategy is defined in this mode and batch size
        resolve_device(self.device)

    @property
    def workers(self) -> int:
        """K, the number of workers (the length of ``lags``, or of the ``arrivals`` list)."""
        if self.engine == "distributed":  # distributed engine
            return (self.nproc or 2) - 1
        return self.arrival_model().workers if self.arrivals is not None else len(self.lags)

    def ignored_options(self) -> tuple[str, ...]:
        """One-line notes for options set to a non-default value that no listed rule uses."""
        names, notes = set(self.strategies), []
        uses = [("max_staleness", self.max_staleness is not None, {"drop-stale"}),
                ("clip", self.clip != "auto", {"centered-clip"}),
                ("byzantine", self.byzantine != 1, {"trimmed-mean", "krum", "multi-krum"}),
                ("reference", self.reference != "auto", {"naig", "naig-exact", "naig-blind"}),
                ("dc_lambda", self.dc_lambda != 20.0, {"dc-asgd"})]
        for field, given, rules in uses:
            if given and not names & rules:
                notes.append(f"`{field}` has no effect: no rule of {', '.join(sorted(rules))} is listed")
        if self.timeout != 30.0 and self.engine != "distributed":
            notes.append("`timeout` has no effect without the distributed `engine`")
        late = [str(f) for f in self.fault_list if f.start >= self.steps]
        if late:
            notes.append(f"`faults` {', '.join(late)} start(s) after the last step ({self.steps - 1})")
        return tuple(notes)

    def strategy_warnings(self) -> tuple[str, ...]:
        """One-line warnings of the strategies that run degraded here (e.g. krum with small K).

        Raises:
            UsageError: field ``strategies`` for a rule not defined in this mode or batch size.
        """
        options = self.strategy_options()
        rules = [n for n in self.strategies if n in STRATEGIES]  # local-update methods are not rules
        return tuple(w for name in rules for w in STRATEGIES[name].check(options))

    def strategy_options(self, sketch: TorchSketch | None = None, lr: float | None = None) -> StrategyOptions:
        """The options every strategy of a run gets (``lr``: the run's; default the first)."""
        mode = "arrivals" if self.asynchronous else "lockstep"
        reference = None if self.reference == "auto" else self.reference
        return StrategyOptions(self.beta, self.dc_lambda, self.line, sketch,
                               lr=self.lr[0] if lr is None else lr, optimizer=self.optimizer, mode=mode,
                               window=self.window, workers=self.workers, max_staleness=self.max_staleness,
                               byzantine=self.byzantine, clip=self.clip, reference=reference)

    @property
    def fault_list(self) -> tuple[Fault, ...]:
        """The parsed ``faults``."""
        return parse_faults(self.faults)

    @property
    def asynchronous(self) -> bool:
        """True in arrival mode: staleness emerges from worker speeds (docs/design.md §11)."""
        return self.arrivals is not None or self.engine == "distributed"  # distributed: real arrivals

    @property
    def resolved_reference(self) -> str:
        """The naig reference actually used: ``ema`` for single arrivals (B = 1), else ``batch``."""
        if self.reference != "auto":
            return self.reference
        return "ema" if self.asynchronous and self.window == 1 else "batch"

    def arrival_model(self, bytes_up: float = 0.0, bytes_down: float = 0.0) -> ArrivalModel:
        """The arrival process of arrival mode (message sizes in bytes for transfer times)."""
        # K = the list length: single specs everywhere mean one worker (docs/design.md §13)
        lists = (self.arrivals or "", self.uplink or "", self.downlink or "")
        single = self.arrivals is not None and "," not in "".join(lists) and len(self.bandwidth) <= 1
        return ArrivalModel.from_specs(self.arrivals or "const:1", workers=1 if single else None,
                                       uplink=self.uplink, downlink=self.downlink, mode=self.mode,
                                       bytes_up=bytes_up, bytes_down=bytes_down, bandwidth=self.bandwidth)

    @property
    def tuning(self) -> bool:
        """True with several learning rates: chosen on validation, reported on a test split."""
        return len(self.lr) > 1

    @property
    def total_steps(self) -> int:
        """Server steps over all seeds, strategies and learning rates (for progress bars)."""
        return self.steps * self.seeds * len(self.strategies) * len(self.lr)

    def _check_workers(self) -> None:
        _check(len(self.lags) > 0 and all(t >= 0 for t in self.lags), "lags", self.lags,
               "use non-negative ints, one per worker, e.g. 0,10,20,35")
        _check(all(t <= MAX_LAG for t in self.lags), "lags", self.lags,
               f"a lag must be at most {MAX_LAG:,}; any lag >= `steps` ({self.steps}) already "
               "means every gradient is taken at θ_0")
        _check(len(self.strategies) > 0, "strategies", self.strategies, "is empty; use e.g. naig,hogwild")
        for name in self.strategies:
            _check(name in STRATEGIES or name in LOCAL_METHODS, "strategies", name,
                   f"unknown strategy; use a comma list of {', '.join((*STRATEGIES, *LOCAL_METHODS))}")
        dupes = sorted({n for n in self.strategies if self.strategies.count(n) > 1})
        _check(not dupes, "strategies", self.strategies,
               f"{', '.join(dupes)} listed more than once; name each strategy once")

    def _check_arrivals(self) -> None:
        if self._check_distributed():  # distributed engine: its own checks
            return
        if self.arrivals is None:
            for name in ("uplink", "downlink"):
                _check(getattr(self, name) is None, name, getattr(self, name),
                       "needs `arrivals` (worker compute times, e.g. exp:1,exp:2)")
            _check(self.mode == "blocking" and self.window == 1, "mode" if self.mode != "blocking"
                   else "window", self.mode if self.mode != "blocking" else self.window,
                   "needs `arrivals`; fixed lags have no protocol or window")
            return
        _check(self.lags == DEFAULT_LAGS, "lags", self.lags,
               "excludes `arrivals`: staleness emerges from worker speeds; drop one of them")
        _check(not self.warmup_theta0, "warmup_theta0", True, "applies to fixed lags only")
        try:
            k = self.arrival_model().workers  # parses the specs
        except UsageError as exc:  # the model calls the compute times `compute`
            if exc.field not in ("compute", "workers"):
                raise
            raise UsageError(exc.message, field="arrivals", value=self.arrivals) from None
        _check(isinstance(self.window, int) and 1 <= self.window <= k, "window", self.window,
               f"use an int in 1..{k} (1: ASGD, {k}: K-batch-async)")
        _check(self.reference in REFERENCES, "reference", self.reference,
               f"use one of {', '.join(REFERENCES)}")

    # Local updates and gossip (docs/design.md §13)
    def inner_steps(self) -> tuple[int, ...]:
        """H_i of every worker (K values): ``local_steps`` spread to K, or the default 10 each."""
        h = self.local_steps or (DEFAULT_LOCAL_STEPS,)
        return h * self.workers if len(h) == 1 else h

    def _check_local(self) -> None:
        if self.local_steps is not None:
            object.__setattr__(self, "local_steps", tuple(self.local_steps))
        object.__setattr__(self, "bandwidth", tuple(self.bandwidth))
        local = [n for n in self.strategies if n in LOCAL_METHODS]
        if self.arrivals is None:
            for name, value in (("local_steps", self.local_steps), ("bandwidth", self.bandwidth or None)):
                _check(value is None, name, value, "needs `arrivals` (compute seconds per step of "
                       "each worker, e.g. exp:1,exp:1,exp:2,exp:4): it runs on the simulated clock")
            _check(not local, "strategies", ",".join(local), "runs on the simulated clock and needs "
                   "`arrivals` (compute seconds per inner step, e.g. exp:1,exp:1,exp:2,exp:4)")
        users = {"local_steps": ("diloco", "diloco-naig", "diloco-naig-exact", "gasloc", "local-sgd"),
                 "outer_lr": ("diloco", "diloco-naig", "diloco-naig-exact", "gasloc"),
                 "outer_momentum": ("diloco", "diloco-naig", "diloco-naig-exact", "gasloc")}
        for name, rules in users.items():
            _check(getattr(self, name) is None or any(n in rules for n in self.strategies), name,
                   getattr(self, name), f"applies to local-update strategies only ({', '.join(rules)}); "
                   "list one in `strategies`")
        h = self.local_steps
        ok = h is None or (len(h) in (1, self.workers) and all(isinstance(v, int) and 1 <= v <= MAX_STEPS
                                                                for v in h))
        _check(ok, "local_steps", h,
               f"use one int >= 1, or one per worker ({self.workers}), e.g. 10 or 10,10,5,2")
        lr = self.outer_lr
        _check(lr is None or (math.isfinite(lr) and lr > 0), "outer_lr", lr,
               "use a finite value > 0, e.g. 0.7")
        m = self.outer_momentum
        _check(m is None or (math.isfinite(m) and 0 <= m < 1), "outer_momentum", m,
               "use a value in [0, 1), e.g. 0.9 (0: no momentum)")
    # Distributed engine (naig.distributed, docs/design.md §14)
    def _check_distributed(self) -> bool:
        """Check the distributed engine's fields; True when the engine is distributed."""
        _check(self.engine in ("simulated", "distributed"), "engine", self.engine,
               "use simulated or distributed")
        if self.engine == "simulated":
            for name, default in (("nproc", None), ("slowdown", ()), ("sketch_first", False)):
                _check(getattr(self, name) == default, name, getattr(self, name),
                       "needs `engine` distributed")
            return False
        _check(isinstance(self.nproc, int) and self.nproc >= 2, "nproc", self.nproc,
               "use an int >= 2: the server plus at least one worker, e.g. 5")
        for name in ("arrivals", "uplink", "downlink", "save_grads", "log_dir"):
            _check(getattr(self, name) is None, name, getattr(self, name),
                   "is not available with `engine` distributed (real processes measure their own "
                   "speeds; skew them with `slowdown`)" if name == "arrivals" else
                   "is not available with `engine` distributed")
        _check(self.lags == DEFAULT_LAGS, "lags", self.lags,
               "excludes `engine` distributed: staleness emerges from the processes' speeds")
        _check(not self.warmup_theta0, "warmup_theta0", True, "applies to fixed lags only")
        _check(self.mode == "blocking", "mode", self.mode, "the parameter server is blocking; drop it")
        k = self.nproc - 1
        _check(isinstance(self.window, int) and 1 <= self.window <= k, "window", self.window,
               f"use an int in 1..{k} (1: ASGD, {k}: K-batch-async)")
        _check(self.reference in REFERENCES, "reference", self.reference,
               f"use one of {', '.join(REFERENCES)}")
        _check(len(self.slowdown) in (0, k) and all(math.isfinite(v) and v >= 1 for v in self.slowdown),
               "slowdown", self.slowdown,
               f"give {k} factors >= 1, one per worker, e.g. {','.join(['1'] * k)}")
        _check(math.isfinite(self.timeout) and 0 < self.timeout <= 30, "timeout", self.timeout,
               "use seconds in (0, 30]")
        _check(not self.sketch_first or set(self.strategies) == {"naig"}, "sketch_first", True,
               "screens gradients with naig's weights; use `strategies` naig")
        local = [n for n in self.strategies if n in LOCAL_METHODS]
        _check(not local, "strategies", ",".join(local), "local-update methods run on the simulated clock "
               "only; drop them or use `arrivals` instead of `engine` distributed")
        return True

    def _check_faults(self) -> None:
        """Every fault names a worker and a kind that every engine of this experiment applies."""
        faults = parse_faults(self.faults)
        if self.engine == "distributed":
            check_faults(faults, self.workers, frozenset(FAULT_KINDS), "the distributed engine")
            return
        check_faults(faults, self.workers, GRADIENT_FAULTS, "the simulated engines")
        _check(not (faults and "gasloc" in self.strategies), "faults", self.faults[0] if faults else None,
               "gasloc has no server to receive a faulty message; drop gasloc or the faults")

    def _check_numbers(self) -> None:
        _check(self.optimizer in OPTIMIZERS, "optimizer", self.optimizer, "use sgd or adam")
        _check(0 < self.steps <= MAX_STEPS, "steps", self.steps,
               f"use a positive int up to {MAX_STEPS:,}, e.g. 150")
        _check(self.seeds > 0, "seeds", self.seeds, "use a positive int, e.g. 3")
        _check(len(self.lr) > 0 and all(v > 0 and math.isfinite(v) for v in self.lr), "lr", self.lr,
               "use finite values > 0, e.g. 1e-3 or 3e-4,1e-3,3e-3")
        _check(len(set(self.lr)) == len(self.lr), "lr", self.lr, "lists a learning rate twice")
        _check(math.isfinite(self.dc_lambda) and self.dc_lambda >= 0, "dc_lambda", self.dc_lambda,
               "DC-ASGD's λ must be finite and >= 0, e.g. 20")
        _check(self.batch_size > 0, "batch_size", self.batch_size, "use a positive int, e.g. 8")
        _check(self.byzantine >= 0, "byzantine", self.byzantine, "use an int >= 0, e.g. 1")
        _check(self.max_staleness is None or self.max_staleness >= 0, "max_staleness", self.max_staleness,
               "use an int >= 0 (the largest staleness drop-stale keeps), e.g. 4")
        _check(self.eval_every >= 0, "eval_every", self.eval_every,
               "use an int >= 0 (0: validate only at the end)")
        _check(self.eval_batches > 0, "eval_batches", self.eval_batches, "use a positive int, e.g. 16")

    def _check_saving(self) -> None:
        if self.log_dir is not None:
            _check(not Path(self.log_dir).exists() or Path(self.log_dir).is_dir(), "log_dir", self.log_dir,
                   "is a file; name a directory (it is created if missing)")
        _check(self.save_grads is None or not self.asynchronous, "save_grads", self.save_grads,
               "saves the gradients of a fixed-lag server step; it is not available with `arrivals` "
               "or the distributed engine")
        if self.save_grads is None:
            _check(not self.save_at, "save_at", self.save_at,
                   "needs `save_grads` (the directory to write the gradient files to)")
            return
        _check(self.save_grads.strip() != "", "save_grads", self.save_grads,
               "give a directory to write gradient files to, e.g. runs/grads")
        _check(bool(self.save_at), "save_grads", self.save_grads,
               f"needs `save_at` (the server steps to save at, in 0..{self.steps - 1})")
        _check(all(0 <= s < self.steps for s in self.save_at), "save_at", self.save_at,
               f"steps must lie in 0..{self.steps - 1} (`steps` is {self.steps})")
        path = Path(self.save_grads)
        existing = next(p for p in (path, *path.parents) if p.exists() or p == p.parent)
        _check(existing.is_dir(), "save_grads", self.save_grads,
               f"{existing} is not a directory; pass a directory (it is created if missing)")
        _check(os.access(existing, os.W_OK | os.X_OK), "save_grads", self.save_grads,
               f"{existing} is not writable; pass a directory you can write to")


def _check(ok: bool, field: str, value: object, message: str) -> None:
    if not ok:
        raise UsageError(message, field=field, value=value)


_EXAMPLES = {"save_at": "50 or 50,100", "local_steps": "10 or 10,10,5,2"}


def parse_int_list(text: str, field: str) -> tuple[int, ...]:
    """Parse ``"0,10,20"`` into non-negative ints.

    Args:
        text: the comma list.
        field: the field errors name (``lags``, ``save_at``).

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
                         field=field,
                         value=text)
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


def resolve_device(device: str) -> str:
    """``cpu``, ``cuda`` or ``auto`` (cuda when available) as the device name used.

    Raises:
        UsageError: for an unknown name or ``cuda`` without a GPU.
    """
    _check(device in DEVICES, "device", device, "use cpu, cuda or auto")
    if device == "cpu":
        return device
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    _check(torch.cuda.is_available(), "device", device,
           "no CUDA GPU is available; use cpu or auto")
    return device
