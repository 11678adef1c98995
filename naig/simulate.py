"""Asynchronous training with stale workers, strategy by strategy (SPEC §3.3, Experiment B).

Protocol, for each seed and each strategy (same initialisation, same data
streams and same validation batches for every strategy of a seed):

    θ_0 = GPT-2 init (seeded);  ring buffer of the last min(max τ, steps−1)+1 versions θ_v
    for t = 0 .. steps−1:
        g_k = ∇L(θ_{max(t−τ_k, 0)}; batch from worker k's own generator)   k = 1..K
        ĝ, π = strategy.combine(g, τ, θ_t, θ_{t−τ})   (sync: every τ_k = 0)
        θ_{t+1} = optimizer.step(θ_t, ĝ)                (unchanged SGD or Adam)

Divergence: a run whose worker gradients or parameters become non-finite (NaN/Inf)
stops at that step t and is recorded as diverged (``RunResult.diverged_at = t``,
final loss NaN); the other runs go on.

Parameters live in one flat vector (n,); workers evaluate the model
functionally (``torch.func.functional_call``) at views of a stale flat vector,
so gradients land in a preallocated (K, n) buffer that the strategies and the
sketch use directly. All randomness comes from explicit ``torch.Generator``s.

Example:
    >>> cfg = SimulateConfig(steps=2, seeds=1, strategies=("hogwild",), data_bytes=50_000,
    ...                      eval_every=0, eval_batches=1)
    >>> res = run_simulation(cfg)
    >>> res.summaries[0].strategy, res.n_params > 0
    ('hogwild', True)
"""

from __future__ import annotations

import math
import os
import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.func import functional_call

from naig.data import ByteData, load_bytes
from naig.errors import UsageError, show
from naig.gibbs import effective_workers, frozen_mask, normalized_entropy, parse_beta
from naig.io import save_gradients
from naig.metric import parse_line
from naig.model import GPT, get_preset, lm_loss
from naig.sketch import SKETCH_DIM, check_seed
from naig.sketch_torch import TorchSketch
from naig.strategies import Strategy, StrategyOptions, make_strategy

__all__ = [
    "SimulateConfig",
    "RunResult",
    "StrategySummary",
    "SimulateResult",
    "parse_lags",
    "parse_int_list",
    "resolve_device",
    "run_simulation",
]

ROUTING_BYTES = SKETCH_DIM * 4  # a worker's routing signal: 14 float32 values
MAX_LAG = 2**31 - 1  # any lag >= --steps already means "always θ_0"; beyond this: a typo
MAX_STEPS = 10**9  # server steps per run (the π history is a (steps, K) buffer)


