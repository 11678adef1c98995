"""Decentralised local updates: GASLoC's accelerated gossip and naig's asynchronous gossip-adam.

See docs/design.md §13.

Neither has a server: every worker keeps its own iterate θ^i, runs H_i inner AdamW steps
from it (``LocalRun.inner_phase``) and talks only to its peers. The model evaluated is the
consensus mean_i θ^i.

==============  ===========================================================================
``gasloc``      synchronous rounds t over a graph G_t (``topology``: a random one-peer
                matching, the union of two, the complete graph or a ring). With g_t^i the
                drift θ^i_{t,H} − θ^i_t of worker i's inner phase, the proposals
                z_t = θ_t + η g_t are mixed, x̃_t = (I − αΛ_t) z_t, and the momentum acts on
                the mixed iterates: θ_{t+1} = x̃_t + γ (x̃_t − x̃_{t−1}) (``mixed``, the form
                that is DiLoCo on a complete graph), or on the proposals:
                θ_{t+1} = x̃_t + γ (z_t − z_{t−1}) (``summarised``, the update as publicly
                summarised). x̃_{−1} = z_{−1} = θ_0.     Cagnasso, Belilovsky, Oyallon 2026
``gossip-adam`` naig's own asynchronous variant (not the paper's): worker k runs H_k inner
                AdamW steps, applies an outer Adam step to its own Δ_k (lr = the inner lr),
                then averages its parameters with one random peer as soon as both are ready
==============  ===========================================================================

Time and bytes (gasloc): worker i sends its 4n-byte proposal to each of its d_i peers of the
round. Its link carries d_i messages, so a transfer between i and j takes
4n · max(d_i/bw_i, d_j/bw_j) after the later of the two is ready, plus the larger of their
latency draws; worker i's next round starts when its last transfer ends (a round waits only
for the matched peers). The run's ``time`` after round t is the latest worker's.

Example:
    >>> gossip_matrix(3, [(0, 2)]).tolist()
    [[0.5, 0.0, 0.5], [0.0, 1.0, 0.0], [0.5, 0.0, 0.5]]
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch
from torch import Tensor, nn

from naig.arrivals import worker_stream
from naig.simulate.arrivals.local import (
    LOCAL_FAMILY,
    LocalMethod,
    LocalRun,
    outer_options,
    pseudo_gradients,
    resolve_method,
    round_steps,
)
from naig.simulate.workload import make_optimizer

if TYPE_CHECKING:
    from naig.simulate.arrivals.setting import ArrivalsSetting
    from naig.simulate.runs import RunRules
    from naig.simulate.workload import Workload

__all__ = ["GossipEngine", "gossip_matrix", "round_graph", "gasloc_update", "GaslocRun", "GossipAdamRun"]

_PEER = 4  # worker_stream component of a gossip-adam worker's random peer choices
_GRAPH = 5  # worker_stream component (worker 0) of gasloc's graph of each round


def gossip_matrix(workers: int, edges: list[tuple[int, int]], alpha: float | None = None) -> np.ndarray:
    """The gossip matrix W = I − αΛ of a graph (docs/design.md §13).

    Λ = Σ_{(i,j) ∈ edges} (e_i − e_j)(e_i − e_j)ᵀ is the graph Laplacian (λ_ij = 1). W is
    symmetric with rows summing to 1, so it preserves the mean of the rows it mixes; it is
    doubly stochastic when α ≤ 1/d_max. The default α = 1/(d_max + 1) (max-degree weights,
    Xiao and Boyd 2004) averages each pair of a matching and is the exact average
    11ᵀ/K on a complete graph.

    Args:
        workers: K.
        edges: pairs (i, j), i ≠ j, in 0..K−1.
        alpha: the gossip step α (None: 1/(d_max + 1)).

    Returns:
        (K, K) float64.

    Raises:
        ValueError: an edge joins a worker to itself.

    Example:
        >>> gossip_matrix(2, [(0, 1)], alpha=0.25).tolist()
        [[0.75, 0.25], [0.25, 0.75]]
    """
    lap = np.zeros((workers, workers))
    for i, j in edges:
        if i == j:
            raise ValueError(f"an edge joins two different workers, got ({i}, {j})")
        lap[[i, j], [i, j]] += 1.0
        lap[i, j] -= 1.0
        lap[j, i] -= 1.0
    if alpha is None:
        alpha = 1.0 / (float(np.diag(lap).max(initial=0.0)) + 1.0)
    return np.eye(workers) - alpha * lap


def round_graph(topology: str, workers: int, rng: np.random.Generator) -> list[tuple[int, int]]:
    """The edges (i < j) of one round's communication graph.

    Args:
        topology: ``one-peer`` (a uniformly random maximum matching: K even, every worker has
            one peer; K odd, one random worker sits out), ``two-peer`` (the union of two
            independent such matchings, an edge drawn twice kept once), ``complete`` or ``ring``
            (i with i + 1 mod K; fixed).
        workers: K.
        rng: the run's graph stream (only the random topologies draw from it).

    Example:
        >>> round_graph("ring", 4, np.random.default_rng(0))
        [(0, 1), (0, 3), (1, 2), (2, 3)]
    """
    k = workers
    if topology == "complete":
        return [(i, j) for i in range(k) for j in range(i + 1, k)]
    if topology == "ring":
        return sorted({(min(i, (i + 1) % k), max(i, (i + 1) % k)) for i in range(k) if k > 1})
    draws = 2 if topology == "two-peer" else 1
    edges: set[tuple[int, int]] = set()
    for _ in range(draws):
        order = rng.permutation(k)
        edges |= {(int(min(order[a], order[a + 1])), int(max(order[a], order[a + 1])))
                  for a in range(0, k - 1, 2)}
    return sorted(edges)


def gasloc_update(theta: Tensor, drift: Tensor, previous: Tensor, mixing: Tensor, eta: float, gamma: float,
                  form: str) -> tuple[Tensor, Tensor]:
    """One GASLoC outer step of all workers (docs/design.md §13).

    Args:
        theta: (K, n) θ_t, each worker's iterate at the start of the round.
        drift: (K, n) g_t = θ_{t,H} − θ_t (the inner phase's displacement).
        previous: (K, n) what the momentum differences against: x̃_{t−1} (``mixed``) or z_{t−1}
            (``summarised``); θ_0 at t = 0.
        mixing: (K, K) W_t = I − αΛ_t, same dtype and device as ``theta``.
        eta: the outer lr η.
        gamma: the momentum γ (0: the non-accelerated form; both forms are then W z_t).
        form: ``mixed`` or ``summarised``.

    Returns:
        θ_{t+1} (K, n) and the ``previous`` of the next round (x̃_t or z_t).

    Example:
        >>> th, g = torch.zeros(2, 1), torch.tensor([[1.0], [3.0]])
        >>> w = torch.full((2, 2), 0.5)
        >>> new, carried = gasloc_update(th, g, th, w, 1.0, 0.5, "mixed")
        >>> new.flatten().tolist(), carried.flatten().tolist()
        ([3.0, 3.0], [2.0, 2.0])
    """
    proposal = torch.add(theta, drift, alpha=eta)  # z_t
    mixed = mixing @ proposal  # x̃_t
    if form == "mixed":  # the proposals are spent: their rows hold θ_{t+1}
        return proposal.copy_(mixed).sub_(previous).mul_(gamma).add_(mixed), mixed
    return (proposal - previous).mul_(gamma).add_(mixed), proposal


class GaslocRun(LocalRun):
    """gasloc: synchronous rounds of inner phases and accelerated gossip; ``step()`` makes one round.

    Attributes:
        params: (K, n) θ_t, each worker's outer iterate.
        previous: (K, n) x̃_{t−1} (mixed form) or z_{t−1} (summarised); θ_0 before the first round.
        edges: the last round's graph.
        finished: (K,) float64, the simulated second each worker ended its last round.
        exchanges: messages sent in all (a worker's proposal to one peer is one).
    """

    def __init__(self, workload: Workload, setting: ArrivalsSetting, rules: RunRules, method: LocalMethod,
                 seed: int, lr: float) -> None:
        super().__init__(workload, setting, rules, method, seed, lr)
        k = len(self.replicas)
        self.params = self.replicas[0].detach().clone().expand(k, -1).clone()
        self.previous = self.params.clone()
        self.graphs = worker_stream(seed, 0, _GRAPH, LOCAL_FAMILY)
        self.edges: list[tuple[int, int]] = []
        self.finished = np.zeros(k)
        self.exchanges = 0

    @property
    def theta(self) -> Tensor:
        """(n,) the consensus model: the mean of the workers' iterates."""
        return self.params.mean(0)

    @property
    def done(self) -> bool:
        """True once the budget of ``steps × K`` gradients is spent, or on divergence."""
        return self.gradients >= self.budget or self.diverged_at is not None

    def step(self) -> None:
        """One round: every worker's inner phase from its θ^i, then the gossip outer step."""
        steps = round_steps(self.steps_per_phase, self.budget - self.gradients)
        compute = np.zeros(len(steps))
        drift = self.grads  # worker w's row is free once its phase is done: it holds g_t^w
        for w, h in enumerate(steps):
            seconds = self.inner_phase(w, self.params[w], h) if h else 0.0
            if seconds is None:
                return
            compute[w] = seconds
            torch.sub(self.replicas[w].detach(), self.params[w], out=drift[w])
        m = self.method
        self.edges = round_graph(m.topology, len(steps), self.graphs)
        mixing = torch.as_tensor(gossip_matrix(len(steps), self.edges, m.gossip_step),
                                 dtype=self.params.dtype, device=self.params.device)
        with torch.no_grad():
            self.params, self.previous = gasloc_update(self.params, drift, self.previous, mixing, m.outer_lr,
                                                       m.momentum, m.form or "mixed")
        self._communicate(compute)
        self.gradients += sum(steps)
        self.t += 1
        if not bool(torch.isfinite(self.params.sum())):
            self.diverged_at = self.t - 1

    def _communicate(self, compute: np.ndarray) -> None:
        """Bytes (4n per peer) and each worker's end of round: its peers' transfers on shared links."""
        ready = self.finished + compute
        degree = np.zeros(len(ready))
        for i, j in self.edges:
            degree[[i, j]] += 1
        latency = [self.clock.latency(w) if degree[w] else 0.0 for w in range(len(ready))]
        end = ready.copy()
        for i, j in self.edges:
            done = max(ready[i], ready[j]) + max(latency[i], latency[j]) + self.clock.message * max(
                degree[i] / self.clock.bandwidth[i], degree[j] / self.clock.bandwidth[j])
            end[[i, j]] = np.maximum(end[[i, j]], done)
        self.finished = end
        self.bytes_sent += degree * self.clock.message
        self.exchanges += int(degree.sum())
        self.time = float(end.max())

    def describe(self) -> dict[str, Any]:
        """See ``LocalRun.describe``; plus the graph, α, the form and the messages sent."""
        m = self.method
        return {**super().describe(), "rounds": self.t, "gossip_step": m.gossip_step, "form": m.form,
                "exchanges": self.exchanges}


class GossipAdamRun(LocalRun):
    """gossip-adam (naig's variant): asynchronous local phases, local outer Adam steps, pairwise gossip.

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

    def __init__(self, workload: Workload, setting: ArrivalsSetting, rules: RunRules, method: LocalMethod,
                 seed: int, lr: float) -> None:
        super().__init__(workload, setting, rules, method, seed, lr)
        k = len(self.replicas)
        self.params = [nn.Parameter(p.detach().clone()) for p in self.replicas]
        kind, options = outer_options(method)
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


class GossipEngine:
    """The decentralised local-update methods (gasloc, gossip-adam) on the arrival clock: no server,
    so no faults (the config refuses them, naming the methods)."""

    NAME: ClassVar[str] = "gossip"
    FAULT_KINDS: ClassVar[frozenset[str]] = frozenset()

    @staticmethod
    def start(workload: Workload, setting: ArrivalsSetting, rules: RunRules, rule: str, seed: int,
              lr: float) -> LocalRun:
        """A gasloc or gossip-adam run at time 0."""
        method = resolve_method(rule, setting.local, lr)
        return (GaslocRun if rule == "gasloc" else GossipAdamRun)(workload, setting, rules, method, seed, lr)
