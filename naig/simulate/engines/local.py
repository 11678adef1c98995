"""Local updates and gossip on the simulated clock: DiLoCo, GASLoC, local SGD, all-reduce.

See docs/design.md §13.

Every round-based method's outer step is a ``ServerState.apply`` on the batch of
pseudo-gradients (faults act on what the workers send: Δ_k, or the gradient for
``allreduce``); ``gasloc`` has no server and refuses faults.

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
``gasloc``      decentralised and asynchronous: worker k runs H_k inner AdamW steps, applies
                an outer Adam step to its own Δ_k (lr = the inner lr), then averages its
                parameters with one random peer (W = I − αL of a one-edge matching, α = 1/2)
                as soon as both are ready              Cagnasso, Belilovsky, Oyallon 2026
==============  ===========================================================================

Budget: every method consumes the same ``steps × K`` minibatch gradients (equal samples);
a synchronous round that would overshoot is shortened in proportion to H_k.

Time: a round lasts max_k (compute of its H_k steps) plus the all-reduce; a ring all-reduce
is 2(K − 1) steps, each max_i (latency_i + (4n/K) / min(bw_i, bw_{i+1})); a gossip exchange
costs max(latency_i, latency_j) + 4n / min(bw_i, bw_j). Latencies are draws of ``uplink``.
Bytes sent per worker: 2(K − 1)/K · 4n per all-reduce, 4n per gossip exchange, plus
(K − 1) · 56 for ``diloco-naig``'s all-gather of the 14-float sketches. The random streams are
``naig.arrivals.worker_stream(seed, worker, component, family=2)``: every local method of a
seed sees the same compute and latency draws.

Example:
    >>> from naig.simulate.config import SimulateConfig
    >>> from naig.simulate.workload import Workload
    >>> cfg = SimulateConfig.from_options(arrivals="const:1,const:2", local_steps=(2,), steps=4, seeds=1,
    ...                                   strategies=("diloco",), data_bytes=50_000, eval_every=0,
    ...                                   eval_batches=1)
    >>> run = LocalEngine.start(Workload(cfg), "diloco", seed=0, lr=1e-3)
    >>> run.step(); run.t, run.gradients, run.time
    (1, 4, 4.0)
"""

from __future__ import annotations

import heapq
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
from naig.simulate.engines.arrivals import arrival_model
from naig.simulate.engines.base import OnServer
from naig.simulate.faults import GRADIENT_FAULTS
from naig.simulate.server import ServerState, WeightHistory
from naig.simulate.strategies import Batch, Update, make_strategy
from naig.simulate.strategies.naig import GibbsStrategy
from naig.simulate.workload import Workload, make_optimizer
from naig.sketch.core import SKETCH_DIM

if TYPE_CHECKING:
    from naig.simulate.config import SimulateConfig

__all__ = [
    "LOCAL_METHODS",
    "LOCAL_FAMILY",
    "LocalEngine",
    "LocalMethod",
    "resolve_method",
    "LocalClock",
    "LocalRun",
    "RoundRun",
    "GossipRun",
    "PseudoMean",
    "PseudoGibbs",
    "gossip_matrix",
    "pseudo_gradients",
]

_GIBBS = {"diloco-naig": "naig", "diloco-naig-exact": "naig-exact"}  # the energy each one uses

LOCAL_FAMILY = 2  # worker_stream family of local-update runs (0: arrivals, 1: synchronous rounds)
_PEER = 4  # worker_stream component of a worker's random peer choices
_SKETCH_BYTES = SKETCH_DIM * 4  # one 14-float32 sketch


@dataclass(frozen=True)
class LocalMethod:
    """What a local-update run does (shown in the run's JSON under ``local``).

    Attributes:
        name: the method's name, one of ``LOCAL_METHODS``.
        inner: ``adamw``, ``sgd`` or ``none`` (``allreduce``: workers only compute gradients).
        outer: ``sgd`` (Nesterov when ``momentum`` > 0), ``adam`` (``momentum`` is β1) or
            ``adamw`` (``allreduce``: the data-parallel optimizer).
        outer_lr: the outer learning rate.
        momentum: outer momentum (SGD) or β1 (Adam); 0 for none.
        topology: ``allreduce`` (synchronous rounds) or ``gossip`` (asynchronous pairs).
        weighting: ``mean`` or ``gibbs`` (diloco-naig: reference = the mean pseudo-gradient).
    """

    name: str
    inner: str
    outer: str
    outer_lr: float
    momentum: float
    topology: str = "allreduce"
    weighting: str = "mean"


