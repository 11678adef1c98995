"""``naig detect --protocol persistent``: persistent faults while training goes on, and long clean runs.

**Fault runs.** K ranks (default 4) of the small GPT of ``naig simulate`` (``gpt-nano``,
byte-level text, each rank its own minibatch stream) train synchronously (Adam) on the mean of
what the ranks send. At step ``onset`` (default 41) one rank drawn per seed turns bad and stays
bad; training continues on the *faulty* mean (a step whose mean is not finite is skipped, as a
loss scaler would), for ``horizon + 1`` steps. The clean prefix is computed once per seed and
every fault kind branches from it (θ, Adam state, minibatch streams and θ history restored).
Each step records what the monitor gathers (``naig.monitor.signals.pack``: the 14-float sketch,
‖g_k‖² and the non-finite count, with the sketch of ``Monitor()``'s layout and seed) and the
exact ⟨g_k, ḡ⟩ and ‖g_k − ḡ‖² (float64), so every method replays the same run, and what the
monitor's replica check gathers (``naig.monitor.replicas``): the same payload of the weights each
rank computes its gradient at (θ for a clean rank; θ + offset, or θ of 20 steps before, for a bad
one).

**Fault kinds** (``FAULTS``), each persistent from the onset on the bad rank; the gradient
faults are named in naig's one vocabulary (``naig.faults``, as ``naig simulate --faults``):
``scale:2``, ``scale:0.5``, ``scale:0`` (its gradient scaled); ``repeat`` (it reuses its onset
batch at every step); ``perturb`` (its weights perturbed once by 1%, θ_r = θ + 0.01·θ⊙z,
z ~ N(0, I): the same updates are applied to every replica afterwards, so the offset persists);
``reinit`` (its weights replaced once by another initialisation, the offset persisting
likewise); ``stale`` (its weights lag 20 steps: θ_{t−20}); ``data-random`` and ``data-text``
(all its sequences random bytes, or the training text read backwards); ``signflip:1`` (−g);
``nan:1`` and ``inf:1`` (one entry of its gradient, every step); ``bitflip32:30`` and
``bitflip32:26`` (bit 30 or 26 of one random float32 element flipped, every step: the top
exponent bit, and a middle one). Before the one vocabulary these were x2, x0.5, x0, signflip,
nan, inf, bit30 and bit26 (docs/results/monitor-detection.md uses those names); the runs are the
same, seed for seed.

**Clean pools** for false alarms over long runs: M ranks (``pool_ranks``, default 10) train on
their mean; each step records every rank's payload and the Gram matrix of the M gradients
(float64). A replay takes a fixed subset of K of the M ranks for a whole run (the exact
statistics of a subset follow from the Gram matrix), so one recorded run gives many clean runs
of K ranks; they share gradients, so they are not independent (an unusual gradient appears in
every subset that holds its rank): the report gives both the number of replayed clean steps and
the recorded ones behind them. The default pools: 200 steps for calibration and validation (the
choices), 2000 for the three test pools (batch 8 twice, batch 64 once; 200 until 2026-12-06):
at α = 10⁻⁴ a rate needs ~10⁵ replayed steps to be told from α/2 or 2α, and a long run reaches
what a short one does not (a full tail record, whose refits come every 128 steps).

**Methods**, run on the same records: ``monitor`` (``Monitor.decide`` on the gathered payloads,
the code path of ``Monitor.observe`` after its all-gather: the default settings, sketched
statistics), ``exact`` (the same with the exact statistics), and the baselines
(``naig.detect.baselines``): ``nan-check``, ``megatron`` (a rank's norm above 10× its running
max), ``norm-z`` (the plain cross-rank z of log ‖g_k‖, threshold calibrated on clean calibration
replays to the same family-wise false-alarm rate) and ``norm-cusum`` (a two-sided CUSUM on the
log-norm's departure from the other ranks' mean, scaled by its running spread, threshold
calibrated likewise).

**Seeds and roles.** Fault-run seeds: validation (choosing the default among ``CANDIDATES``),
then test (the reported figures). Pool seeds: calibration (the baselines' thresholds),
validation (the candidates' false alarms), test (the reported false-alarm rates).
"""