@dataclass(frozen=True)
class SimulateConfig:
    """Everything that determines a simulation (defaults: ~1 minute on 2 CPU cores)."""

    lags: tuple[int, ...] = (0, 10, 20, 35)  # τ_k of each worker, in server steps
    strategies: tuple[str, ...] = ("naig", "hogwild", "staleness", "sync")  # rules to compare
    steps: int = 150  # server steps (optimizer updates) per run
    seeds: int = 2  # independent seeds 0..seeds−1 (init, data streams, val batches)
    lr: float = 3e-3  # optimizer learning rate
    optimizer: str = "adam"  # "sgd" or "adam" (torch.optim, default settings otherwise)
    beta: float | str = "auto"  # Gibbs inverse temperature for naig / naig-exact
    dc_lambda: float = 0.04  # DC-ASGD λ
    batch_size: int = 8  # sequences per worker minibatch
    eval_every: int = 50  # validation every this many steps (0: only at the end)
    eval_batches: int = 16  # validation batches (of 2 × batch_size sequences) per evaluation
    device: str = "cpu"  # "cpu", "cuda" or "auto"
    model: str = "gpt-nano"  # preset name in naig.model.PRESETS
    data: str | None = None  # text file; None = the stdlib's .py files
    data_bytes: int = 2_000_000  # use the first this many bytes of the corpus
    sketch_seed: int = 0  # seed of the SPEC §2.5 sketch
    line: tuple[int, int, int] = (1, 2, 4)  # Fano line ℓ of Ψ_ℓ
    save_grads: str | None = None  # directory for gradient files (None: save nothing)
    save_at: tuple[int, ...] = ()  # server steps t at which to save gradients (needs save_grads)

    def validate(self) -> None:
        """Check every option before any work starts (nothing is trained or written).

        Messages name the ``naig simulate`` option; ``eval_batches``, which has no
        option, is named as the field.

        Raises:
            UsageError: naming the bad option and the fix.
        """
        lags = ",".join(map(str, self.lags))
        _check(len(self.lags) > 0 and all(t >= 0 for t in self.lags),
               f"--lags {lags}: use a comma list of non-negative ints, e.g. 0,10,20,35")
        _check(all(t <= MAX_LAG for t in self.lags),
               f"--lags {lags}: a lag must be at most {MAX_LAG:,}; any lag >= --steps "
               f"({self.steps}) already means every gradient is taken at θ_0")
        _check(len(self.strategies) > 0, "--strategies is empty; use e.g. naig,hogwild")
        for name in self.strategies:
            make_strategy(name, StrategyOptions(sketch=_DUMMY_SKETCH))  # raises if unknown
        dupes = sorted({n for n in self.strategies if self.strategies.count(n) > 1})
        _check(not dupes, f"--strategies {','.join(self.strategies)}: {', '.join(dupes)} "
               "listed more than once; name each strategy once")
        get_preset(self.model)
        parse_beta(self.beta)
        parse_line(self.line, "line")
        check_seed(self.sketch_seed, "--sketch-seed")
        _check(self.optimizer in _OPTIMIZERS, f"--optimizer {self.optimizer!r}: use sgd or adam")
        _check(0 < self.steps <= MAX_STEPS,
               f"--steps {self.steps}: use a positive int up to {MAX_STEPS:,}, e.g. --steps 150")
        _check(self.seeds > 0, f"--seeds {self.seeds}: use a positive int, e.g. --seeds 2")
        _check(self.lr > 0 and math.isfinite(self.lr), f"--lr {self.lr}: use a finite value > 0")
        _check(math.isfinite(self.dc_lambda) and self.dc_lambda >= 0,
               f"--dc-lambda {self.dc_lambda}: DC-ASGD's λ must be finite and >= 0, "
               "e.g. --dc-lambda 0.04")
        _check(self.batch_size > 0,
               f"--batch-size {self.batch_size}: use a positive int, e.g. --batch-size 8")
        _check(self.eval_every >= 0,
               f"--eval-every {self.eval_every}: use an int >= 0 (0: validate only at the end)")
        _check(self.eval_batches > 0,
               f"{show('eval_batches', self.eval_batches)}: use a positive int, e.g. 16")
        self._validate_saving()
        resolve_device(self.device)

    def _validate_saving(self) -> None:
        at = ",".join(map(str, self.save_at))
        if self.save_grads is None:
            _check(not self.save_at, f"--save-at {at} needs --save-grads DIR "
                   "(the directory to write the gradient files to)")
            return
        _check(self.save_grads.strip() != "",
               "--save-grads '': give a directory to write gradient files to, e.g. "
               "--save-grads runs/grads")
        _check(bool(self.save_at), f"--save-grads {self.save_grads} needs --save-at STEP[,STEP] "
               f"(the server steps to save at, in 0..{self.steps - 1})")
        _check(all(0 <= s < self.steps for s in self.save_at),
               f"--save-at {at}: steps must lie in 0..{self.steps - 1} (--steps {self.steps})")
        path = Path(self.save_grads)
        existing = next(p for p in (path, *path.parents) if p.exists() or p == p.parent)
        _check(existing.is_dir(), f"--save-grads {self.save_grads}: {existing} is not a "
               "directory; pass a directory (it is created if missing)")
        _check(os.access(existing, os.W_OK | os.X_OK),
               f"--save-grads {self.save_grads}: {existing} is not writable; "
               "pass a directory you can write to")

    @property
    def total_steps(self) -> int:
        """Server steps over all seeds and strategies (for progress bars)."""
        return self.steps * self.seeds * len(self.strategies)


@dataclass(frozen=True)
class RunResult:
    """One (strategy, seed) run."""

    strategy: str
    seed: int
    final_val_loss: float  # validation loss (nats/byte) after the last step; NaN if diverged
    curve: tuple[tuple[int, float], ...]  # (steps done, val loss), from (0, untrained); NaN after
    #                                       divergence
    mean_pi: tuple[float, ...]  # mean over steps of each worker's coefficient π_k
    frozen_fraction: float  # fraction of (step, worker) with normalised π_k < 0.01/K
    k_eff: float  # mean over steps of 1/Σπ̃_k² (π̃ = π normalised to sum 1)
    entropy_first: float  # mean normalised entropy of π̃ over the first 10% of steps
    entropy_last: float  # same over the last 10% of steps
    ms_per_step: float  # wall time per server step (K gradients + combine + update), ms
    diverged_at: int | None = None  # step t at which gradients/parameters became non-finite