def resolve_method(name: str, config: SimulateConfig, lr: float) -> LocalMethod:
    """The method of a local strategy with its outer defaults (docs/design.md §13) and the overrides.

    Args:
        name: a name in ``LOCAL_METHODS``.
        config: ``outer_lr`` / ``outer_momentum`` override diloco, diloco-naig and gasloc (local-sgd is
            outer lr 1 without momentum by definition; allreduce has no outer step).
        lr: the inner learning rate (gasloc's default outer lr).

    Example:
        >>> from naig.simulate.config import SimulateConfig
        >>> cfg = SimulateConfig.from_options(arrivals="exp:1", strategies=("diloco",))
        >>> m = resolve_method("diloco", cfg, 3e-3)
        >>> m.inner, m.outer, m.outer_lr, m.momentum
        ('adamw', 'sgd', 0.7, 0.9)
    """
    local = config.setting.local
    mom = 0.9 if local.outer_momentum is None else local.outer_momentum
    if name == "gasloc":
        return LocalMethod(name, "adamw", "adam", local.outer_lr or lr, mom, topology="gossip")
    if name == "local-sgd":
        return LocalMethod(name, "sgd", "sgd", 1.0, 0.0)
    if name == "allreduce":
        return LocalMethod(name, "none", "adamw", lr, 0.0)
    weighting = "gibbs" if name in _GIBBS else "mean"
    return LocalMethod(name, "adamw", "sgd", local.outer_lr or 0.7, mom, weighting=weighting)


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


def _pseudo_rule(workload: Workload, method: LocalMethod, lr: float) -> PseudoMean | PseudoGibbs:
    if method.weighting == "mean":
        return PseudoMean(method.name)
    energy = make_strategy(_GIBBS[method.name], workload.config.strategy_options(workload.sketch, lr))
    assert isinstance(energy, GibbsStrategy)
    return PseudoGibbs(method.name, energy, workload.config.beta)


class LocalEngine:
    """Local updates and gossip on the arrival clock (the methods of ``LOCAL_METHODS``)."""

    NAME: ClassVar[str] = "local"
    FAULT_KINDS: ClassVar[frozenset[str]] = GRADIENT_FAULTS

    @staticmethod
    def start(workload: Workload, rule: str, seed: int, lr: float) -> LocalRun:
        """A local-update run at time 0 (``GossipRun`` for gasloc, ``RoundRun`` otherwise)."""
        method = resolve_method(rule, workload.config, lr)
        if method.topology == "gossip":
            return GossipRun(workload, method, seed, lr)
        return RoundRun(workload, method, seed, lr, _pseudo_rule(workload, method, lr))


def gossip_matrix(workers: int, edges: list[tuple[int, int]]) -> np.ndarray:
    """The gossip matrix W = I − αL of a graph, α = 1/(d_max + 1) (docs/design.md §13).

    L = Σ_{(i,j) ∈ edges} (e_i − e_j)(e_i − e_j)ᵀ is the graph Laplacian and d_max its
    largest degree. W is symmetric with rows summing to 1, hence doubly stochastic, and
    it preserves the mean of the rows it mixes; on a matching (d_max = 1) it averages
    each matched pair.

    Args:
        workers: K.
        edges: pairs (i, j), i ≠ j, in 0..K−1.

    Returns:
        (K, K) float64.

    Example:
        >>> gossip_matrix(3, [(0, 2)]).tolist()
        [[0.5, 0.0, 0.5], [0.0, 1.0, 0.0], [0.5, 0.0, 0.5]]
    """
    lap = np.zeros((workers, workers))
    for i, j in edges:
        if i == j:
            raise ValueError(f"an edge joins two different workers, got ({i}, {j})")
        lap[[i, j], [i, j]] += 1.0
        lap[i, j] -= 1.0
        lap[j, i] -= 1.0
    alpha = 1.0 / (float(np.diag(lap).max(initial=0.0)) + 1.0)
    return np.eye(workers) - alpha * lap


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
        self._bw = np.asarray(model.bandwidth or (math.inf,) * k, dtype=np.float64)

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
        return max(self.latency(i), self.latency(j)) + self.message / float(min(self._bw[i], self._bw[j]))

    def allreduce(self) -> float:
        """Seconds of a ring all-reduce of 4n bytes: 2(K − 1) steps of 4n/K bytes per worker."""
        k = self.workers
        link = np.minimum(self._bw, np.roll(self._bw, -1))  # worker i sends to i + 1
        return float(sum(max(self.latency(i) + self.message / k / link[i] for i in range(k))
                         for _ in range(2 * (k - 1))))


