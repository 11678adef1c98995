"""``Monitor.observe``: the monitor in a custom training loop, before the user's own all-reduce.

Call it on every rank, every step, with this rank's gradients, before reducing them::

    monitor = Monitor(action="raise")
    for x, y in loader:
        loss_fn(model(x), y).backward()
        decision = monitor.observe({n: p.grad for n, p in model.named_parameters()})
        for p in model.parameters():                       # the user's own all-reduce
            dist.all_reduce(p.grad); p.grad /= dist.get_world_size()
        opt.step(); opt.zero_grad()

Each call sketches the gradient (``naig.monitor.signals.MonitorSketch``; the tensors' names key
the hashes, so every rank must pass the same names), all-gathers one float64 payload per rank
[S g | ‖g‖² | non-finite count | layout fingerprint | records lost] (m + 4 floats: 144 B with the
default 14-float sketch), derives the signals and runs the detectors. The fingerprint (52 bits of a
hash of every gradient's name and shape) is compared first: ranks that pass different parameters
stop on every rank with one ``DataError`` naming them. The last float counts the records this
rank's writers could not write (``naig.monitor.records``: a full disk never ends training), so
every rank warns once when rank 0's writer fails. Every rank gets the same ``Decision``; ``observe`` applies
no action itself except ``raise`` (``BadRankError`` on every rank, before the user's update), so
the user's loop decides what ``skip`` or ``exclude`` means; ``warn`` writes one line (rank, host,
signal) through ``warnings`` on rank 0, and so do ``skip`` and ``exclude``, saying the loop
applies them. The host names are all-gathered once, at the first call (64 bytes per rank). Each
collective waits at most ``timeout`` seconds (a rank that never calls ``observe`` gives a
``DataError`` instead of a hang).

Without an initialised process group ``observe`` works for one process (K = 1: the non-finite
check and the rank's own norm history; nothing to compare with).

Example:
    >>> import torch
    >>> mon = Monitor()
    >>> mon.observe({"w": torch.ones(3), "b": torch.tensor([float("nan")])}).ranks
    (0,)
"""

from __future__ import annotations

import collections
import hashlib
import math
import socket
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

from naig.choices import MIN_TIMEOUT
from naig.errors import DataError, UsageError, a_type, warn_caller
from naig.launch import MAX_TIMEOUT
from naig.metric import DEFAULT_LINE, parse_line
from naig.monitor.detectors import (
    DEFAULT_CLIP,
    DEFAULT_DELTA,
    DEFAULT_HOLD,
    DEFAULT_SCORES,
    DEFAULT_SIGNALS,
    DEFAULT_WARMUP,
    DEFAULT_WINDOW,
    MAX_WORLD,
    Decision,
    Detector,
    check_action,
    has_bool,
)
from naig.monitor.replicas import (
    NOT_DUE,
    NOT_GIVEN,
    WEIGHTS_EVERY,
    ReplicaCheck,
    action_ranks,
    check_every,
    gradient_flagged,
)
from naig.monitor.signals import (
    MonitorSketch,
    RankSignals,
    check_batch,
    check_blocks,
    pack_tensors,
    rank_signals,
    to_float64,
    unpack,
)
from naig.sketch.core import SKETCH_DIM, check_seed
from naig.threads import one_blas_thread

__all__ = ["HOST_BYTES", "LOST_BITS", "MIN_TIMEOUT", "SETUP_BYTES", "TAIL", "Monitor", "layout_fingerprint",
           "setup_text"]

HOST_BYTES = 64  # a host name is sent once, UTF-8, cut or padded to this many bytes
SETUP_BYTES = 96  # sent with it once: the payload's shape and dtype and the integration's settings (ASCII)
TAIL = 2  # floats observe appends to the payload: [layout fingerprint | state word (Monitor.state_word)]
LOST_BITS = 21  # the state word's low bits: the records lost on this rank (counted up to 2**21 - 1)