from __future__ import annotations

import copy
import dataclasses
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from naig.detect.faults import FaultCell, corrupt_batch
from naig.errors import UsageError
from naig.faults import apply_fault
from naig.monitor.signals import MonitorSketch, pack
from naig.simulate.workload import Workload, WorkloadConfig, fault_seed, make_optimizer
from naig.threads import check_threads

__all__ = ["FAULTS", "STALE", "PERTURB", "SequentialConfig", "PoolSpec", "Record", "Context",
           "fault_runs", "pool_run", "subset", "record_all", "total_steps"]

FAULTS = ("scale:2", "scale:0.5", "scale:0", "repeat", "perturb", "reinit", "stale", "data-random",
          "data-text", "signflip:1", "nan:1", "inf:1", "bitflip32:30", "bitflip32:26")
"""The persistent faults, in the order that seeds them (``_branch``: the index is part of the seed)."""
STALE, PERTURB, REINIT_SEED = 20, 0.01, 2_000_000
RECORD_FORMAT = 2  # what a cache holds (2: the replica check's payloads too); another format: refused
SEED_BASE = {"fault": 0, "pool": 500}  # seed offsets of the two kinds of runs


@dataclass(frozen=True)
class PoolSpec:
    """One recorded clean pool: M ranks at one batch size for a number of steps, in one role."""

    batch: int
    role: str
    seed: int
    steps: int


@dataclass(frozen=True)
class SequentialConfig:
    """Everything that determines a persistent-fault run (defaults: the run of docs/results).

    Raises:
        UsageError: naming the bad field (on construction).
    """

    ranks: int = 4
    batch_size: int = 8
    context: int = 64
    lr: float = 1e-3
    model: str = "gpt-nano"
    data: str | None = None
    data_bytes: int = 1_000_000
    onset: int = 41
    horizon: int = 10
    faults: tuple[str, ...] = FAULTS
    validation: int = 3
    test: int = 10
    false_alarm: float = 1e-3
    pool_ranks: int = 10
    pools: tuple[PoolSpec, ...] = field(default_factory=lambda: (
        PoolSpec(8, "calibration", 0, 200), PoolSpec(8, "validation", 1, 200), PoolSpec(8, "test", 2, 2000),
        PoolSpec(8, "test", 3, 2000), PoolSpec(64, "validation", 5, 200), PoolSpec(64, "test", 4, 2000)))
    fa_ranks: tuple[int, ...] = (3, 4, 8)  # K of the false-alarm table, with ``ranks`` added
    fa_rates: tuple[float, ...] = (1e-3, 1e-4)  # its α, with ``false_alarm`` added (descending)
    replays: int = 40
    threads: int = 1

    def __post_init__(self) -> None:
        ints = {"ranks": 3, "batch_size": 1, "context": 2, "data_bytes": 1, "onset": 2, "horizon": 0,
                "validation": 0, "test": 1, "pool_ranks": 3, "replays": 1}
        for name, low in ints.items():
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise UsageError(f"must be an int >= {low}", field=name, value=v)
        check_threads(self.threads)
        faults = tuple(self.faults)
        bad = [f for f in faults if f not in FAULTS]
        if not faults or bad:
            raise UsageError(f"use a comma list of {', '.join(FAULTS)}", field="faults",
                             value=",".join(faults))
        twice = sorted({f for f in faults if faults.count(f) > 1})
        if twice:
            raise UsageError(f"{', '.join(twice)} listed more than once; name each fault kind once",
                             field="faults", value=",".join(faults))
        object.__setattr__(self, "faults", faults)
        if "stale" in faults and self.onset <= STALE:
            raise UsageError(f"must be > {STALE} with the stale fault (its weights lag {STALE} steps)",
                             field="onset", value=self.onset)
        fa = self.false_alarm
        if isinstance(fa, bool) or not isinstance(fa, int | float) or not 0 < fa < 0.5:
            raise UsageError("must be a rate in (0, 0.5)", field="false_alarm", value=fa)
        if self.ranks > self.pool_ranks:  # its false alarms are replayed from the clean pools' ranks
            raise UsageError(f"must be at most {self.pool_ranks}: the false alarms at K are replayed from "
                             f"clean runs of {self.pool_ranks} ranks", field="ranks", value=self.ranks)
        if max(self.fa_ranks) > self.pool_ranks or min(self.fa_ranks) < 3:
            raise UsageError(f"false-alarm ranks must be in [3, pool_ranks={self.pool_ranks}]",
                             field="fa_ranks", value=self.fa_ranks)
        # the false alarms are measured at the run's own K and α too (every method's row is at both)
        object.__setattr__(self, "fa_ranks", tuple(sorted({*self.fa_ranks, self.ranks})))
        object.__setattr__(self, "fa_rates", tuple(sorted({*self.fa_rates, float(fa)}, reverse=True)))
        if not any(p.role == "calibration" and p.batch == self.batch_size for p in self.pools):
            raise UsageError(f"needs a calibration pool at batch {self.batch_size} (the baselines' "
                             "thresholds)", field="pools")

    def seeds(self, role: str) -> range:
        """Fault-run seeds of a role (validation first, then test)."""
        v = self.validation
        return {"validation": range(v), "test": range(v, v + self.test)}[role]

    def to_dict(self) -> dict:
        """Plain values."""
        d = dataclasses.asdict(self)
        d["pools"] = [dataclasses.asdict(p) for p in self.pools]
        return d


