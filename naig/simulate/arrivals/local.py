"""Local updates and gossip on the simulated clock: DiLoCo, GASLoC, local SGD, all-reduce.

See docs/design.md §13.

Every round-based method's outer step is a ``ServerState.apply`` on the batch of
pseudo-gradients (faults act on what the workers send: Δ_k, or the gradient for
``allreduce``); the decentralised methods (``gasloc``, ``gossip-adam``:
``naig.simulate.arrivals.gossip``) have no server and refuse faults.

Every worker k keeps a replica θ_k and runs inner optimizer steps on its own minibatch
stream; each inner step costs one compute-time draw of its ``arrivals`` distribution.
The pseudo-gradient of a phase is Δ_k = θ_start − θ_k (gradient-like: an outer step
θ ← θ − η Δ moves θ toward the workers). Methods (sources in docs/design.md §13):

==============  ===========================================================================
``diloco``      synchronous rounds: H_k inner AdamW steps from the global θ (inner state
                persists across rounds), Δ = mean_k Δ_k by ring all-reduce, outer SGD with
                Nesterov momentum (lr 0.7, momentum 0.9)            Douillard et al. 2023
``diloco-naig`` as ``diloco`` with Δ = Σ_k π_k Δ_k, π the Gibbs weights of the sketched
                energy of Δ_k − mean_j Δ_j (``diloco-naig-exact``: the sketch-free energy);
                naig's extension, not in the DiLoCo paper
``local-sgd``   as ``diloco`` with inner SGD and outer lr 1, no momentum: periodic averaging
                (H = 1 is synchronous SGD)                Stich 2019; Lin et al. 2020
``allreduce``   data-parallel: every step the ring all-reduce mean of K gradients at θ, one
                AdamW step (the inner optimizer of diloco, at the inner lr)
``gasloc``      decentralised, synchronous rounds: inner AdamW phases, then accelerated
                gossip of the proposals θ + ηg over a random matching (or a complete graph,
                or a ring) with momentum γ; DiLoCo on a complete graph
                                                       Cagnasso, Belilovsky, Oyallon 2026
``gossip-adam`` naig's asynchronous variant: a local outer Adam step, then pairwise averaging
==============  ===========================================================================

Per-worker H_k, the shortened last round and torch's AdamW defaults are naig's choices, not
the papers'. Budget: every method consumes the same ``steps × K`` minibatch gradients (equal
samples); a synchronous round that would overshoot is shortened in proportion to H_k.

Time: a round lasts max_k (compute of its H_k steps) plus the all-reduce; a ring all-reduce
is 2(K − 1) steps, each max_i (latency_i + (4n/K) / min(bw_i, bw_{i+1})); a gossip exchange
costs max(latency_i, latency_j) + 4n / min(bw_i, bw_j) (gasloc's rounds: ``naig.simulate.arrivals.gossip``).
Latencies are draws of ``uplink``. Bytes sent per worker: 2(K − 1)/K · 4n per all-reduce, 4n per
peer and gossip round, plus
(K − 1) · 56 for ``diloco-naig``'s all-gather of the 14-float sketches. The random streams are
``naig.arrivals.worker_stream(seed, worker, component, family=2)``: every local method of a
seed sees the same compute and latency draws.

Example:
    >>> from naig.simulate.config import SimulateConfig
    >>> from naig.simulate.workload import Workload
    >>> cfg = SimulateConfig.from_options(arrivals="const:1,const:2", local_steps=(2,), steps=4, seeds=1,
    ...                                   strategies=("diloco",), data_bytes=50_000, eval_every=0,
    ...                                   eval_batches=1)
    >>> run = LocalEngine.start(Workload(cfg), cfg.setting, cfg.run_rules, "diloco", seed=0, lr=1e-3)
    >>> run.step(); run.t, run.gradients, run.time
    (1, 4, 4.0)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch
from torch import Tensor, nn

from naig.arrivals import ArrivalModel, ring_allreduce_bytes, worker_stream
from naig.arrivals.distributions import COMPUTE, UPLINK
from naig.choices import LOCAL_METHODS
from naig.gibbs import combine, naig_weights
from naig.simulate.arrivals.engine import arrival_model
from naig.simulate.engines.base import OnServer
from naig.simulate.faults import GRADIENT_FAULTS
from naig.simulate.server import ServerState, WeightHistory
from naig.simulate.strategies import Batch, Update, make_strategy
from naig.simulate.strategies.naig import GibbsStrategy
from naig.simulate.workload import Workload, make_optimizer
from naig.sketch.core import SKETCH_DIM

if TYPE_CHECKING:
    from naig.simulate.arrivals.setting import ArrivalsSetting, LocalUpdates
    from naig.simulate.runs import RunRules

__all__ = [
    "LOCAL_METHODS",
    "LOCAL_FAMILY",
    "DILOCO_OUTER",
    "GASLOC_OUTER_LR",
    "LocalEngine",
    "LocalMethod",
    "resolve_method",
    "LocalClock",
    "LocalRun",
    "RoundRun",
    "PseudoMean",
    "PseudoGibbs",
    "outer_options",
    "pseudo_gradients",
    "round_steps",
]

_GIBBS = {"diloco-naig": "naig", "diloco-naig-exact": "naig-exact"}  # the energy each one uses

LOCAL_FAMILY = 2  # worker_stream family of local-update runs (0: arrivals, 1: synchronous rounds)
DILOCO_OUTER = (0.7, 0.9)  # diloco's outer SGD lr and Nesterov momentum (Douillard et al. 2023)
# gasloc's η (γ: DiLoCo's momentum too), so that gasloc on a complete graph is diloco with its defaults
# (the GASLoC paper's own values were not at hand: docs/design.md §13)
GASLOC_OUTER_LR = DILOCO_OUTER[0]
_SKETCH_BYTES = SKETCH_DIM * 4  # one 14-float32 sketch


@dataclass(frozen=True)
class LocalMethod:
    """What a local-update run does (shown in the run's JSON under ``local``).

    Attributes:
        name: the method's name, one of ``LOCAL_METHODS``.
        inner: ``adamw``, ``sgd`` or ``none`` (``allreduce``: workers only compute gradients).
        outer: ``sgd`` (Nesterov when ``momentum`` > 0), ``adam`` (``momentum`` is β1),
            ``adamw`` (``allreduce``: the data-parallel optimizer) or ``gossip`` (gasloc).
        outer_lr: the outer learning rate (gasloc's η).
        momentum: outer momentum (SGD), β1 (Adam) or gasloc's γ; 0 for none.
        topology: ``allreduce`` (synchronous rounds with a server), ``async-pairs``
            (gossip-adam) or gasloc's graph (one of ``TOPOLOGIES``).
        weighting: ``mean`` or ``gibbs`` (diloco-naig: reference = the mean pseudo-gradient).
        gossip_step: gasloc's α (None: 1/(d_max + 1) of each round's graph).
        form: gasloc's ``mixed`` or ``summarised`` momentum (None for the other methods).
    """

    name: str
    inner: str
    outer: str
    outer_lr: float
    momentum: float
    topology: str = "allreduce"
    weighting: str = "mean"
    gossip_step: float | None = None
    form: str | None = None


def resolve_method(name: str, local: LocalUpdates, lr: float) -> LocalMethod:
    """The method of a local strategy with its outer defaults (docs/design.md §13) and the overrides.

    Args:
        name: a name in ``LOCAL_METHODS``.
        local: the arrivals setting's local block: ``outer_lr`` / ``outer_momentum`` override diloco,
            diloco-naig, gasloc and gossip-adam
            (local-sgd is outer lr 1 without momentum by definition; allreduce has no outer step);
            ``topology``, ``gossip_step`` and ``form`` are gasloc's.
        lr: the inner learning rate (gossip-adam's default outer lr).

    Example:
        >>> from naig.simulate.config import SimulateConfig
        >>> cfg = SimulateConfig.from_options(arrivals="exp:1", strategies=("diloco",))
        >>> m = resolve_method("diloco", cfg.setting.local, 3e-3)
        >>> m.inner, m.outer, m.outer_lr, m.momentum
        ('adamw', 'sgd', 0.7, 0.9)
    """
    mom = DILOCO_OUTER[1] if local.outer_momentum is None else local.outer_momentum
    if name == "gasloc":
        return LocalMethod(name, "adamw", "gossip", local.outer_lr or GASLOC_OUTER_LR, mom,
                           topology=local.topology or "one-peer", gossip_step=local.gossip_step,
                           form=local.form or "mixed")
    if name == "gossip-adam":
        return LocalMethod(name, "adamw", "adam", local.outer_lr or lr, mom, topology="async-pairs")
    if name == "local-sgd":
        return LocalMethod(name, "sgd", "sgd", 1.0, 0.0)
    if name == "allreduce":
        return LocalMethod(name, "none", "adamw", lr, 0.0)
    weighting = "gibbs" if name in _GIBBS else "mean"
    return LocalMethod(name, "adamw", "sgd", local.outer_lr or DILOCO_OUTER[0], mom, weighting=weighting)


class PseudoMean:
    """The mean of the pseudo-gradients: π_k = 1/B (float64), Δ = Σ π_k Δ_k (``naig.gibbs.combine``)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def combine(self, batch: Batch) -> Update:
        """Uniform weights; see ``Strategy.combine``."""
        b = batch.grads.shape[0]
        pi = torch.full((b,), 1.0 / b, dtype=torch.float64)
        return Update(combine(pi, batch.grads), pi)


class PseudoGibbs:
    """diloco-naig: Gibbs weights of the energies of Δ_k − mean_j Δ_j (``naig.gibbs.naig_weights``);
    the mean is over the finite Δ_j (all of them when none is).

    Args:
        name: ``diloco-naig`` (energy of the sketch) or ``diloco-naig-exact`` (sketch-free).
        energy: the gradient rule whose ``embed`` and ``energy_of`` define the energy.
        beta: the Gibbs inverse temperature (a float ≥ 0 or ``"auto"``).
    """

    def __init__(self, name: str, energy: GibbsStrategy, beta: float | str) -> None:
        self.name, self.energy, self.beta = name, energy, beta

    def combine(self, batch: Batch) -> Update:
        """π = Gibbs(E) against the mean pseudo-gradient (uniform when no E is finite)."""
        rows = batch.grads  # (B, n)
        b = rows.shape[0]
        finite = torch.isfinite(rows).all(1)  # a NaN row cannot pull the reference
        mean = rows[finite].mean(0, keepdim=True) if bool(finite.any()) and not bool(finite.all()) else \
            rows.mean(0, keepdim=True)
        stacked = torch.cat([rows, mean])  # reference: the last row
        points = self.energy.embed(stacked)
        e = self.energy.energy_of(points[:b] - points[b]).detach().cpu().numpy().astype(np.float64)
        pi = torch.from_numpy(naig_weights(e, self.beta))
        return Update(combine(pi, rows), pi)


def _pseudo_rule(workload: Workload, rules: RunRules, method: LocalMethod,
                 lr: float) -> PseudoMean | PseudoGibbs:
    if method.weighting == "mean":
        return PseudoMean(method.name)
    options = rules.strategy_options(workload.sketch, lr)
    energy = make_strategy(_GIBBS[method.name], options)
    assert isinstance(energy, GibbsStrategy)
    return PseudoGibbs(method.name, energy, options.beta)


class LocalEngine:
    """Local updates and gossip on the arrival clock (the methods of ``LOCAL_METHODS``)."""

    NAME: ClassVar[str] = "local"
    FAULT_KINDS: ClassVar[frozenset[str]] = GRADIENT_FAULTS

    @staticmethod
    def start(workload: Workload, setting: ArrivalsSetting, rules: RunRules, rule: str, seed: int,
              lr: float) -> LocalRun:
        """A local-update run through a server at time 0 (a ``RoundRun``; the gossip methods are
        ``naig.simulate.arrivals.gossip``'s)."""
        method = resolve_method(rule, setting.local, lr)
        return RoundRun(workload, setting, rules, method, seed, lr, _pseudo_rule(workload, rules, method, lr))


def pseudo_gradients(theta: Tensor, replicas: Tensor) -> Tensor:
    """Δ_k = θ − θ_k: (K, n) from the start point θ (n,) and the replicas after their inner steps.

    The sign is the gradient's: an optimizer step θ ← θ − η Δ̄ moves θ toward the mean of
    the replicas (η = 1 lands on it); the opposite sign moves it away (a test checks this).

    Example:
        >>> pseudo_gradients(torch.tensor([1.0, 1.0]), torch.tensor([[0.0, 1.0], [2.0, 3.0]])).tolist()
        [[1.0, 0.0], [-1.0, -2.0]]
    """
    return theta.unsqueeze(0) - replicas


class LocalClock:
    """Compute and message times of K workers for local-update runs (seconds).

    Args:
        model: the arrival model: ``compute`` (seconds per inner step), ``uplink`` (latency
            of every message a worker sends; none: 0) and ``bandwidth`` (bytes/s; none: ∞).
        seed: the run's seed; draws come from ``worker_stream(seed, k, component, 2)``.
        n_params: n; a parameter or pseudo-gradient message is 4n bytes.

    Example:
        >>> clock = LocalClock(ArrivalModel.from_specs("const:1,const:2", bandwidth=(100.0, 50.0)), 0, 25)
        >>> clock.compute(1, 3), clock.exchange(0, 1), clock.allreduce()
        (6.0, 2.0, 2.0)
    """

    def __init__(self, model: ArrivalModel, seed: int, n_params: int) -> None:
        k = model.workers
        self.model, self.workers, self.message = model, k, 4.0 * n_params
        self._compute = [worker_stream(seed, w, COMPUTE, LOCAL_FAMILY) for w in range(k)]
        self._latency = [worker_stream(seed, w, UPLINK, LOCAL_FAMILY) for w in range(k)]
        self.bandwidth = np.asarray(model.bandwidth or (math.inf,) * k, dtype=np.float64)  # (K,) bytes/s

    def compute(self, worker: int, steps: int) -> float:
        """Seconds of ``steps`` inner steps of ``worker`` (one draw each)."""
        return float(self.model.compute[worker].sample(self._compute[worker], steps).sum()) if steps else 0.0

    def latency(self, worker: int) -> float:
        """One message latency draw of ``worker`` (0 without ``uplink``)."""
        if not self.model.uplink:
            return 0.0
        return float(self.model.uplink[worker].sample(self._latency[worker], 1)[0])

    def exchange(self, i: int, j: int) -> float:
        """Seconds of a pairwise exchange of 4n bytes each way between workers i and j."""
        slower = float(min(self.bandwidth[i], self.bandwidth[j]))
        return max(self.latency(i), self.latency(j)) + self.message / slower

    def allreduce(self) -> float:
        """Seconds of a ring all-reduce of 4n bytes: 2(K − 1) steps of 4n/K bytes per worker."""
        k = self.workers
        link = np.minimum(self.bandwidth, np.roll(self.bandwidth, -1))  # worker i sends to i + 1
        return float(sum(max(self.latency(i) + self.message / k / link[i] for i in range(k))
                         for _ in range(2 * (k - 1))))


class LocalRun:
    """What the local-update runs share: replicas, inner optimizers, data streams, clock, counters.

    Attributes:
        method: the ``LocalMethod`` (``name`` is the method's name).
        replicas: (K) ``nn.Parameter`` (n,) inner parameters of each worker.
        gradients: minibatch gradients consumed (the budget is ``steps × K``).
        t: outer steps (rounds; for gossip-adam one per worker phase).
        time: simulated seconds.
        bytes_sent: (K,) float64 bytes each worker has sent.
        busy: (K,) float64 compute seconds of each worker.
        history: π of each round (gasloc, gossip-adam: none).
        diverged_at: outer step at which a gradient or parameter became non-finite.
    """

    clocked: ClassVar[bool] = True

    def __init__(self, workload: Workload, setting: ArrivalsSetting, rules: RunRules, method: LocalMethod,
                 seed: int, lr: float) -> None:
        k = setting.workers
        self.workload, self.method, self.name, self.seed, self.lr = workload, method, method.name, seed, lr
        theta0 = workload.init_params(seed)
        self.steps_per_phase = (1,) * k if method.inner == "none" else setting.inner_steps()
        self.replicas = [nn.Parameter(theta0.clone()) for _ in range(k)]
        self.inner = [None if method.inner == "none" else make_optimizer(method.inner, [p], lr)
                      for p in self.replicas]
        self.gens = workload.worker_streams(seed, k)
        self.grads = theta0.new_empty(k, theta0.numel())
        self.losses = torch.full((k,), math.nan, device=workload.device)
        self.clock = LocalClock(arrival_model(workload, setting), seed, workload.n_params)
        self.budget = rules.steps * k
        self.history = WeightHistory(k)
        self.bytes_sent, self.busy = np.zeros(k), np.zeros(k)
        self.gradients = self.t = 0
        self.time = 0.0
        self.diverged_at: int | None = None
        self.saved: list[str] = []

    @property
    def progress(self) -> int:
        """Step-equivalents done: gradients // K."""
        return self.gradients // len(self.replicas)

    @property
    def updates_per_step(self) -> int:
        """One curve point per step-equivalent."""
        return 1

    @property
    def samples(self) -> int:
        """Sequences consumed: gradients × ``batch_size``."""
        return self.gradients * self.workload.config.batch_size

    @property
    def train_loss(self) -> float:
        """Mean over workers of their last minibatch loss."""
        return float(torch.nanmean(self.losses))

    def communication(self) -> tuple[int, np.ndarray]:
        """Sequences consumed and the bytes each worker sent (its own messages)."""
        return self.samples, self.bytes_sent.copy()

    def result_fields(self) -> dict[str, Any]:
        """The method (``local``): inner and outer optimizers, H, outer steps, busy fractions."""
        return {"local": self.describe()}

    def inner_phase(self, w: int, start: Tensor, steps: int) -> float | None:
        """Worker ``w`` runs ``steps`` inner steps from ``start`` (n,).

        With ``inner == "none"`` it only writes the gradient at ``start`` into ``grads[w]``.

        Returns:
            The compute seconds of the phase, or None when a gradient was non-finite
            (``diverged_at`` is then set).
        """
        p = self.replicas[w]
        with torch.no_grad():
            p.copy_(start)
        for _ in range(steps):
            self.losses[w] = self.workload.worker_grad(p.detach(), self.gens[w], self.grads[w])
            if not bool(torch.isfinite(self.grads[w].sum())):
                self.diverged_at = self.t
                return None
            if self.inner[w] is not None:
                p.grad = self.grads[w]
                self.inner[w].step()
        seconds = self.clock.compute(w, steps)
        self.busy[w] += seconds
        return seconds

    def describe(self) -> dict[str, Any]:
        """The method, H per worker, outer steps, and each worker's busy fraction (for the JSON)."""
        m = self.method
        busy = (self.busy / self.time).tolist() if self.time > 0 else [math.nan] * len(self.busy)
        return {"inner": m.inner, "outer": m.outer + ("-nesterov" if m.outer == "sgd" and m.momentum else ""),
                "outer_lr": m.outer_lr, "outer_momentum": m.momentum, "topology": m.topology,
                "weighting": m.weighting, "local_steps": list(self.steps_per_phase), "outer_steps": self.t,
                "busy_fraction": busy,
                "reference": "mean pseudo-gradient" if m.weighting == "gibbs" else None}


def outer_options(m: LocalMethod) -> tuple[str, dict[str, Any]]:
    """The outer optimizer on θ: SGD (Nesterov when momentum > 0), Adam (β1 = momentum) or AdamW."""
    if m.outer == "sgd":
        return "sgd", {"momentum": m.momentum, "nesterov": m.momentum > 0}
    if m.outer == "adam":
        return "adam", {"betas": (m.momentum, 0.999)}
    return "adamw", {}


def round_steps(h: tuple[int, ...], remaining: int) -> list[int]:
    """Inner steps per worker this round: H, or H scaled down to the ``remaining`` budget
    (largest remainders first, ties to the lower worker), so the total is exactly equal."""
    total = sum(h)
    if remaining >= total:
        return list(h)
    exact = [v * remaining / total for v in h]
    steps = [math.floor(x) for x in exact]
    order = sorted(range(len(h)), key=lambda w: (-(exact[w] - steps[w]), w))
    for w in order[:remaining - sum(steps)]:
        steps[w] += 1
    return steps


class RoundRun(OnServer, LocalRun):
    """Synchronous rounds (diloco, diloco-naig, local-sgd, allreduce); ``step()`` makes one round.

    Attributes:
        state: the server of the outer step (θ, the outer optimizer, π history).
        pseudo: (K, n) the last round's pseudo-gradients as sent (allreduce: the gradients).
    """

    def __init__(self, workload: Workload, setting: ArrivalsSetting, rules: RunRules, method: LocalMethod,
                 seed: int, lr: float, rule: PseudoMean | PseudoGibbs) -> None:
        super().__init__(workload, setting, rules, method, seed, lr)
        kind, options = outer_options(method)
        self.state = ServerState(self.replicas[0].detach().clone(), rule, kind, method.outer_lr,
                                 len(self.replicas), rules.faults, workload.fault_generator(seed), **options)
        self.history = self.state.history
        self.pseudo = torch.zeros_like(self.grads)
        self.gibbs = isinstance(rule, PseudoGibbs)

    def step(self) -> None:
        """One round: inner phases, one ``ServerState.apply`` on the pseudo-gradients."""
        steps = round_steps(self.steps_per_phase, self.budget - self.gradients)
        start, compute = self.theta, [0.0]
        for w, h in enumerate(steps):
            seconds = self.inner_phase(w, start, h) if h else 0.0
            if seconds is None:
                return
            compute.append(seconds)
        active = [w for w, h in enumerate(steps) if h]
        rows = self.grads[active] if self.method.inner == "none" else pseudo_gradients(
            start, torch.stack([self.replicas[w].detach() for w in active]))
        workers = torch.tensor(active, dtype=torch.long)
        batch = Batch(rows, torch.zeros_like(workers), workers, start, start.expand(len(active), -1))
        self.state.apply(batch, step=self.t)
        self.pseudo[active] = rows
        self._communicate(max(compute))
        self.gradients += sum(steps)
        self.t += 1
        if self.state.diverged:
            self.diverged_at = self.t - 1

    def _communicate(self, compute: float) -> None:
        """Round time (slowest worker + all-reduce), bytes (all-reduce; diloco-naig: + sketch all-gather)."""
        k = len(self.replicas)
        self.bytes_sent += ring_allreduce_bytes(self.workload.n_params, k)
        if self.gibbs:
            self.bytes_sent += (k - 1) * _SKETCH_BYTES
        self.time += compute + self.clock.allreduce()

    def describe(self) -> dict[str, Any]:
        """See ``LocalRun.describe``; rounds are the outer steps."""
        return {**super().describe(), "rounds": self.t}
