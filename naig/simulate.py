"""Asynchronous training with stale workers, strategy by strategy (SPEC §3.3, Experiment B).

Protocol, for each seed and each strategy (same initialisation, same data
streams and same validation batches for every strategy of a seed):

    θ_0 = GPT-2 init (seeded);  ring buffer of the last max(τ)+1 versions θ_v
    for t = 0 .. steps−1:
        g_k = ∇L(θ_{max(t−τ_k, 0)}; batch from worker k's own generator)   k = 1..K
        ĝ, π = strategy.combine(g, τ, θ_t, θ_{t−τ})   (sync: every τ_k = 0)
        θ_{t+1} = optimizer.step(θ_t, ĝ)                (unchanged SGD or Adam)

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
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.func import functional_call

from naig.data import ByteData, load_bytes
from naig.errors import UsageError
from naig.gibbs import effective_workers, frozen_mask, normalized_entropy, parse_beta
from naig.io import save_gradients
from naig.model import GPT, get_preset, lm_loss
from naig.sketch import SKETCH_DIM
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
    save_at: tuple[int, ...] = ()  # server steps t at which to save gradients

    def validate(self) -> None:
        """Check every option before any work starts.

        Raises:
            UsageError: naming the bad option and the fix.
        """
        _check(len(self.lags) > 0 and all(t >= 0 for t in self.lags),
               f"--lags {self.lags}: use a comma list of non-negative ints, e.g. 0,10,20,35")
        _check(len(self.strategies) > 0, "--strategies is empty; use e.g. naig,hogwild")
        for name in self.strategies:
            make_strategy(name, StrategyOptions(sketch=_DUMMY_SKETCH))  # raises if unknown
        get_preset(self.model)
        parse_beta(self.beta)
        _check(self.optimizer in _OPTIMIZERS, f"--optimizer {self.optimizer!r}: use sgd or adam")
        _check(self.steps > 0 and self.seeds > 0, "--steps and --seeds must be positive")
        _check(self.lr > 0 and math.isfinite(self.lr), f"--lr {self.lr}: use a finite value > 0")
        _check(self.batch_size > 0 and self.eval_batches > 0 and self.eval_every >= 0,
               "--batch-size and --eval-batches must be positive, --eval-every >= 0")
        _check(all(0 <= s < self.steps for s in self.save_at),
               f"--save-at {self.save_at}: steps must lie in 0..{self.steps - 1}")
        _check(not self.save_at or self.save_grads is not None,
               "--save-at needs --save-grads DIR")
        resolve_device(self.device)

    @property
    def total_steps(self) -> int:
        """Server steps over all seeds and strategies (for progress bars)."""
        return self.steps * self.seeds * len(self.strategies)


@dataclass(frozen=True)
class RunResult:
    """One (strategy, seed) run."""

    strategy: str
    seed: int
    final_val_loss: float  # validation loss (nats/byte) after the last step
    curve: tuple[tuple[int, float], ...]  # (steps done, val loss), from (0, untrained)
    mean_pi: tuple[float, ...]  # mean over steps of each worker's coefficient π_k
    frozen_fraction: float  # fraction of (step, worker) with normalised π_k < 0.01/K
    k_eff: float  # mean over steps of 1/Σπ̃_k² (π̃ = π normalised to sum 1)
    entropy_first: float  # mean normalised entropy of π̃ over the first 10% of steps
    entropy_last: float  # same over the last 10% of steps
    ms_per_step: float  # wall time per server step (K gradients + combine + update), ms


@dataclass(frozen=True)
class StrategySummary:
    """A strategy's numbers over seeds (means; loss also with its standard deviation)."""

    strategy: str
    val_loss_mean: float
    val_loss_std: float  # sample std over seeds (0 for one seed)
    change_vs_hogwild_pct: float | None  # 100 (L − L_hogwild) / L_hogwild; None without hogwild
    mean_pi: tuple[float, ...]
    frozen_fraction: float
    k_eff: float
    entropy_first: float
    entropy_last: float
    ms_per_step: float
    curve: tuple[tuple[int, float], ...]  # validation curve, mean over seeds


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
        """A JSON-ready dict of everything (config included)."""
        return asdict(self)


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
    ring: Tensor  # (max τ + 1, n): version v at row v mod (max τ + 1)
    lags: Tensor  # (K,) int64 effective lags (zeros for sync)
    gens: list[torch.Generator]  # one minibatch stream per worker
    grads: Tensor  # (K, n) preallocated gradient buffer
    pis: Tensor  # (steps, K) float64 coefficients history