@dataclass(frozen=True, eq=False)
class Record:
    """One recorded run: what the monitor gathers at each step, and the exact statistics.

    Attributes:
        payload: (T, K, 16) float64 [S g_k | ‖g_k‖² | non-finite count] per step and rank.
        weights: (T, K, 16) float64 [S θ_k | ‖θ_k‖² | non-finite count] of the weights each rank
            computed its gradient at (the replica check's payload), or None (not recorded).
        dots: (T, K) float64 exact ⟨g_k, ḡ⟩ (NaN where not finite).
        sq_dists: (T, K) float64 exact ‖g_k − ḡ‖².
        bad: the faulty rank (−1 for a clean run).
        onset: the first faulty step, 1-based (0 for a clean run).
        kind: the fault kind ("" for a clean run).
        seed: the run seed.
        skipped: steps whose mean was not finite (no update applied).
    """

    payload: np.ndarray
    dots: np.ndarray
    sq_dists: np.ndarray
    bad: int = -1
    onset: int = 0
    kind: str = ""
    seed: int = 0
    skipped: int = 0
    weights: np.ndarray | None = None


class Context:
    """The workload (text, model layout) and the monitor's sketch, shared by every run."""

    def __init__(self, cfg: SequentialConfig, batch: int | None = None) -> None:
        self.cfg = cfg
        self.batch = cfg.batch_size if batch is None else batch
        self.wl = Workload(WorkloadConfig(model=cfg.model, data=cfg.data, data_bytes=cfg.data_bytes,
                                          batch_size=self.batch, eval_batches=1))
        # float32 gradients and their float64 copy per rank, the stale θ history, θ, Adam and a snapshot
        ranks = max(cfg.ranks, cfg.pool_ranks)
        self.wl.check_memory(3 * ranks + STALE + 8, "ranks" if cfg.ranks >= cfg.pool_ranks else "pool_ranks",
                             ranks)
        self.sketch = MonitorSketch.build(list(zip(self.wl.names, self.wl.sizes, strict=True)), 0, 1)

    def grad(self, theta: Tensor, x: Tensor, y: Tensor) -> Tensor:
        """∇L(θ; x, y) (n,) float32."""
        flat = theta.detach().clone().requires_grad_(True)
        (g,) = torch.autograd.grad(self.wl.loss(flat, x, y), flat)
        return g

    def batch_of(self, stream: torch.Generator) -> tuple[Tensor, Tensor]:
        return self.wl.data.batch("train", self.batch, self.cfg.context, stream)