class Monitor:
    """Per-rank gradient signals and bad-rank decisions for a custom data-parallel loop.

    Args:
        process_group: the group whose ranks are compared (None: the default group, or one
            process when none is initialised).
        blocks: R, 14-float sketch blocks per rank (m = 14·R; more blocks, less sketch noise).
        seed: the sketch seed (block r uses ``seed + r``).
        line: the Fano line ℓ of the energy's Ψ_ℓ.
        batch: examples per rank (the unit of the noise scale B_simple).
        false_alarm: the probability that a clean step flags any rank (family-wise, per step); at
            least ``MIN_TEST_RATE`` (1e-15) per test, i.e. K × tests per rank times that (8e-14 at
            K = 8 with the default signals), refused below with the floor named.
        window: steps of pooled clean history the detectors calibrate on.
        warmup: clean steps pooled before the tests run (only non-finite checks until then).
        signals: the signals scored (a subset of ``SIGNALS``).
        scores: the tests used (a subset of ``SCORES``: ``transient``, ``cusum``).
        delta: the CUSUM reference δ (pooled standard deviations).
        clip: the CUSUM's clipping of each value (pooled standard deviations).
        hold: steps a named rank stays out of the other ranks' centring.
        action: one of ``ACTIONS``.
        timeout: seconds each collective may take, in [0.001, 30] (``MIN_TIMEOUT``: gloo counts whole
            milliseconds, and reads 0 as its group's timeout, minutes).
        weights_every: steps between checks that every rank holds the same weights
            (``naig.monitor.replicas``; 0: never). None: every ``WEIGHTS_EVERY`` steps where the
            weights are replicated (``MonitorHook``; ``observe`` when given ``weights``), never
            under FSDP2 (sharded weights: an explicit value is refused there).
        callback: called on every rank with each step's (``RankSignals``, ``Decision``).
            Record writers come after it, in the order added (``add_writer``).

    Raises:
        UsageError: for a bad argument, naming it.

    Attributes:
        signals: the latest ``RankSignals`` (None before the first call).
        decision: the latest ``Decision``.
        gathered: the latest gathered payloads, (K, m + 2) float64.
        hosts: each rank's host name (after the first call).
        writers: the record writers each step goes to, in order (``add_writer``).
        stepped_by: a weak reference to the integration (``MonitorHook``, ``FSDPMonitor``) whose steps
            this monitor decides, None before its first step: another one that is not detached is
            refused at its first step (one history per model).
    """

    def __init__(self, *, process_group: dist.ProcessGroup | None = None, blocks: int = 1, seed: int = 0,
                 line: Sequence[int] = DEFAULT_LINE, batch: float = 1.0, false_alarm: float = 1e-3,
                 window: int = DEFAULT_WINDOW, warmup: int = DEFAULT_WARMUP,
                 signals: Sequence[str] = DEFAULT_SIGNALS, scores: Sequence[str] = DEFAULT_SCORES,
                 delta: float = DEFAULT_DELTA, clip: float = DEFAULT_CLIP, hold: int = DEFAULT_HOLD,
                 action: str = "log", timeout: float = MAX_TIMEOUT, weights_every: int | None = None,
                 callback: Callable[[RankSignals, Decision], None] | None = None) -> None:
        self.group, self.blocks, self.seed = process_group, check_blocks(blocks), check_seed(seed)
        check_seed(self.seed + self.blocks - 1, field="seed")
        self.line, self.batch, self.action = parse_line(line), check_batch(batch), check_action(action)
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not (
                MIN_TIMEOUT <= timeout <= MAX_TIMEOUT):  # below 1 ms gloo reads 0: its group's own timeout
            raise UsageError(f"must be in [{MIN_TIMEOUT:g}, {MAX_TIMEOUT:g}] seconds", field="timeout",
                             value=timeout)
        if callback is not None and not callable(callback):
            raise UsageError("must be callable with (RankSignals, Decision), or None", field="callback",
                             value=type(callback).__name__)
        if process_group is not None and process_group is dist.GroupMember.NON_GROUP_MEMBER:
            raise UsageError("this rank is not a member of the group dist.new_group(...) made (it returned "
                             "GroupMember.NON_GROUP_MEMBER here): build the Monitor only on the group's "
                             "ranks", field="process_group")
        if process_group is not None and not isinstance(process_group, dist.ProcessGroup):
            raise UsageError("must be a torch.distributed ProcessGroup (e.g. dist.new_group(...)), or None: "
                             "the default group", field="process_group", value=type(process_group).__name__)
        self.timeout, self.callback = float(timeout), callback
        self.weights_asked = None if weights_every is None else check_every(weights_every)
        self.replicas = ReplicaCheck(WEIGHTS_EVERY if weights_every is None else self.weights_asked)
        args = dict(false_alarm=false_alarm, window=window, warmup=warmup, signals=signals, scores=scores,
                    delta=delta, clip=clip, hold=hold, action=action)
        probe = Detector(1, **args, quiet=True)  # check the detector's arguments now
        # kept as read (an iterator is read once; a list the caller changes later is not followed)
        self._detector_args = {**args, "signals": tuple(probe.signals), "scores": tuple(probe.scores)}
        # what state_word hashes besides the step: fixed from here on, so made once, not per step
        self._settings_key = repr((sorted(self._detector_args.items()), self._sketch_settings(),
                                   self.replicas.every))
        self.detector: Detector | None = None
        self.signals: RankSignals | None = None
        self.decision: Decision | None = None
        self.gathered: np.ndarray | None = None
        self.hosts: tuple[str, ...] = ()
        self._sketches: dict[tuple, MonitorSketch] = {}
        self.stepped_by: weakref.ref | None = None  # the integration whose steps it decides (one at a time)
        self._decided = 0  # steps decided since it was built or loaded (load_state_dict replaces them)
        self._weights_sketches: dict[tuple, MonitorSketch] = {}  # the replica check's, per device
        self.records_lost = 0
        self._lost_here, self._lost_warned = 0, False
        self.writers: list[Callable[[RankSignals, Decision], None]] = []

    def add_writer(self, writer: Callable[[RankSignals, Decision], None]) -> None:
        """Hand every step's (``RankSignals``, ``Decision``) to ``writer`` too, after ``callback`` and
        the writers added before it; on every rank (a ``naig.monitor.records`` writer writes on rank 0
        only). ``RecordWriter.attach(monitor)`` calls this.

        Raises:
            UsageError: ``writer`` is not callable, or already added.
        """
        if not callable(writer):
            raise UsageError("must be callable with (RankSignals, Decision)", field="writer",
                             value=type(writer).__name__)
        if any(w is writer for w in self.writers):
            raise UsageError("is already added to this monitor; it would write every step twice",
                             field="writer")
        self.writers.append(writer)

    def remove_writer(self, writer: Callable[[RankSignals, Decision], None]) -> None:
        """Stop handing steps to ``writer`` (a closed ``naig.monitor.records`` writer removes itself);
        nothing happens when it was not added."""
        self.writers = [w for w in self.writers if w is not writer]

    def _world_rank(self) -> tuple[int, int]:
        """(K, this rank) in the group; (1, 0) without an initialised process group."""
        if not dist.is_available() or not dist.is_initialized():
            return 1, 0
        group = self.group if self.group is not None else dist.group.WORLD
        return dist.get_world_size(group), dist.get_rank(group)

    def observe(self, grads: Mapping[str, Tensor | None] | Tensor, *, full_dtensor: bool = False,
                weights: Mapping[str, Tensor] | None = None) -> Decision:
        """One step: sketch, all-gather, signals, decision (the same on every rank).

        Args:
            grads: {name: gradient} or one flat tensor (named ``"grad"``); float tensors of any
                dtype and device. None entries are left out, so every rank passes the same names
                and shapes once they are (checked: a fingerprint of them travels in the payload): a
                gradient None on some ranks only (a parameter those ranks did not use) stops every
                rank with a ``DataError``; pass ``torch.zeros_like(p)`` for it there.
                A DTensor replicated over its mesh is read from its local tensor; a sharded one
                needs ``full_dtensor``.
            full_dtensor: gather a sharded DTensor with ``full_tensor()`` (a collective of its
                mesh: every rank of the mesh must call ``observe``). Without it a sharded DTensor
                is refused (a rank's shard of a reduced gradient is not that rank's gradient: for
                FSDP2 use ``naig.monitor.fsdp``, which reads each rank's gradient before the reduction).
            weights: {name: tensor} of this rank's replicated weights (e.g.
                ``dict(model.named_parameters())``) for the replica check (``naig.monitor.replicas``):
                read on its steps only (every ``weights_every``). Give it on every rank or on none.

        Returns:
            The step's ``Decision``.

        Raises:
            UsageError: ``grads`` empty, not float tensors (a sparse, meta or sharded DTensor
                gradient included, naming it), or not a mapping or tensor; the monitor decides an
                integration's steps (``stepped_by``, not detached).
            DataError: a collective that did not finish within ``timeout`` seconds; ranks that
                passed different names or shapes (on every rank, naming them); ``weights`` given on
                some ranks only.
            BadRankError: a rank was flagged and the action is ``raise`` (on every rank).
        """
        if not isinstance(full_dtensor, bool):
            raise UsageError("must be True or False", field="full_dtensor", value=full_dtensor)
        owner = self.stepping()
        if owner is not None:
            raise UsageError(f"this Monitor decides the steps of a {type(owner).__name__}; observe() "
                             "would add a second gradient to its history: use another Monitor (or detach() "
                             "it first)", field="grads")
        if weights is not None:  # refused at every step (and with one rank), though read on check steps only
            _check_weights_mapping(weights)
        layout, tensors, shapes = _flatten(grads, full_dtensor)
        sketch = self._sketch(layout, tensors[0].device)
        device = tensors[0].device
        if weights is None and self.weights_asked:
            raise UsageError(f"weights_every={self.weights_asked} checks the ranks' weights: pass "
                             "observe(..., weights=dict(model.named_parameters())) or weights_every=0",
                             field="weights")
        tail = torch.tensor([layout_fingerprint(shapes), self.state_word()], dtype=torch.float64,
                            device=device)
        replica = self.world > 1 and self.replicas.every > 0  # a row every step: see naig.monitor.replicas
        row = [self.weights_row(weights, device, due=self.weights_due())] if replica else []
        rows = self._check_tail(self.all_gather(torch.cat([pack_tensors(tensors, sketch), *row, tail])))
        checked = None
        if replica:
            rows, checked = rows[:, :sketch.dim + 2], rows[:, sketch.dim + 2:]
        decision = self.decide(rows, weights=checked)
        if decision.flagged and self.action == "raise":
            raise decision.error()
        return decision

    def stepping(self) -> object | None:
        """The integration (``MonitorHook``, ``FSDPMonitor``) whose steps this monitor decides now:
        ``stepped_by``'s, while it is alive and not detached; else None."""
        owner = self.stepped_by() if self.stepped_by is not None else None
        return owner if owner is not None and not owner.detached else None

    def weights_due(self) -> bool:
        """Whether the next step decided is a replica-check step (``naig.monitor.replicas``)."""
        return self.replicas.due(self.detector.step if self.detector is not None else 0)

    def weights_row(self, weights: Mapping[str, Tensor] | None, device: torch.device, *, due: bool = True
                    ) -> Tensor:
        """This rank's ``[S θ | ‖θ‖² | non-finite count]`` (m + 2,) float64 on ``device`` for the replica
        check; a row of NaN with the count ``NOT_GIVEN`` without ``weights``, ``NOT_DUE`` when not
        ``due`` (nothing read; ``naig.monitor.replicas``).

        Weights on several devices (a model spread over GPUs) are packed device by device and
        added (the sketch is linear and keyed by names: the sum is the whole layout's payload).

        Raises:
            UsageError: ``weights`` empty or not float tensors (naming the tensor).
        """
        if weights is None or not due:
            row = torch.full((self.blocks * 14 + 2,), math.nan, dtype=torch.float64, device=device)
            row[-1] = NOT_DUE if not due else NOT_GIVEN
            return row
        _check_weights_mapping(weights)
        by_device: dict[torch.device, dict[str, Tensor]] = {}
        for name, w in weights.items():
            if isinstance(w, Tensor):
                by_device.setdefault(w.device, {})[name] = w
        if len(by_device) > 1:
            return sum(self.weights_row(part, device) for part in by_device.values())
        layout, tensors, _ = _flatten(weights, field="weights")
        key = (layout, str(tensors[0].device))
        if key not in self._weights_sketches:
            self._weights_sketches[key] = MonitorSketch.build(layout, self.seed, self.blocks)
        return pack_tensors(tensors, self._weights_sketches[key]).to(device)

    def note_lost_record(self) -> None:
        """Count one record a writer of this rank could not write (``naig.monitor.records``).

        The count travels in the next ``observe`` payload, so every rank learns of it (and warns once).
        """
        self._lost_here += 1

    def _check_tail(self, rows: Tensor) -> Tensor:
        """Check the ranks' layout fingerprints and note records lost; the payloads without the tail.

        Raises:
            DataError: on every rank, when ranks passed different names or shapes, naming them.
        """
        tail = rows[:, -TAIL:].numpy()
        prints = tail[:, 0]
        if not (prints == prints[0]).all():
            raise DataError(_layout_message(prints))
        self.note_gathered_lost(self.check_states(tail[:, 1]))
        return rows[:, :-TAIL]

    def state_word(self) -> float:
        """This rank's last payload float: a 32-bit fingerprint of its monitor's settings and detector
        step above the count of records its writers lost (below 2**``LOST_BITS``), packed exactly in a
        float64 (an integer below 2**53). Ranks whose monitors were built alike and loaded the same
        state send the same fingerprint (``check_states``)."""
        step = self.detector.step if self.detector is not None else 0
        key = f"{self._settings_key}|{step}".encode()
        fingerprint = int.from_bytes(hashlib.blake2b(key, digest_size=4).digest(), "little")
        return float(fingerprint * 2**LOST_BITS + min(self._lost_here, 2**LOST_BITS - 1))

    def check_states(self, words: np.ndarray) -> np.ndarray:
        """Every rank's ``state_word`` as gathered → their lost-record counts (K,) float64.

        Raises:
            DataError: on every rank, when the ranks' fingerprints differ (a state loaded on some ranks
                only, or monitors built with other settings): their decisions would differ, and
                ``skip`` would then update some replicas and not others.
        """
        prints, lost = np.divmod(np.asarray(words, dtype=np.float64).astype(np.int64), 2**LOST_BITS)
        if not (prints == prints[0]).all():
            odd, same = _odd_ranks(prints)
            raise DataError(f"ranks {', '.join(map(str, odd))} have another monitor state than ranks "
                            f"{', '.join(map(str, same))} (other settings, or another step count: a "
                            "load_state_dict on some ranks only?); build every rank's Monitor alike and "
                            "load the same state on every rank")
        return lost.astype(np.float64)

    @property
    def lost_here(self) -> int:
        """Records this rank's writers could not write (``note_lost_record``)."""
        return self._lost_here

    def note_gathered_lost(self, lost: np.ndarray) -> None:
        """Every rank's count of lost records, as gathered: warn once on a rank that did not lose them.

        Args:
            lost: (K,) float64, each rank's ``lost_here`` as it sent it.
        """
        most = int(np.max(lost)) if len(lost) else 0
        if most and not self._lost_warned and not self._lost_here:
            warn_caller(f"naig.monitor: a record writer of rank {int(np.argmax(lost))} could not write "
                        f"({most} record{'' if most == 1 else 's'} lost so far; see that rank's warning); "
                        "training goes on", RuntimeWarning)
        self._lost_warned = self._lost_warned or bool(most)
        self.records_lost = most

    @property
    def world(self) -> int:
        """K, the ranks of the group (1 without an initialised process group)."""
        return self._world_rank()[0]

    @property
    def rank(self) -> int:
        """This process's rank in the group (0 without an initialised process group)."""
        return self._world_rank()[1]

    def all_gather(self, mine: Tensor) -> Tensor:
        """Every rank's ``mine`` (K, ...) on the CPU, waiting at most ``timeout`` seconds.

        The first call also all-gathers the host names and ``mine``'s shape and dtype
        (``HOST_BYTES + SETUP_BYTES`` per rank, one fixed-size gather: see ``start_gather``). Without a
        process group it returns ``mine`` as one row.

        Args:
            mine: this rank's tensor (the same shape and dtype on every rank).

        Raises:
            DataError: a collective that did not finish within ``timeout`` seconds; at the first call,
                ranks whose ``mine`` has another shape or dtype (on every rank, naming them).
        """
        world = self.world
        self._first_gather(mine, None, world)
        return self._gather(mine, world) if world > 1 else mine.detach().cpu().reshape(1, *mine.shape)

    def _first_gather(self, mine: Tensor, setup: Callable[[], str] | None, world: int) -> None:
        """At the first gather: the host names, and every rank's setup checked alike (``_gather_setup``;
        ``setup`` is called then only)."""
        if not self.hosts:
            text = setup() if setup is not None else ""
            self.hosts = self._gather_setup(world, mine, text) if world > 1 else (socket.gethostname(),)

    def start_gather(self, mine: Tensor, setup: Callable[[], str] | None = None) -> Callable[[], Tensor]:
        """Start an all-gather of ``mine`` now; the returned function waits for it (``all_gather``'s result).

        Integrations start one per step, when the step's last part (DDP bucket, FSDP module) is
        packed and before it is reduced, and wait for it after handing that part on: the gather
        and the last reduction are in flight together, and every rank issues the gather at the
        same point of its sequence of collectives (an inner hook's callbacks, which start
        collectives from gloo's threads, come after it). Host names are gathered (synchronously) at
        the first call, with ``mine``'s shape and dtype and ``setup`` (what else makes the ranks'
        collectives differ: the integration's ``per_bucket`` and ``exact``), in one gather of a fixed
        size, so that ranks set up otherwise (another ``blocks``: another payload width) stop with
        one ``DataError`` instead of a gather of mismatched sizes, which gloo aborts the process on.

        Args:
            mine: this rank's payloads.
            setup: returns a short ASCII description of the caller's settings that change its
                collectives (called at the first call only), or None.

        Raises:
            DataError: from the returned function, when the gather did not finish within ``timeout``;
                at the first call, ranks whose shape, dtype or ``setup`` differs (on every rank,
                naming them).
        """
        world = self.world
        self._first_gather(mine, setup, world)
        if world == 1:
            row = mine.detach().cpu().reshape(1, *mine.shape)
            return lambda: row
        out = [torch.empty_like(mine) for _ in range(world)]
        work = dist.all_gather(out, mine, group=self._group(), async_op=True)
        return lambda: self._wait(work, out)

    def decide(self, gathered: Tensor | np.ndarray, *, dots: np.ndarray | None = None,
               sq_dists: np.ndarray | None = None, weights: Tensor | np.ndarray | None = None,
               where: Callable[[Decision], Mapping[int, str]] | None = None, acts: bool = False) -> Decision:
        """Signals and the decision of one step from every rank's payload (the same on every rank).

        Calls the callback, and for ``warn`` writes the decision's line on rank 0; applies no
        other action (``observe`` and the integrations do).

        Args:
            gathered: (K, m + 2) float64 payloads ``[S g_k | ‖g_k‖² | non-finite count]``, m = 14 ·
                ``blocks`` (this monitor's sketch).
            dots: (K,) exact ⟨g_k, ḡ⟩ (with ``sq_dists``), or None: sketch estimates.
            sq_dists: (K,) exact ‖g_k − ḡ‖², or None.
            weights: (K, m + 2) float64 every rank's ``weights_row`` for the replica check
                (``naig.monitor.replicas``), or None: no check (ranks named at the last check stay
                named). Rows with the count ``NOT_DUE`` (every rank's): no check either; ``NOT_GIVEN``
                (every rank's): a check step without weights, which clears the names.
            where: given the decision, rank → where its gradient departs most (for the line).
            acts: the caller applies ``skip`` and ``exclude`` (an integration): the line says what was
                done; else (``observe``, a custom loop) it says the loop is to apply it.

        Returns:
            The step's ``Decision`` (hosts and ``where`` filled in).

        Raises:
            UsageError: payloads of the wrong shape (another ``blocks`` than this monitor's included), or
                ``where`` not a function (before anything changes); ``where`` returning anything but a
                mapping rank → str (after the step is decided, kept and written without it).
            DataError: ``weights`` given on some ranks only, or ranks at another step than others
                (naming them).
        """
        rows = to_float64(gathered, "gathered")
        s, sq, bad = unpack(rows)
        if rows.shape[1] != self.blocks * SKETCH_DIM + 2:  # another sketch's payloads: not comparable
            raise UsageError(f"expected shape (K, {self.blocks * SKETCH_DIM + 2}) for blocks={self.blocks} "
                             f"(14 per block + 2), got {rows.shape}; pack with the monitor's own sketch",
                             field="gathered")
        given = _given(weights, rows.shape[0], rows.shape[1])  # checked before anything changes
        if self.detector is not None and rows.shape[0] != self.detector.world:  # e.g. loaded before init
            raise UsageError(f"the monitor's detectors are of {self.detector.world} ranks (a loaded state, "
                             f"or earlier steps), these payloads of {rows.shape[0]}; resume on "
                             f"{self.detector.world} ranks, or build a new Monitor", field="world",
                             value=rows.shape[0])
        if where is not None and not callable(where):
            raise UsageError(f"expected a function of the decision returning rank → text, got "
                             f"{type(where).__name__}", field="where")
        if self.detector is None:
            self.detector = Detector(rows.shape[0], **self._detector_args, quiet=self.rank != 0)
        with one_blas_thread():  # the step's small matrices: numpy's BLAS on one thread (naig.threads)
            sig = rank_signals(s, sq, bad, dots=dots, sq_dists=sq_dists, batch=self.batch, line=self.line)
            decision = replace(self.detector.update(sig), hosts=self.hosts)
            self._decided += 1
            if self.detector.scored is not None:  # drift_cos and drift_t2 as the detectors measured them
                sig = self.detector.scored
        replica = self.replicas.update(decision.step, given)
        if replica:
            flags = sorted((*decision.flags, *replica),
                           key=lambda f: (f.rank, f.signal != "nonfinite", f.score, f.signal))
            decision = replace(decision, flags=tuple(flags))
        placed, bad_where = (_placed(where, decision) if decision.flagged and where is not None
                             else (None, None))
        if placed is not None:
            decision = replace(decision, where=placed)
        self.gathered, self.signals, self.decision = np.array(rows, dtype=np.float64), sig, decision
        if self.callback is not None:
            self.callback(sig, decision)
        for writer in self.writers:
            writer(sig, decision)
        acted = _acted(decision, acts) if decision.flagged and self.rank == 0 else None
        if acted is not None:  # warn, and an action that changes training, say so
            warn_caller(decision.describe() + acted)
        if bad_where is not None:  # the step is decided and kept (its records written), without `where`
            raise bad_where
        return decision

    def state_dict(self) -> dict:
        """The detectors' state (pool, change statistics, namings) and settings, as plain JSON values.

        Save it with the checkpoint (``torch.save`` or ``json.dump``) and give it to
        ``load_state_dict`` of a ``Monitor`` built with the same settings on the same number of
        ranks: the resumed run decides as the uninterrupted one would. Every rank holds the same
        state (decisions are computed from gathered data), so rank 0's copy serves all ranks.
        ``detector`` is None before the first step.
        """
        return {"version": 1, "detector": None if self.detector is None else self.detector.state_dict(),
                "replicas": self.replicas.state_dict(), "sketch": self._sketch_settings()}

    def _sketch_settings(self) -> dict:
        """What the payloads depend on besides the detectors' settings (a state must match them)."""
        return {"blocks": self.blocks, "seed": self.seed, "line": list(self.line), "batch": self.batch}

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state_dict()`` (see there).

        Load before this monitor's first step to resume a run. Loaded after it has decided steps (a
        rollback to a checkpoint), the state replaces that history: the next decision is the state's
        step + 1, and rank 0 warns, saying so (a resumed run that loads a few steps late would
        otherwise count its steps from the checkpoint's without a word).

        Raises:
            UsageError: a state of another version, other detector settings, another sketch
                (``blocks``, ``seed``, ``line``, ``batch``: its payloads would not be comparable with
                the state's history) or another number of ranks than this group's (naming the field).
        """
        replaced, self._decided = self._decided, 0
        try:
            self._load(state)
        except BaseException:
            self._decided = replaced
            raise
        if replaced and self.rank == 0:
            step = self.detector.step if self.detector is not None else 0
            warn_caller(f"Monitor.load_state_dict: the {replaced} step(s) this monitor decided since it was "
                        f"built or loaded are replaced by the state's history (the next decision is step "
                        f"{step + 1}); to resume a run, load before its first training step")

    def _load(self, state: dict) -> None:
        version = state.get("version") if isinstance(state, Mapping) else None
        if isinstance(version, bool) or version != 1 or "detector" not in state:
            raise UsageError("not a Monitor.state_dict() of version 1", field="state")
        saved = state.get("sketch", self._sketch_settings())  # a state saved before these were kept: as now
        if not isinstance(saved, Mapping):
            raise UsageError("malformed monitor state (sketch is not a mapping)", field="state")
        for key, value in self._sketch_settings().items():
            if key not in saved:  # "pass key=None" would not help
                raise UsageError(f"malformed monitor state (its sketch settings have no {key!r}); load a "
                                 "state saved by Monitor.state_dict()", field="state")
            got = list(saved[key]) if isinstance(saved[key], tuple) else saved[key]  # a serializer's tuple
            # another sketch: other payloads, the detectors' history meaningless (True == 1 in Python)
            if got != value or has_bool(got) != has_bool(value):
                raise UsageError(f"the state was saved with {key}={saved.get(key)!r}; pass "
                                 f"{key}={saved.get(key)!r} to resume", field=key, value=value)
        det = state["detector"]
        if det is None:  # before the first step: no rank can have been named
            self.replicas.load_state_dict(state.get("replicas", {"named": []}), world=None, step=0)
            self.detector = None
            return
        settings = det.get("settings") if isinstance(det, Mapping) else None
        world = settings.get("world") if isinstance(settings, Mapping) else None
        if isinstance(world, bool) or not isinstance(world, int) or not 1 <= world <= MAX_WORLD:
            raise UsageError(f"malformed monitor state (detector.settings.world is not 1..{MAX_WORLD})",
                             field="state")
        if dist.is_available() and dist.is_initialized() and world != self.world:
            raise UsageError(f"the state was saved with {world} ranks, this group has {self.world}; resume "
                             f"on {world} ranks", field="world", value=self.world)
        detector = Detector(world, **self._detector_args, quiet=True)
        detector.load_state_dict(dict(det))
        self.replicas.load_state_dict(state.get("replicas", {"named": []}), world=world,
                                      step=detector.step)  # after every other check
        self.detector = detector

    def _sketch(self, layout: tuple[tuple[str, int], ...], device: torch.device) -> MonitorSketch:
        key = (layout, str(device))
        if key not in self._sketches:
            self._sketches.clear()  # one layout at a time
            self._sketches[key] = MonitorSketch.build(layout, self.seed, self.blocks, device)
        return self._sketches[key]

    def _group(self) -> dist.ProcessGroup:
        return self.group if self.group is not None else dist.group.WORLD

    def _gather(self, mine: Tensor, world: int) -> Tensor:
        """All-gather one tensor per rank (K, ...) on the CPU, waiting at most ``timeout``."""
        out = [torch.empty_like(mine) for _ in range(world)]
        return self._wait(dist.all_gather(out, mine, group=self._group(), async_op=True), out)

    def _wait(self, work: dist.Work, out: list[Tensor]) -> Tensor:
        self.wait_work(work, "all-gather")
        return torch.stack(out).cpu()

    def wait_work(self, work: dist.Work, what: str = "collective") -> None:
        """Wait for a collective started with ``async_op=True``, at most ``timeout`` seconds.

        Raises:
            DataError: it did not finish in time (a rank that never reached it), or failed before
                (a rank that left: its connection closed), naming ``what``.
        """
        start = time.monotonic()
        try:
            work.wait(timeout=timedelta(seconds=self.timeout))
        except RuntimeError as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            waited = time.monotonic() - start
            how = (f"did not finish within {self.timeout:g} s" if waited >= 0.9 * self.timeout else
                   f"failed after {waited:.1f} s of its {self.timeout:g} s (a rank left?)")
            raise DataError(f"the monitor's {what} {how} ({first}); every rank must reach the monitor at "
                            "every step") from None

    def _gather_setup(self, world: int, mine: Tensor, setup: str) -> tuple[str, ...]:
        """Every rank's host name (``HOST_BYTES``) and setup (``SETUP_BYTES``: ``mine``'s shape and
        dtype, then ``setup``) in one gather of a fixed size; the host names.

        Raises:
            DataError: on every rank, when the setups differ, naming the ranks and both setups.
        """
        name = socket.gethostname().encode()[:HOST_BYTES]
        mine_setup = setup_text(mine, setup)
        buf = torch.zeros(HOST_BYTES + SETUP_BYTES, dtype=torch.uint8)
        buf[:len(name)] = torch.tensor(list(name), dtype=torch.uint8)
        buf[HOST_BYTES:HOST_BYTES + len(mine_setup)] = torch.tensor(list(mine_setup), dtype=torch.uint8)
        rows = [bytes(r.tolist()) for r in self._gather(buf.to(mine.device), world)]
        setups = [r[HOST_BYTES:].rstrip(b"\0").decode(errors="replace") for r in rows]
        if len(set(setups)) > 1:
            odd, same = _odd_ranks(np.unique(setups, return_inverse=True)[1].astype(np.float64))
            raise DataError(f"ranks {', '.join(map(str, odd))} send the monitor payloads set up as "
                            f"{setups[odd[0]]!r}, ranks {', '.join(map(str, same))} as {setups[same[0]]!r} "
                            "(blocks sets a payload's width; per_bucket, exact, weights_every and the model "
                            "its rows); "
                            "build every rank's monitor and hook alike")
        return tuple(r[:HOST_BYTES].rstrip(b"\0").decode(errors="replace") for r in rows)


def setup_text(mine: Tensor, setup: str) -> bytes:
    """What ``Monitor._gather_setup`` sends of a rank's setup: ``mine``'s shape and dtype, then
    ``setup``, ASCII, at most ``SETUP_BYTES`` (the widest a run sends fits: tested)."""
    text = f"{tuple(mine.shape)} {str(mine.dtype).removeprefix('torch.')} {setup}".strip()
    return text.encode("ascii", errors="replace")[:SETUP_BYTES]


def layout_fingerprint(shapes: Sequence[tuple[str, tuple[int, ...]]]) -> float:
    """A 52-bit hash of the (name, shape) of every gradient, as a float64 (exact: below 2**53).

    Example:
        >>> layout_fingerprint([("w", (2, 3))]) == layout_fingerprint([("w", (3, 2))])
        False
    """
    digest = hashlib.blake2b(repr(tuple(shapes)).encode(), digest_size=8).digest()
    return float(int.from_bytes(digest, "little") >> 12)


def _odd_ranks(prints: np.ndarray) -> tuple[list[int], list[int]]:
    """The ranks whose fingerprint differs from the most common one (ties: rank 0's), and the others."""
    values, counts = np.unique(prints, return_counts=True)
    common = prints[0] if (counts == counts.max()).sum() > 1 else values[counts.argmax()]
    return ([k for k in range(len(prints)) if prints[k] != common],
            [k for k in range(len(prints)) if prints[k] == common])


def _layout_message(prints: np.ndarray) -> str:
    """The one line naming the ranks whose layout differs from the most common one (ties: rank 0's)."""
    odd, same = _odd_ranks(prints)
    return (f"ranks {', '.join(map(str, odd))} passed Monitor.observe other gradient names or shapes than "
            f"ranks {', '.join(map(str, same))}; every rank must pass the same parameters (a model that "
            "differs across ranks? a gradient None on some ranks only: pass torch.zeros_like(p) there), else "
            "the sketches are of different layouts and no signal means anything")


def _placed(where: Callable[[Decision], Mapping[int, str]], decision: Decision
            ) -> tuple[dict[int, str] | None, UsageError | None]:
    """``where(decision)`` as a dict rank → str, or (None, the error) when it returns anything else."""
    got = where(decision)
    try:
        placed = dict(got)
    except (TypeError, ValueError):
        placed = None
    if placed is None or not all(isinstance(k, int | np.integer) and not isinstance(k, bool) and
                                 isinstance(v, str) for k, v in placed.items()):
        return None, UsageError(f"must return a mapping rank → text, got {got!r:.60}", field="where")
    return {int(k): v for k, v in placed.items()}, None


def _acted(decision: Decision, acts: bool) -> str | None:
    """The end of a flagged decision's line on rank 0: "" for ``warn``; for ``skip`` and ``exclude``
    what they do to this step when they act (``acts``: the integration does it; else the user's loop
    is to), None when they do not act (a ``skip`` of a step the replica check alone flagged, an
    ``exclude`` without a majority); ``log`` and ``raise``: no line."""
    if decision.action == "warn":
        return ""
    who = "" if acts else "; your loop applies it"
    if decision.action == "skip" and gradient_flagged(decision):
        return f" (skip: this step's optimizer update is skipped on every rank{who})"
    left = list(action_ranks(decision)) if decision.action == "exclude" else []
    if left:
        return f" (exclude: rank{'s' if len(left) > 1 else ''} {', '.join(map(str, left))} left out of " \
               f"this step's mean{who})"
    return None


def _check_weights_mapping(weights: object) -> None:
    """Refuse ``weights`` that are not a {name: tensor} mapping (``observe``, ``weights_row``)."""
    if not isinstance(weights, Mapping):
        raise UsageError(f"got {a_type(weights)}; pass {{name: weight}}, e.g. "
                         "dict(model.named_parameters())", field="weights")


def _given(weights: Tensor | np.ndarray | None, world: int, width: int) -> np.ndarray | None:
    """The gathered weights rows (K, m + 2) float64 for ``ReplicaCheck.update``: None when this is
    no check step, an empty (0, m + 2) array for a check step at which no rank gave its weights.

    Raises:
        UsageError: not (K, ``width``) rows (``width`` = m + 2 of the monitor's sketch).
        DataError: some ranks gave their weights and others did not, or some are at a check step and
            others are not (naming them).
    """
    if weights is None:
        return None
    rows = to_float64(weights, "weights")
    if rows.ndim != 2 or rows.shape != (world, width):
        raise UsageError(f"expected ({world}, {width}) rows (14 per sketch block + 2), got {rows.shape}",
                         field="weights")
    idle = rows[:, -1] == NOT_DUE
    if idle.all():
        return None
    if idle.any():
        raise DataError(f"ranks {np.flatnonzero(idle).tolist()} are not at a replica-check step and ranks "
                        f"{np.flatnonzero(~idle).tolist()} are: their monitors count steps differently (load "
                        "the same Monitor state on every rank)")
    missing = rows[:, -1] == NOT_GIVEN
    if missing.all():
        return rows[:0]
    if missing.any():
        raise DataError(f"ranks {np.flatnonzero(missing).tolist()} gave no weights to the replica check "
                        "and the others did: pass observe(..., weights=...) on every rank or on none")
    return rows


def _is_dtensor(g: object) -> bool:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - a torch without DTensor
        return False
    return isinstance(g, DTensor)


def _readable(name: str, g: Tensor, full_dtensor: bool, field: str = "grads") -> Tensor:
    """The plain strided tensor the monitor sketches for one gradient.

    Raises:
        UsageError: a sharded DTensor without ``full_dtensor``, a nested, sparse or meta gradient,
            naming it.
    """
    if _is_dtensor(g):
        if all(p.is_replicate() for p in g.placements):
            return g.to_local()
        if not full_dtensor:
            raise UsageError(f"{name!r} is a DTensor with placements {tuple(g.placements)}: its local "
                             "shard is not this rank's gradient; pass full_dtensor=True to gather it "
                             "(full_tensor(), a collective of its mesh), or monitor FSDP2 with "
                             "naig.monitor.fsdp",
                             field=field)
        return g.full_tensor()
    if g.is_nested:
        raise UsageError(f"{name!r} is a nested tensor; pass its components (g.unbind()) under their own "
                         "names, or leave it out", field=field)
    if g.layout != torch.strided:
        raise UsageError(f"{name!r} is a sparse gradient ({g.layout}); pass it as g.to_dense() (e.g. for "
                         "nn.Embedding(sparse=True)) or leave it out", field=field)
    if g.is_meta:
        what = "the weights after the model is materialised (to_empty() and init, or a loaded state)" \
            if field == "weights" else "the gradient after backward()"
        raise UsageError(f"{name!r} is a meta tensor (no data); pass {what}", field=field)
    return g


def _flatten(grads: Mapping[str, Tensor | None] | Tensor, full_dtensor: bool = False, field: str = "grads"
             ) -> tuple[tuple[tuple[str, int], ...], list[Tensor], tuple[tuple[str, tuple[int, ...]], ...]]:
    """The (name, numel) layout, the given gradients (detached, not copied here; see ``pack_tensors``
    for what the sketch copies) and their (name, shape).

    Raises:
        UsageError: for anything but a non-empty mapping of float tensors or one float tensor.
    """
    if isinstance(grads, Tensor):
        items = [("grad", grads)]
    elif isinstance(grads, Mapping):
        items = [(str(n), g) for n, g in grads.items() if g is not None]
    else:
        raise UsageError(f"got {a_type(grads)}; pass {{name: gradient}} or one tensor",
                         field=field)
    if not items:
        raise UsageError("no gradient to observe (empty, or every entry None)", field=field)
    names = [n for n, _ in items]
    if len(set(names)) != len(names):  # keys that differ but read the same (1 and "1") share hash codes
        twice = next(n for n, c in collections.Counter(names).items() if c > 1)
        raise UsageError(f"two entries are named {twice!r} (as str); give each tensor its own name",
                         field=field)
    bad = [n for n, g in items if not isinstance(g, Tensor) or not g.is_floating_point()]
    if bad:
        raise UsageError(f"not a float tensor: {', '.join(bad[:3])}", field=field)
    items = [(n, _readable(n, g, full_dtensor, field)) for n, g in items]
    if len({g.device for _, g in items}) != 1:
        raise UsageError("gradients on several devices; pass one device's", field=field)
    layout = tuple((n, g.numel()) for n, g in items)
    shapes = tuple((n, tuple(g.shape)) for n, g in items)
    return layout, [g.detach() for _, g in items], shapes