def _start_run(setup: _Setup, strategy: Strategy, seed: int) -> _RunState:
    c, k = setup.config, len(setup.config.lags)
    theta = nn.Parameter(_init_flat(setup, seed))
    lags = c.lags if strategy.uses_lags else (0,) * k
    ring = theta.detach().new_empty(max(c.lags) + 1, theta.numel())
    ring[0] = theta.detach()
    gens = [_generator(setup, 1_000_003 * seed + 7_919 * (w + 1)) for w in range(k)]
    return _RunState(theta, _OPTIMIZERS[c.optimizer]([theta], lr=c.lr), ring,
                     torch.tensor(lags, dtype=torch.long, device=setup.device), gens,
                     theta.detach().new_empty(k, theta.numel()),
                     torch.empty(c.steps, k, dtype=torch.float64, device=setup.device))


def _step(setup: _Setup, strategy: Strategy, st: _RunState, t: int) -> Tensor:
    """One server step t; returns θ_{t−τ_k} (K, n) for optional saving."""
    rows = t - st.lags
    stale = st.ring[rows.clamp(min=0) % st.ring.shape[0]]  # (K, n), clamped at θ_0
    for w in range(stale.shape[0]):
        _worker_grad(setup, stale[w], st.gens[w], st.grads[w])
    g_hat, pi = strategy.combine(st.grads, st.lags, st.theta.detach(), stale)
    st.theta.grad = g_hat
    st.optimizer.step()
    st.ring[(t + 1) % st.ring.shape[0]] = st.theta.detach()
    st.pis[t] = pi
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
    st, curve, elapsed = _start_run(setup, strategy, seed), [(0, untrained)], 0.0
    for t in range(c.steps):
        _sync(setup.device)
        start = time.perf_counter()
        _step(setup, strategy, st, t)
        _sync(setup.device)
        elapsed += time.perf_counter() - start
        if t in c.save_at:
            saved += _save(setup, st, name, seed, t)
        if t + 1 == c.steps or (c.eval_every and (t + 1) % c.eval_every == 0):
            curve.append((t + 1, _evaluate(setup, st.theta.detach(), val)))
        tick()
    return RunResult(name, seed, curve[-1][1], tuple(curve),
                     ms_per_step=1000 * elapsed / c.steps, **_pi_stats(st.pis.cpu().numpy()))


def _summarise(runs: list[RunResult], name: str, hogwild: float | None) -> StrategySummary:
    mine = [r for r in runs if r.strategy == name]
    losses = [r.final_val_loss for r in mine]
    mean = statistics.fmean(losses)

    def avg(attr: str) -> float:
        return statistics.fmean(getattr(r, attr) for r in mine)

    curve = tuple((s, statistics.fmean(r.curve[i][1] for r in mine))
                  for i, (s, _) in enumerate(mine[0].curve))
    return StrategySummary(
        name, mean, statistics.stdev(losses) if len(losses) > 1 else 0.0,
        None if hogwild is None else 100.0 * (mean - hogwild) / hogwild,
        tuple(np.mean([r.mean_pi for r in mine], axis=0).tolist()), avg("frozen_fraction"),
        avg("k_eff"), avg("entropy_first"), avg("entropy_last"), avg("ms_per_step"), curve)


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
        ``StrategySummary`` per strategy, in ``config.strategies`` order.

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