def _stats(grads: Tensor, sketch: MonitorSketch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Payloads (K, 16) and the exact dots and squared distances (K,) of one step's gradients."""
    payload = torch.stack([pack(g, sketch) for g in grads]).numpy()
    g = grads.double()
    mean = g.mean(0)
    with np.errstate(invalid="ignore", over="ignore"):
        dots = (g @ mean).numpy()
        sqd = ((g - mean) ** 2).sum(1).numpy()
    return payload, dots, sqd


@dataclass
class _State:
    """What a fault run branches from: θ, the optimizer, the streams and the θ history."""

    theta: torch.nn.Parameter
    opt: torch.optim.Optimizer
    streams: list[torch.Generator]
    past: deque[Tensor]
    rows: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]

    def snapshot(self) -> dict:
        return {"theta": self.theta.detach().clone(), "opt": copy.deepcopy(self.opt.state_dict()),
                "streams": [s.get_state() for s in self.streams], "past": list(self.past),
                "rows": list(self.rows)}

    def restore(self, snap: dict) -> None:
        with torch.no_grad():
            self.theta.copy_(snap["theta"])
        self.opt.load_state_dict(copy.deepcopy(snap["opt"]))
        for s, st in zip(self.streams, snap["streams"], strict=True):
            s.set_state(st)
        self.past = deque(snap["past"], maxlen=self.past.maxlen)
        self.rows = list(snap["rows"])


def _step(state: _State, grads: Tensor) -> int:
    """One Adam step on the mean of ``grads`` (K, n); returns 1 when it was skipped (not finite)."""
    mean = grads.mean(0)
    if not bool(torch.isfinite(mean).all()):
        return 1
    state.theta.grad = mean
    state.opt.step()
    return 0


def fault_runs(ctx: Context, seed: int, advance: Callable[[int], None] | None = None) -> list[Record]:
    """One seed: the clean prefix, then every fault kind of the config from the onset on (see the module)."""
    cfg, wl, k = ctx.cfg, ctx.wl, ctx.cfg.ranks
    theta = torch.nn.Parameter(wl.init_params(seed))
    state = _State(theta, make_optimizer("adam", [theta], cfg.lr), wl.worker_streams(seed, k),
                   deque(maxlen=STALE + 1), [])
    bad = int(np.random.default_rng(fault_seed(seed)).integers(k))
    skipped = 0
    for _ in range(cfg.onset - 1):
        state.past.append(theta.detach().clone())
        grads = torch.stack([ctx.grad(theta, *ctx.batch_of(s)) for s in state.streams])
        state.rows.append((*_stats(grads, ctx.sketch), _replicas(theta.detach(), None, -1, k, ctx.sketch)))
        skipped += _step(state, grads)
        if advance is not None:
            advance(1)
    snap = state.snapshot()
    out = []
    for kind in cfg.faults:
        state.restore(snap)
        out.append(_branch(ctx, state, kind, bad, seed, skipped, advance))
    return out


def _branch(ctx: Context, state: _State, kind: str, bad: int, seed: int, skipped: int,
            advance: Callable[[int], None] | None) -> Record:
    cfg, wl = ctx.cfg, ctx.wl
    gen = torch.Generator().manual_seed(fault_seed(seed, bad) + FAULTS.index(kind))
    offset = None
    if kind == "perturb":
        z = torch.randn(state.theta.shape, generator=gen)
        offset = PERTURB * state.theta.detach() * z
    elif kind == "reinit":
        offset = wl.init_params(REINIT_SEED + seed) - state.theta.detach()
    repeat = None
    for _ in range(cfg.horizon + 1):
        state.past.append(state.theta.detach().clone())
        theta = state.theta.detach()
        grads = []
        at = _bad_weights(kind, theta, offset, state)
        for r, stream in enumerate(state.streams):
            x, y = ctx.batch_of(stream)
            if r != bad:
                grads.append(ctx.grad(theta, x, y))
                continue
            grads.append(_faulty(ctx, kind, theta, x, y, state, offset, gen, repeat))
            if kind == "repeat" and repeat is None:
                repeat = (x, y)
        g = torch.stack(grads)
        state.rows.append((*_stats(g, ctx.sketch), _replicas(theta, at, bad, len(state.streams), ctx.sketch)))
        skipped += _step(state, g)
        if advance is not None:
            advance(1)
    payload, dots, sqd, weights = (np.stack(a) for a in zip(*state.rows, strict=True))
    return Record(payload, dots, sqd, bad, cfg.onset, kind, seed, skipped, weights)