@dataclass(frozen=True)
class StrategySummary:
    """A strategy's numbers over seeds (means; loss also with its standard deviation).

    The loss mean, std and change are NaN (None for the change) when any seed diverged:
    a mean over the surviving seeds alone would flatter the strategy. The π statistics
    and ms/step average over the steps that ran.
    """

    strategy: str
    val_loss_mean: float
    val_loss_std: float | None  # sample std over seeds; None for one seed (undefined)
    change_vs_hogwild_pct: float | None  # 100 (L − L_hogwild) / L_hogwild; None without hogwild
    mean_pi: tuple[float, ...]
    frozen_fraction: float
    k_eff: float
    entropy_first: float
    entropy_last: float
    ms_per_step: float
    curve: tuple[tuple[int, float], ...]  # validation curve, mean over seeds
    diverged_at: tuple[int | None, ...] = ()  # per seed: step of divergence, None if it ran


@dataclass(frozen=True)
class SimulateResult:
    """All runs of a simulation and their per-strategy summaries."""

    config: SimulateConfig
    device: str  # device actually used
    n_params: int  # scalar parameters n
    untrained_val_loss: float  # validation loss at θ_0, mean over seeds (≈ ln 256)
    routing_bytes: int  # per worker per step: 14 × 4
    gradient_bytes: int  # per worker per step: n × element size
    runs: tuple[RunResult, ...]
    summaries: tuple[StrategySummary, ...]
    saved_files: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of everything (config included; NaN/Inf still need → null)."""
        return asdict(self)

    @property
    def diverged(self) -> tuple[RunResult, ...]:
        """The runs that diverged (non-finite gradients or parameters)."""
        return tuple(r for r in self.runs if r.diverged_at is not None)


_OPTIMIZERS: dict[str, Callable[..., torch.optim.Optimizer]] = {
    "sgd": torch.optim.SGD,
    "adam": torch.optim.Adam,
}
_DUMMY_SKETCH = TorchSketch(torch.zeros(1, dtype=torch.long), torch.ones(1, dtype=torch.float64))


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise UsageError(message)


def parse_int_list(text: str, option: str) -> tuple[int, ...]:
    """Parse ``"0,10,20"`` into non-negative ints.

    Raises:
        UsageError: naming ``option`` if the text is not a comma list of non-negative ints.
    """
    try:
        values = tuple(int(p) for p in text.split(","))
    except ValueError:
        values = ()
    if not values or any(v < 0 for v in values):
        raise UsageError(
            f"{option} {text!r}: use a comma list of non-negative ints, e.g. 0,10,20,35")
    return values


def parse_lags(text: str) -> tuple[int, ...]:
    """Parse ``--lags`` (e.g. ``"0,10,20,35"``); raises ``UsageError`` when malformed."""
    return parse_int_list(text, "--lags")


def resolve_device(device: str) -> torch.device:
    """``cpu``, ``cuda`` or ``auto`` (cuda when available) as a ``torch.device``.

    Raises:
        UsageError: for an unknown name or ``cuda`` without a GPU.
    """
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    _check(device in ("cpu", "cuda"), f"--device {device!r}: use cpu, cuda or auto")
    _check(device == "cpu" or torch.cuda.is_available(),
           "--device cuda: no CUDA GPU is available; use --device cpu or --device auto")
    return torch.device(device)


@dataclass
class _Setup:
    """What every run of a simulation shares (built once)."""

    config: SimulateConfig
    device: torch.device
    data: ByteData
    model: GPT
    names: list[str]
    shapes: list[torch.Size]
    sizes: list[int]
    sketch: TorchSketch

    def params(self, flat: Tensor) -> dict[str, Tensor]:
        """{name: view of ``flat``} in the model's parameter shapes."""
        views = flat.split(self.sizes)
        return {n: v.view(s) for n, v, s in zip(self.names, views, self.shapes, strict=True)}

    def loss(self, flat: Tensor, x: Tensor, y: Tensor) -> Tensor:
        """Next-byte loss of the model with parameters ``flat`` on one batch."""
        return lm_loss(functional_call(self.model, self.params(flat), (x,)), y)


