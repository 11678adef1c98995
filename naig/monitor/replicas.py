"""The replica check: every rank of a data-parallel group holds the same weights.

DDP replicates the model: the weights are broadcast once, then every rank applies the same
reduced gradient with the same optimizer, so the replicas stay bit-identical. A rank whose weights
differ (perturbed once, re-initialised, restored from another checkpoint, an update missed)
computes every later gradient at another point, for good, and nothing brings it back (DDP never
broadcasts again). In its gradient the departure can be small beside minibatch noise: on the
small GPT of ``naig detect --protocol persistent`` (K = 4, batch 8) weights perturbed by 1% were
named within 10 steps by the gradient tests in 0 of 10 test seeds (docs/results/monitor-detection.md),
while the weights themselves differ at once.

**What is sent.** Every ``every`` steps (steps 1, 1 + every, 1 + 2·every, …; ``WEIGHTS_EVERY``
by default) each rank packs its parameters as it packs its gradient,
``[S θ_k | ‖θ_k‖² | non-finite count]`` (``naig.monitor.signals.pack_tensors``: one read of the
weights, the monitor's sketch keyed by the parameters' names), one more row of the step's one
all-gather (14·R + 2 floats). The row travels at every step, so that the payload's width never
depends on a rank's step count (ranks whose counts disagree, e.g. a monitor state loaded on one
rank only, would otherwise gather different sizes and crash): between checks it is NaN with the
count ``NOT_DUE`` (−2), nothing read; at a check, a rank given no weights sends the count
``NOT_GIVEN`` (−1). A check where some ranks are due and others are not is a ``DataError``
naming them. The DDP hook reads the weights at the step's first bucket, before any of the step's
reductions can have completed (an optimizer overlapped with DDP, such as ZeRO's
``overlap_with_ddp``, updates parameters as their buckets finish).

**The test.** With s̃ the coordinate-wise median of the ranks' sketches and ñ the median of their
norms ‖θ_k‖, rank k departs by

    u_k = max(‖S θ_k − s̃‖ / √R, |‖θ_k‖ − ñ|) / ñ

(‖S Δ‖²/R estimates ‖Δ‖² with unit scale, as for the gradient: u is the weights' relative
difference, to within the sketch's ±38% at R = 1) and is named when u_k > ``TOLERANCE`` (10⁻⁵),
or when its weights hold a non-finite value (u = inf). Bit-identical replicas give u = 0 exactly;
rounding that differs from rank to rank (another kernel, another device type) moves each entry by
~1 float32 ulp (6·10⁻⁸ relative), far below 10⁻⁵; a 1% perturbation gives u ≈ 10⁻². There is no
false-alarm rate to spend: the check is deterministic.

**Which rank.** At K ≥ 3, when more than half of the ranks agree, the median is their weights,
coordinate by coordinate, so the departing minority is named and the majority departs by 0. With
no such majority (K = 4 split 2 and 2, every rank different) the median lies between them and
every rank departs: all are named. At K = 2 the median is the mean
of the two and both depart alike: both are named, since which one is wrong cannot be told.

**Between checks** a named rank stays named (its weights do not come back by themselves): from
the check that found it to the check that finds it back in agreement, every step's decision
names it (``Flag(rank, "weights", "mismatch", u, TOLERANCE, since)``, ``since`` the check that
first found it). A check step at which no rank gives its weights, or ``every`` = 0, clears them
(nothing vouches for them any more).

**Actions.** No action repairs desynchronised weights (restore every rank from one checkpoint);
what each does (``action_ranks``): ``raise`` stops the run at the check; ``exclude`` leaves the
named ranks out of the mean at every step while a majority agrees (K ≥ 3: training goes on from
the majority's gradients, computed at the right weights), and leaves nobody out for them at K = 2
or with no majority (excluding every rank would stop training); ``skip`` does not skip for them
(skipping every step would stop training without a word); ``log`` and ``warn`` record it.

**Where it runs.** ``MonitorHook`` (DDP, and the Lightning, Accelerate and Trainer callbacks
built on it) and ``Monitor.observe(weights=...)``. Not under FSDP2: its weights are sharded,
each rank holds a different shard, so there are no replicas to compare (an explicit
``weights_every`` there is refused).
"""

from __future__ import annotations

import math

import numpy as np

from naig.errors import UsageError
from naig.monitor.detectors import Decision, Flag, real_numbers, whole_numbers
from naig.sketch.core import SKETCH_DIM

__all__ = ["NOT_DUE", "NOT_GIVEN", "TOLERANCE", "WEIGHTS_EVERY", "ReplicaCheck", "action_ranks",
           "check_every", "gradient_flagged", "replica_departure"]

WEIGHTS_EVERY = 8
"""Steps between replica checks by default (steps 1, 9, 17, …): a desynchronised rank is named at
most 7 steps after it departs, for one read of the weights per 8 steps."""
TOLERANCE = 1e-5
"""The relative departure u above which a rank's weights differ from the others' (see the module)."""
NOT_GIVEN = -1.0
"""The count of a weights row that carries no weights at a check step (``observe`` without them)."""
NOT_DUE = -2.0
"""The count of the NaN weights row every rank sends between checks (nothing read)."""


def check_every(value: object) -> int:
    """Validate ``weights_every``: an int ≥ 0 (0: no replica check).

    Raises:
        UsageError: anything else, naming ``weights_every``.
    """
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0:
        raise UsageError("must be an int >= 0: steps between checks of the ranks' weights (0: never)",
                         field="weights_every", value=value)
    return int(value)