def _bad_weights(kind: str, theta: Tensor, offset: Tensor | None, state: _State) -> Tensor | None:
    """The weights the bad rank computes its gradient at, when they are not θ (None: θ)."""
    if kind in ("perturb", "reinit"):
        return theta + offset
    if kind == "stale":
        return state.past[0]
    return None


def _replicas(theta: Tensor, bad_weights: Tensor | None, bad: int, k: int, sketch: MonitorSketch
              ) -> np.ndarray:
    """(K, 16) every rank's replica-check payload: θ's, and ``bad_weights``' on rank ``bad`` when given.

    The clean ranks hold the same tensor θ (as DDP's replicas hold equal ones), so it is packed once.
    """
    rows = np.tile(pack(theta, sketch).numpy(), (k, 1))
    if bad_weights is not None:
        rows[bad] = pack(bad_weights, sketch).numpy()
    return rows


def _faulty(ctx: Context, kind: str, theta: Tensor, x: Tensor, y: Tensor, state: _State,
            offset: Tensor | None, gen: torch.Generator, repeat: tuple[Tensor, Tensor] | None) -> Tensor:
    """What the bad rank sends at this step."""
    if kind in ("perturb", "reinit", "stale"):  # stale: θ of STALE steps ago (the history holds STALE + 1)
        return ctx.grad(_bad_weights(kind, theta, offset, state), x, y)
    if kind == "repeat":
        return ctx.grad(theta, *(repeat if repeat is not None else (x, y)))
    if kind.startswith("data-"):
        return ctx.grad(theta, *corrupt_batch(FaultCell(kind, 1.0), x, y, ctx.wl.data.train, gen))
    g = ctx.grad(theta, x, y)
    name, _, arg = kind.partition(":")
    apply_fault(name, float(arg), g, gen)  # a gradient fault of naig's vocabulary (naig.faults)
    return g