def _build_setup(config: SimulateConfig) -> _Setup:
    device = resolve_device(config.device)
    gcfg = get_preset(config.model)
    data = ByteData.from_bytes(load_bytes(config.data, config.data_bytes), device)
    data.check(gcfg.context)
    model = GPT(gcfg).to(device)
    named = list(model.named_parameters())
    sizes = [p.numel() for _, p in named]
    sketch = TorchSketch.build([(n, p.numel()) for n, p in named], config.sketch_seed, device)
    return _Setup(config, device, data, model, [n for n, _ in named],
                  [p.shape for _, p in named], sizes, sketch)


def _init_flat(setup: _Setup, seed: int) -> Tensor:
    """θ_0 for a seed: GPT-2 init from a CPU generator seeded with ``seed``, flattened."""
    model = GPT(setup.model.config, generator=torch.Generator().manual_seed(seed))
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).to(setup.device)


def _generator(setup: _Setup, seed: int) -> torch.Generator:
    return torch.Generator(device=setup.device).manual_seed(seed)


def _val_batches(setup: _Setup, seed: int) -> list[tuple[Tensor, Tensor]]:
    """Fixed validation batches of a seed (shared by every strategy)."""
    gen = _generator(setup, 1_000_003 * seed + 99_991)
    c = setup.config
    ctx = setup.model.config.context
    return [setup.data.batch("val", 2 * c.batch_size, ctx, gen) for _ in range(c.eval_batches)]


@torch.no_grad()
def _evaluate(setup: _Setup, flat: Tensor, batches: list[tuple[Tensor, Tensor]]) -> float:
    return float(torch.stack([setup.loss(flat, x, y) for x, y in batches]).mean())


def _worker_grad(setup: _Setup, theta: Tensor, gen: torch.Generator, out: Tensor) -> None:
    """Write ∇L(θ; next batch of this worker's stream) into ``out`` (n,)."""
    flat = theta.detach().clone().requires_grad_(True)
    x, y = setup.data.batch("train", setup.config.batch_size, setup.model.config.context, gen)
    (grad,) = torch.autograd.grad(setup.loss(flat, x, y), flat)
    out.copy_(grad)


@dataclass
class _RunState:
    """Mutable state of one run: parameters, optimizer, ring buffer, streams, buffers."""

    theta: nn.Parameter  # (n,) server parameters θ_t
    optimizer: torch.optim.Optimizer
    ring: Tensor  # (R, n), R = ring_rows(...): version v at row v mod R
    lags: Tensor  # (K,) int64 effective lags (zeros for sync)
    gens: list[torch.Generator]  # one minibatch stream per worker
    grads: Tensor  # (K, n) preallocated gradient buffer
    pis: Tensor  # (steps, K) float64 coefficients history
    diverged_at: int | None = None  # step t at which a non-finite gradient/parameter appeared
    pi_rows: int = 0  # rows of ``pis`` filled (steps whose combine ran)


def ring_rows(lags: tuple[int, ...], steps: int) -> int:
    """Parameter versions the ring buffer must hold: min(max τ, steps − 1) + 1.

    Step t reads θ_{max(t−τ_k, 0)} for t ≤ steps − 1, then writes θ_{t+1}. With R rows
    (version v at row v mod R) a version is overwritten R steps after it was written.
    For R = max τ + 1 every version read at step t lies in [t − max τ, t]: none is
    overwritten yet, and θ_0 (row 0) is overwritten at step max τ, after the last step
    that clamps to it (t < τ ≤ max τ). For max τ ≥ steps − 1, R = steps holds θ_0 ..
    θ_{steps−1} in distinct rows; only θ_steps, never read, lands on θ_0's row.
    """
    return min(max(lags), steps - 1) + 1