class LocalRun:
    """What the local-update runs share: replicas, inner optimizers, data streams, clock, counters.

    Attributes:
        method: the ``LocalMethod`` (``name`` is the method's name).
        replicas: (K) ``nn.Parameter`` (n,) inner parameters of each worker.
        gradients: minibatch gradients consumed (the budget is ``steps × K``).
        t: outer steps (rounds; for gasloc one per worker phase).
        time: simulated seconds.
        bytes_sent: (K,) float64 bytes each worker has sent.
        busy: (K,) float64 compute seconds of each worker.
        history: π of each round (gasloc: none).
        diverged_at: outer step at which a gradient or parameter became non-finite.
    """

    clocked: ClassVar[bool] = True

    def __init__(self, workload: Workload, method: LocalMethod, seed: int, lr: float) -> None:
        c, k = workload.config, workload.config.workers
        self.workload, self.method, self.name, self.seed, self.lr = workload, method, method.name, seed, lr
        theta0 = workload.init_params(seed)
        self.steps_per_phase = (1,) * k if method.inner == "none" else c.setting.inner_steps()
        self.replicas = [nn.Parameter(theta0.clone()) for _ in range(k)]
        self.inner = [None if method.inner == "none" else make_optimizer(method.inner, [p], lr)
                      for p in self.replicas]
        self.gens = workload.worker_streams(seed, k)
        self.grads = theta0.new_empty(k, theta0.numel())
        self.losses = torch.full((k,), math.nan, device=workload.device)
        self.clock = LocalClock(arrival_model(workload), seed, workload.n_params)
        self.budget = c.steps * k
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


def _outer_options(m: LocalMethod) -> tuple[str, dict[str, Any]]:
    """The outer optimizer on θ: SGD (Nesterov when momentum > 0), Adam (β1 = momentum) or AdamW."""
    if m.outer == "sgd":
        return "sgd", {"momentum": m.momentum, "nesterov": m.momentum > 0}
    if m.outer == "adam":
        return "adam", {"betas": (m.momentum, 0.999)}
    return "adamw", {}


def _round_steps(h: tuple[int, ...], remaining: int) -> list[int]:
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

    def __init__(self, workload: Workload, method: LocalMethod, seed: int, lr: float,
                 rule: PseudoMean | PseudoGibbs) -> None:
        super().__init__(workload, method, seed, lr)
        kind, options = _outer_options(method)
        c = workload.config
        self.state = ServerState(self.replicas[0].detach().clone(), rule, kind, method.outer_lr,
                                 len(self.replicas), c.fault_list, workload.fault_generator(seed), **options)
        self.history = self.state.history
        self.pseudo = torch.zeros_like(self.grads)
        self.gibbs = isinstance(rule, PseudoGibbs)

    def step(self) -> None:
        """One round: inner phases, one ``ServerState.apply`` on the pseudo-gradients."""
        steps = _round_steps(self.steps_per_phase, self.budget - self.gradients)
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