def replica_departure(rows: np.ndarray) -> np.ndarray:
    """Each rank's relative departure u_k from the ranks' median weights (see the module).

    Args:
        rows: (K, 14·R + 2) float64 ``[S θ_k | ‖θ_k‖² | non-finite count]`` per rank.

    Returns:
        (K,) float64 u_k ≥ 0; +inf for a rank with non-finite weights (or a non-finite payload);
        0 for K = 1. When no rank is finite, every entry is +inf.

    Raises:
        UsageError: ``rows`` not of shape (K, 14·R + 2).
    """
    a = np.asarray(rows, dtype=np.float64)
    if a.ndim != 2 or a.shape[0] < 1 or a.shape[1] < SKETCH_DIM + 2 or (a.shape[1] - 2) % SKETCH_DIM:
        raise UsageError(f"expected shape (K, 14*R + 2), got {a.shape}", field="weights")
    s, sq, bad = a[:, :-2], a[:, -2], a[:, -1]
    ok = np.isfinite(a).all(axis=1) & (bad == 0) & (sq >= 0)
    u = np.full(len(a), math.inf)
    if not ok.any():
        return u
    r = s.shape[1] // SKETCH_DIM
    norms = np.sqrt(sq[ok])
    ref = float(np.median(norms))
    centre = np.median(s[ok], axis=0)
    far = np.maximum(np.linalg.norm(s[ok] - centre, axis=1) / math.sqrt(r), np.abs(norms - ref))
    with np.errstate(divide="ignore", invalid="ignore"):
        u[ok] = far / ref if ref > 0 else np.where(far > 0, math.inf, 0.0)
    return u


class ReplicaCheck:
    """The replica check's cadence and the ranks it has named (see the module).

    Args:
        every: steps between checks (0: never).
        tolerance: the relative departure u above which a rank is named.

    Attributes:
        named: rank → (the step of the check that first found it, its latest u).
    """

    def __init__(self, every: int = WEIGHTS_EVERY, tolerance: float = TOLERANCE) -> None:
        self.every = check_every(every)
        self.tolerance = float(tolerance)
        self.named: dict[int, tuple[int, float]] = {}

    def due(self, steps_done: int) -> bool:
        """Whether the step after ``steps_done`` decided steps is a check step (1, 1 + every, …)."""
        return self.every > 0 and steps_done % self.every == 0

    def update(self, step: int, rows: np.ndarray | None) -> list[Flag]:
        """This step's ``weights`` flags: a check when ``rows`` is given, else the ranks named before.

        Args:
            step: the step being decided (1-based, the detector's).
            rows: (K, 14·R + 2) every rank's weights payload at a check, an empty (0, ·) array for a
                check step at which no rank gave its weights (clears the names), or None between
                checks.
        """
        if self.every == 0 or (rows is not None and len(rows) == 0):
            self.named = {}
        elif rows is not None:
            u = replica_departure(rows)
            self.named = {k: (self.named.get(k, (step, 0.0))[0], float(u[k]))
                          for k in range(len(u)) if len(u) > 1 and not u[k] <= self.tolerance}
        return [Flag(k, "weights", "mismatch", u, self.tolerance, since)
                for k, (since, u) in sorted(self.named.items())]

    def state_dict(self) -> dict:
        """The named ranks, as plain JSON values (inf as None)."""
        return {"named": [[k, since, u if math.isfinite(u) else None]
                          for k, (since, u) in self.named.items()]}

    def load_state_dict(self, state: dict, *, world: int | None = None, step: int | None = None) -> None:
        """Continue from ``state_dict()``; nothing changes when it is refused.

        Args:
            state: what ``state_dict()`` returned.
            world: the ranks of the detector loaded beside it (None: not checked); every named rank
                must be in 0..world−1.
            step: that detector's step (None: not checked); every rank must be named since a step
                in 1..step.

        Raises:
            UsageError: a malformed state.
        """
        try:
            rows = [(int(whole_numbers(k, "rank")), int(whole_numbers(since, "since")),
                     math.inf if u is None else float(real_numbers(u, "u")))
                    for k, since, u in state["named"]]
            named = {k: (since, u) for k, since, u in rows}
            ranks, last = (math.inf if world is None else world), (math.inf if step is None else step)
            if len(named) < len(rows) or any(not (0 <= k < ranks and 1 <= since <= last and u >= 0)
                                             for k, (since, u) in named.items()):
                raise ValueError("out of range")
        except (KeyError, TypeError, ValueError, OverflowError):
            raise UsageError("malformed replica-check state (expected {'named': [[rank, since, u], ...]}, "
                             "each rank of the run once, a whole step >= 1, u >= 0 or None)",
                             field="state") from None
        self.named = named


def action_ranks(decision: Decision) -> tuple[int, ...]:
    """The ranks an action leaves out of the mean (``exclude``), ascending (see "Actions").

    Every rank a gradient test or the non-finite check named; a rank named only by the replica
    check when the ranks so named are fewer than half of K (a majority agrees).
    """
    by_gradient = {f.rank for f in decision.flags if f.signal != "weights"}
    by_weights = {f.rank for f in decision.flags if f.signal == "weights"} - by_gradient
    keep_out = by_gradient | (by_weights if 2 * len(by_weights) < decision.world else set())
    return tuple(sorted(keep_out))


def gradient_flagged(decision: Decision) -> bool:
    """Whether a gradient test or the non-finite check named a rank (what ``skip`` acts on)."""
    return any(f.signal != "weights" for f in decision.flags)