def _start_run(setup: _Setup, strategy: Strategy, seed: int) -> _RunState:
    c, k = setup.config, len(setup.config.lags)
    theta = nn.Parameter(_init_flat(setup, seed))
    lags = c.lags if strategy.uses_lags else (0,) * k
    ring = _allocate_ring(theta.detach(), ring_rows(c.lags, c.steps))
    ring[0] = theta.detach()
    gens = [_generator(setup, 1_000_003 * seed + 7_919 * (w + 1)) for w in range(k)]
    return _RunState(theta, _OPTIMIZERS[c.optimizer]([theta], lr=c.lr), ring,
                     torch.tensor(lags, dtype=torch.long, device=setup.device), gens,
                     theta.detach().new_empty(k, theta.numel()),
                     torch.empty(c.steps, k, dtype=torch.float64, device=setup.device))


def _allocate_ring(theta: Tensor, rows: int) -> Tensor:
    """An empty (rows, n) buffer like ``theta``; a clean UsageError if memory is short."""
    try:
        return theta.new_empty(rows, theta.numel())
    except (RuntimeError, MemoryError) as exc:  # torch's OutOfMemoryError is a RuntimeError
        gib = rows * theta.numel() * theta.element_size() / 2**30
        raise UsageError(
            f"--lags: the ring buffer of {rows:,} parameter versions needs {gib:,.1f} GiB "
            f"and cannot be allocated on {theta.device}; use smaller --lags or fewer --steps"
        ) from exc


def _finite(x: Tensor) -> bool:
    """True when every entry is finite: one reduction (a sum of finite float32 values only
    overflows past 3e38, itself a divergence)."""
    return bool(torch.isfinite(x.sum()))


def _step(setup: _Setup, strategy: Strategy, st: _RunState, t: int) -> Tensor:
    """One server step t; returns θ_{t−τ_k} (K, n) for optional saving.

    Sets ``st.diverged_at = t`` (and changes nothing more) when a worker gradient is
    non-finite, or after the update when θ_{t+1} is non-finite.
    """
    rows = t - st.lags
    stale = st.ring[rows.clamp(min=0) % st.ring.shape[0]]  # (K, n), clamped at θ_0
    for w in range(stale.shape[0]):
        _worker_grad(setup, stale[w], st.gens[w], st.grads[w])
    if not _finite(st.grads):
        st.diverged_at = t
        return stale
    g_hat, pi = strategy.combine(st.grads, st.lags, st.theta.detach(), stale)
    st.theta.grad = g_hat
    st.optimizer.step()
    st.pis[t] = pi
    st.pi_rows = t + 1
    if not _finite(st.theta.detach()):
        st.diverged_at = t
        return stale
    st.ring[(t + 1) % st.ring.shape[0]] = st.theta.detach()
    return stale


def _save(setup: _Setup, st: _RunState, strategy: str, seed: int, t: int) -> list[str]:
    """Write ref.safetensors (min-lag worker) and worker<k>.safetensors for step t."""
    folder = Path(setup.config.save_grads or ".") / f"{strategy}-seed{seed}-step{t}"
    lags = st.lags.tolist()
    ref = lags.index(min(lags))
    paths = []
    for w, name in [(ref, "ref")] + [(w, f"worker{w}") for w in range(len(lags))]:
        tensors = setup.params(st.grads[w].clone())
        meta = dict(lag=lags[w], step=t, worker=w, strategy=strategy, seed=seed)
        paths.append(str(save_gradients(folder / f"{name}.safetensors", tensors, **meta)))
    return paths