class GossipRun(LocalRun):
    """gasloc: asynchronous local phases, local outer Adam steps, pairwise gossip.

    ``step()`` handles the next event: the end of a worker's phase (its outer step, then an
    exchange when a peer is ready) or the end of an exchange (the pair's parameters are
    averaged and both start their next phase). A worker whose phase ends first serves a
    waiting worker that drew it as peer; otherwise it draws a peer uniformly among the
    others and exchanges at once if that peer is waiting, else waits for it. No set of
    workers can all wait at once, so every run spends its budget.

    Attributes:
        params: (K) ``nn.Parameter`` each worker's outer iterate (its outer Adam owns it).
        theta: (n,) the consensus model mean_k params_k (what is evaluated).
        exchanges: pairwise exchanges completed.
    """

    def __init__(self, workload: Workload, method: LocalMethod, seed: int, lr: float) -> None:
        super().__init__(workload, method, seed, lr)
        k = len(self.replicas)
        self.params = [nn.Parameter(p.detach().clone()) for p in self.replicas]
        kind, options = _outer_options(method)
        self.outer = [make_optimizer(kind, [p], method.outer_lr, **options) for p in self.params]
        self.peers = [worker_stream(seed, w, _PEER, LOCAL_FAMILY) for w in range(k)]
        self.events: list[tuple[float, int, int]] = []  # (time, worker, peer; −1: end of a phase)
        self.phase = [0] * k  # inner steps of each worker's current phase
        self.waiting: dict[int, tuple[float, int]] = {}  # worker → (ready since, the peer it drew)
        self.started = self.exchanges = 0
        for w in range(k):
            self._start(w, 0.0)

    @property
    def theta(self) -> Tensor:
        """(n,) the consensus model: the mean of the workers' outer iterates."""
        return torch.stack([p.detach() for p in self.params]).mean(0)

    @property
    def done(self) -> bool:
        """True when nothing is running and nothing can start (budget spent), or on divergence."""
        return not self.events or self.diverged_at is not None

    def step(self) -> None:
        """Handle the next event (ties: earlier worker first)."""
        self.time, w, peer = heapq.heappop(self.events)
        if peer >= 0:
            self._mix(w, peer)
            return
        p = self.params[w]
        p.grad = pseudo_gradients(p.detach(), self.replicas[w].detach().unsqueeze(0))[0]
        self.outer[w].step()
        self.gradients += self.phase[w]
        self.t += 1
        if not bool(torch.isfinite(p.detach().sum())):
            self.diverged_at = self.t - 1
            return
        peer = self._match(w)
        if peer is not None:  # the pair mixes when the exchange ends
            heapq.heappush(self.events, (self.time + self.clock.exchange(w, peer), w, peer))
        elif len(self.params) == 1:  # nobody to gossip with
            self._start(w, self.time)

    def _match(self, w: int) -> int | None:
        """A peer ready for ``w`` now, or None (``w`` then waits for the peer it drew)."""
        k = len(self.params)
        asking = [v for v, (_, peer) in self.waiting.items() if peer == w]
        if asking:
            v = min(asking, key=lambda v: (self.waiting[v][0], v))
            del self.waiting[v]
            return v
        if k == 1:
            return None
        j = int(self.peers[w].integers(k - 1))
        j += j >= w  # uniform over the others
        if j in self.waiting:
            del self.waiting[j]
            return j
        self.waiting[w] = (self.time, j)
        return None

    def _mix(self, i: int, j: int) -> None:
        """The exchange of i and j ended (4n bytes sent by each): W = I − αL of the edge on the
        outer iterates; both restart."""
        mixing = torch.as_tensor(gossip_matrix(len(self.params), [(i, j)]), dtype=self.grads.dtype,
                                 device=self.grads.device)
        with torch.no_grad():
            stacked = mixing @ torch.stack([p.detach() for p in self.params])
            for v in (i, j):
                self.params[v].copy_(stacked[v])
        self.bytes_sent[[i, j]] += self.clock.message
        self.exchanges += 1
        for v in (i, j):
            self._start(v, self.time)

    def _start(self, w: int, at: float) -> None:
        """Start worker ``w``'s next phase at time ``at`` (nothing once the budget is spent)."""
        h = min(self.steps_per_phase[w], self.budget - self.started)
        seconds = self.inner_phase(w, self.params[w].detach(), h) if h else None
        if seconds is None:
            return
        self.started += h
        self.phase[w] = h
        heapq.heappush(self.events, (at + seconds, w, -1))

    def describe(self) -> dict[str, Any]:
        """See ``LocalRun.describe``; plus the number of pairwise exchanges."""
        return {**super().describe(), "exchanges": self.exchanges}