def pool_run(ctx: Context, spec: PoolSpec, advance: Callable[[int], None] | None = None
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A clean pool: M ranks train on their mean for ``spec.steps`` steps.

    Returns:
        payload (T, M, 16) float64, the Gram matrices (T, M, M) float64 of the gradients and the
        replica-check payload (T, 16) float64 of θ, which every rank holds.
    """
    cfg, wl, m = ctx.cfg, ctx.wl, ctx.cfg.pool_ranks
    seed = SEED_BASE["pool"] + spec.seed
    theta = torch.nn.Parameter(wl.init_params(seed))
    state = _State(theta, make_optimizer("adam", [theta], cfg.lr), wl.worker_streams(seed, m), deque(), [])
    payloads, grams, weights = [], [], []
    for _ in range(spec.steps):
        grads = torch.stack([ctx.grad(theta, *ctx.batch_of(s)) for s in state.streams])
        payloads.append(torch.stack([pack(g, ctx.sketch) for g in grads]).numpy())
        weights.append(pack(theta.detach(), ctx.sketch).numpy())
        g = grads.double()
        grams.append((g @ g.T).numpy())
        _step(state, grads)
        if advance is not None:
            advance(1)
    return np.stack(payloads), np.stack(grams), np.stack(weights)


def subset(payload: np.ndarray, gram: np.ndarray, ranks: np.ndarray, weights: np.ndarray | None = None
           ) -> Record:
    """The clean run of the ranks ``ranks`` (K,) of a pool: their payloads and exact statistics, and
    the replica-check payloads (every rank θ's, from ``weights`` (T, 16)) when given."""
    p = payload[:, ranks]
    g = gram[:, ranks][:, :, ranks]
    dots = g.mean(axis=2)
    sqd = np.einsum("tkk->tk", g) - 2 * dots + g.mean(axis=(1, 2))[:, None]
    w = None if weights is None else np.repeat(weights[:, None, :], len(ranks), axis=1)
    return Record(p, dots, np.maximum(sqd, 0.0), weights=w)


def total_steps(cfg: SequentialConfig) -> int:
    """Training steps of a whole run (fault seeds and pools), for a progress bar."""
    per_seed = cfg.onset - 1 + len(cfg.faults) * (cfg.horizon + 1)
    return (cfg.validation + cfg.test) * per_seed + sum(p.steps for p in cfg.pools)


def record_all(cfg: SequentialConfig, advance: Callable[[int], None] | None = None, cache: str | None = None
               ) -> tuple[dict[str, list[Record]], dict[tuple, tuple[np.ndarray, np.ndarray, np.ndarray]]]:
    """Every fault run (by role) and every clean pool ((batch, role, seed) → (payload, gram, weights)).

    Args:
        cache: a directory: runs already recorded there (same config) are read, new ones written
            (``.npz``), so the evaluation can be rerun without training again.
    """
    import json
    from pathlib import Path

    ctx = Context(cfg)  # refuses a run that would not fit in memory before the cache is touched
    before = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)
    root = Path(cache) if cache is not None else None
    if root is not None:
        root.mkdir(parents=True, exist_ok=True)
        meta = root / "config.json"
        doc = json.dumps({**cfg.to_dict(), "record_format": RECORD_FORMAT}, sort_keys=True)
        if meta.exists() and meta.read_text() != doc:
            raise UsageError(f"{root} holds the runs of another configuration; use an empty directory",
                             field="cache")
        meta.write_text(doc)
    try:
        faults: dict[str, list[Record]] = {"validation": [], "test": []}
        for role in ("validation", "test"):
            for seed in cfg.seeds(role):
                make = lambda s=seed: fault_runs(ctx, s, advance)  # noqa: E731
                faults[role] += _cached(root, f"fault-{seed}", make, cfg)
        pools = {}
        for spec in cfg.pools:
            pctx = ctx if spec.batch == cfg.batch_size else Context(cfg, spec.batch)
            make_pool = lambda sp=spec, c=pctx: pool_run(c, sp, advance)  # noqa: E731
            pools[(spec.batch, spec.role, spec.seed)] = _cached_pool(root, spec, make_pool, advance)
        return faults, pools
    finally:
        torch.set_num_threads(before)


def _cached(root: object, name: str, make: Callable[[], list[Record]], cfg: SequentialConfig) -> list[Record]:
    path = None if root is None else root / f"{name}.npz"
    if path is not None and path.exists():
        z = np.load(path)
        return [Record(z[f"{i}_payload"], z[f"{i}_dots"], z[f"{i}_sq_dists"], int(z[f"{i}_bad"]),
                       int(z[f"{i}_onset"]), str(z[f"{i}_kind"]), int(z[f"{i}_seed"]), int(z[f"{i}_skipped"]),
                       z[f"{i}_weights"])
                for i in range(len(cfg.faults))]
    out = make()
    if path is not None:
        arrays = {}
        for i, r in enumerate(out):
            arrays.update({f"{i}_payload": r.payload, f"{i}_dots": r.dots, f"{i}_sq_dists": r.sq_dists,
                           f"{i}_bad": r.bad, f"{i}_onset": r.onset, f"{i}_kind": r.kind, f"{i}_seed": r.seed,
                           f"{i}_skipped": r.skipped, f"{i}_weights": r.weights})
        np.savez(path, **arrays)
    return out


def _cached_pool(root: object, spec: PoolSpec, make: Callable[[], tuple],
                 advance: Callable[[int], None] | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    path = None if root is None else root / f"pool-{spec.batch}-{spec.role}-{spec.seed}.npz"
    if path is not None and path.exists():
        z = np.load(path)
        if advance is not None:
            advance(spec.steps)
        return z["payload"], z["gram"], z["weights"]
    payload, gram, weights = make()
    if path is not None:
        np.savez(path, payload=payload, gram=gram, weights=weights)
    return payload, gram, weights