def _pi_stats(pis: np.ndarray) -> dict[str, Any]:
    """Mean π, frozen fraction, K_eff and annealing entropies of a (steps, K) history."""
    if len(pis) == 0:  # diverged at step 0: no combine ran
        nan = math.nan
        return dict(mean_pi=(nan,) * pis.shape[1], frozen_fraction=nan, k_eff=nan,
                    entropy_first=nan, entropy_last=nan)
    norm = pis / pis.sum(-1, keepdims=True)
    w = max(1, len(pis) // 10)
    ent = normalized_entropy(norm)
    return dict(mean_pi=tuple(pis.mean(0).tolist()),
                frozen_fraction=float(frozen_mask(norm).mean()),
                k_eff=float(np.mean([effective_workers(p) for p in norm])),
                entropy_first=float(ent[:w].mean()), entropy_last=float(ent[-w:].mean()))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _run_one(setup: _Setup, name: str, seed: int, val: list[tuple[Tensor, Tensor]],
             untrained: float, tick: Callable[[], None], saved: list[str]) -> RunResult:
    c = setup.config
    strategy = make_strategy(name, StrategyOptions(c.beta, c.dc_lambda, c.line, setup.sketch))
    st, curve, elapsed, t = _start_run(setup, strategy, seed), [(0, untrained)], 0.0, 0
    for t in range(c.steps):
        _sync(setup.device)
        start = time.perf_counter()
        _step(setup, strategy, st, t)
        _sync(setup.device)
        elapsed += time.perf_counter() - start
        if st.diverged_at is not None:
            break
        if t in c.save_at:
            saved += _save(setup, st, name, seed, t)
        if t + 1 == c.steps or (c.eval_every and (t + 1) % c.eval_every == 0):
            curve.append((t + 1, _evaluate(setup, st.theta.detach(), val)))
        tick()
    if st.diverged_at is not None:  # the remaining evaluation points: NaN, progress skipped
        curve += [(s, math.nan) for s in range(st.diverged_at + 1, c.steps + 1)
                  if s == c.steps or (c.eval_every and s % c.eval_every == 0)]
        for _ in range(st.diverged_at, c.steps):
            tick()
    return RunResult(name, seed, curve[-1][1], tuple(curve),
                     ms_per_step=1000 * elapsed / (t + 1), diverged_at=st.diverged_at,
                     **_pi_stats(st.pis[:st.pi_rows].cpu().numpy()))


def _nanmean(values: Any, axis: int | None = None) -> Any:
    """Mean ignoring NaN (runs that diverged before a statistic existed); NaN if none."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(np.asarray(values, dtype=np.float64), axis=axis)


def _summarise(runs: list[RunResult], name: str, hogwild: float | None) -> StrategySummary:
    mine = [r for r in runs if r.strategy == name]
    losses = [r.final_val_loss for r in mine]
    finite = all(math.isfinite(v) for v in losses)
    mean = statistics.fmean(losses) if finite else math.nan
    std = None if len(losses) < 2 else statistics.stdev(losses) if finite else math.nan

    def avg(attr: str) -> float:
        return float(_nanmean([getattr(r, attr) for r in mine]))

    curve = tuple((s, statistics.fmean(r.curve[i][1] for r in mine))
                  for i, (s, _) in enumerate(mine[0].curve))
    change = (100.0 * (mean - hogwild) / hogwild
              if hogwild is not None and math.isfinite(hogwild) and finite else None)
    return StrategySummary(
        name, mean, std, change,
        tuple(_nanmean([r.mean_pi for r in mine], axis=0).tolist()), avg("frozen_fraction"),
        avg("k_eff"), avg("entropy_first"), avg("entropy_last"), avg("ms_per_step"), curve,
        tuple(r.diverged_at for r in mine))


def _summaries(runs: list[RunResult], names: tuple[str, ...]) -> tuple[StrategySummary, ...]:
    hog = [r.final_val_loss for r in runs if r.strategy == "hogwild"]
    ref = statistics.fmean(hog) if hog else None
    return tuple(_summarise(runs, n, ref) for n in names)


def run_simulation(config: SimulateConfig,
                   progress: Callable[[], None] | None = None) -> SimulateResult:
    """Run every strategy on every seed and summarise (SPEC §3.3).

    Args:
        config: the simulation; validated first.
        progress: called once after every server step (``config.total_steps`` calls).

    Returns:
        A ``SimulateResult`` with one ``RunResult`` per (seed, strategy) and one
        ``StrategySummary`` per strategy, in ``config.strategies`` order. A run that
        diverges stops there (``RunResult.diverged_at``, NaN loss); the others continue
        and nothing is raised (``SimulateResult.diverged`` lists them).

    Raises:
        UsageError: for a bad option (see ``SimulateConfig.validate``).
        DataError: if the corpus is missing or too small.
    """
    config.validate()
    setup = _build_setup(replace(config, device=str(resolve_device(config.device))))
    runs, saved, untrained = [], [], []
    for seed in range(config.seeds):
        val = _val_batches(setup, seed)
        untrained.append(_evaluate(setup, _init_flat(setup, seed), val))
        for name in config.strategies:
            runs.append(_run_one(setup, name, seed, val, untrained[-1],
                                 progress or (lambda: None), saved))
    n = sum(setup.sizes)
    return SimulateResult(config, str(setup.device), n, statistics.fmean(untrained),
                          ROUTING_BYTES, n * 4, tuple(runs), _summaries(runs, config.strategies),
                          tuple(saved))
