"""The monitor's records: JSONL, CSV, TensorBoard or any logger, written by rank 0 only.

A writer is added to the ``Monitor`` (``attach`` calls ``Monitor.add_writer``) and reads the
monitor's settings for the header::

    records = Records(JsonlRecords("monitor.jsonl"), TensorBoardRecords("runs/monitor"))
    monitor = records.attach(Monitor(action="warn"))     # every rank; only rank 0 writes
    ...                                                  # train (observe, or a DDP/FSDP hook)
    records.close()

Every rank calls its writers with the same data (the decision is made from gathered data); rank
0 of the monitor's group writes, the other ranks do nothing.

**Scores.** The detectors score each signal of each rank with a transient test (its normalised
value u against the pooled clean ranks) and a CUSUM change statistic, each against its own
threshold (``naig.monitor.detectors``). A record's *score* of a signal is the larger of
value/threshold over the two (|u|/t for the two-sided ``norm``, |S|/h for the CUSUM): a test
fires when its score exceeds 1, so scores of different tests and ranks compare. The thresholds
are the decision's (``Decision.thresholds``). A non-finite rank scores +inf (signal
``nonfinite``); a signal the detector does not score, NaN. The values behind the scores are each
rank's from the pass that decided it (a named rank's from the pass that named it, the others'
after the named ranks are left out of the mean), as the flags' are.

**Write failures.** A writer is a passenger: a write that fails (a full disk, a read-only folder,
a logger that raises) never ends training unless ``attach(monitor, on_error="raise")`` asked for
it. The writer warns once, stops writing, counts each step record it loses in ``lost`` and says the
count at ``close``; ``Monitor.observe`` carries the count to every rank, which warns once too.
``read_log`` reads every complete record of a file whose last line was cut and says so in
``MonitorLog.cut``.

**Step summary** (every writer): ``max_score`` (over ranks and signals), ``max_rank``,
``max_signal``, ``flagged`` (the flagged ranks), ``k_eff`` = 1/Σ_k π_k², the effective number of
ranks of the Gibbs weights π of the Fano–Fisher energies E_k (``naig.gibbs.naig_weights``, β
``"auto"``: K when the ranks agree, towards 1 when one dominates; at K = 2 the two drifts from
the mean are opposite, E_0 = E_1, so K_eff is 2 whatever the ranks: it cannot tell them apart)
and ``b_simple`` (the step's gradient noise scale).

**JSONL** (``JsonlRecords``, schema ``SCHEMA_VERSION``): one JSON object per line, flushed per
step. The first line of a run is a header ``{"type": "header", "schema", "naig", "created",
"world", "hosts", "monitor", "step_offset"}`` (``monitor``: its settings: blocks, seed, line,
batch, action, false_alarm, window, signals, scores, timeout). Then one line per step: ``{"type":
"step", "step", "action", "flagged", "flags", "where", "summary", "scores", "weights", "transient",
"cusum", "signals"}`` with ``flags`` a list of ``{"rank", "signal", "score", "z",
"threshold", "since"}``, ``where`` rank → where the integration places a flagged rank's departure (a DDP
bucket and its parameters; ``{}`` when not placed), ``scores`` and ``transient``/``cusum``
signal → (K,) lists, ``weights`` the (K,) π, and ``signals`` ``RankSignals.to_dict()`` (per rank:
nonfinite, usable, reference, sq_norm, rel_norm, energy, cos, sq_dist; ``kinds``: which are exact
and which sketch estimates; the noise scale). Non-finite floats are written as the strings
``"NaN"``, ``"Infinity"``, ``"-Infinity"`` (Python's names; ``float()`` reads them back), so every
line is strict JSON. ``append=True`` continues an existing file: a new header line, steps numbered
after its last; ``overwrite=True`` replaces it (the file a crashed run left); without either an
existing file is refused.

**CSV** (``CsvRecords``): one row per rank per step, columns ``CSV_COLUMNS``; non-finite values as
``nan``/``inf``.

**TensorBoard** (``TensorBoardRecords``, the optional extra ``naig[tensorboard]``): scalars under
``naig_monitor/`` at global step = the step: ``max_score``, ``max_rank``, ``k_eff``,
``flagged_ranks`` (count), ``b_simple``; with ``per_rank=True`` also ``rank{k}/score_{signal}``,
``rank{k}/weight``, ``rank{k}/rel_norm``, ``rank{k}/cos``, ``rank{k}/energy``.

**Any logger** (``LoggerRecords(fn)``): ``fn(dict)`` once per step with flat keys
``naig_monitor/step``, the summary scalars and (``per_rank=True``) the per-rank ones as above,
e.g. ``LoggerRecords(wandb.log)``.
"""

from __future__ import annotations

import csv
import itertools
import json
import math
import os
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import numpy as np

from naig.errors import DataError, UsageError
from naig.gibbs import naig_weights
from naig.io import missing_reason
from naig.monitor.detectors import SCORES, SIDES, SIGNALS, Decision

if TYPE_CHECKING:
    from naig.monitor.signals import RankSignals

__all__ = ["CSV_COLUMNS", "ON_ERROR", "PREFIX", "SCHEMA_VERSION", "CsvRecords", "JsonlRecords",
           "LoggerRecords", "MAX_WORLD", "MonitorLog", "Records", "RecordWriter", "TensorBoardRecords",
           "decision_scalars", "decode", "encode", "flat_scalars", "k_eff", "read_log", "step_record"]

SCHEMA_VERSION = 1
ON_ERROR = ("warn", "raise")
"""What a failed write does (``RecordWriter.attach``): warn and go on (default), or raise."""
PREFIX = "naig_monitor/"
_ENCODED = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
_PER_RANK = ("nonfinite", "usable", "sq_norm", "rel_norm", "energy", "cos", "sq_dist")
CSV_COLUMNS = ("step", "rank", "host", "flagged", "flags", "where", *_PER_RANK, "cos_kind", "sq_dist_kind",
               "weight", *(f"score_{s}" for s in SIGNALS), *(f"{c}_{s}" for s in SIGNALS for c in SCORES),
               "max_score", "k_eff", "b_simple")
"""The CSV header: one row per rank per step."""


def encode(obj: Any) -> Any:
    """``obj`` with every NaN/±inf float (nested too) as ``"NaN"``, ``"Infinity"``, ``"-Infinity"``.

    Example:
        >>> encode({"z": [1.5, float("inf"), float("nan")]})
        {'z': [1.5, 'Infinity', 'NaN']}
    """
    if isinstance(obj, float | np.floating):
        f = float(obj)
        return f if math.isfinite(f) else ("NaN" if math.isnan(f) else ("Infinity" if f > 0 else "-Infinity"))
    if isinstance(obj, Mapping):
        return {str(k): encode(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [encode(v) for v in obj]
    if isinstance(obj, np.integer | np.bool_):
        return obj.item()
    return obj


def decode(obj: Any) -> Any:
    """The inverse of ``encode``: the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"`` back to floats.

    Example:
        >>> decode({"z": [1.5, "Infinity", "NaN"]})["z"][:2]
        [1.5, inf]
    """
    if isinstance(obj, str):
        return _ENCODED.get(obj, obj)
    if isinstance(obj, dict):
        return {k: decode(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [decode(v) for v in obj]
    return obj


def k_eff(energies: np.ndarray) -> tuple[float, np.ndarray]:
    """K_eff = 1/Σ π_k² of the Gibbs weights π of the energies (β ``"auto"``), and π.

    Args:
        energies: (K,) float64 Fano–Fisher energies; non-finite ones get π = 0.

    Returns:
        (K_eff in [1, K], π (K,) float64 summing to 1); uniform π (K_eff = K) when no energy is finite.

    Example:
        >>> k_eff(np.array([0.0, 0.0, np.nan]))[0]
        2.0
    """
    pi = naig_weights(np.asarray(energies, dtype=np.float64), "auto")
    return float(1.0 / np.sum(pi * pi)), pi


def _scores(sig: RankSignals, decision: Decision) -> dict[str, list[float]]:
    """signal → (K,) the larger value/threshold of its tests (|·| for two-sided and the lower CUSUM);
    +inf for a non-finite rank. The thresholds are the decision's own (``Decision.thresholds``)."""
    out = {}
    for name in decision.transient.keys() | decision.cusum.keys():
        best = np.full(decision.world, np.nan)
        for score in SCORES:
            zs = (decision.transient if score == "transient" else decision.cusum).get(name)
            t = decision.thresholds.get(score, {}).get(name, math.nan)
            if zs is None or not math.isfinite(t):
                continue
            z = np.asarray(zs, dtype=np.float64)
            ratio = (np.abs(z) if SIDES[name] == "both" or score == "cusum" else z) / t
            best = np.where(np.isnan(best) | (ratio > best), ratio, best)
        best[~np.asarray(sig.usable, dtype=bool)] = math.inf
        out[name] = best.tolist()
    nan = [math.nan] * decision.world  # a signal the detector does not score: NaN (as the CSV reads it)
    return {name: out.get(name, nan) for name in SIGNALS}


def step_record(sig: RankSignals, decision: Decision, *, step: int | None = None) -> dict:
    """One step's record (not encoded; NaN/inf as floats): see the module for the fields.

    Args:
        sig: the step's signals.
        decision: the step's decision (the same step).
        step: the step number written (default ``decision.step``).

    Raises:
        UsageError: when ``sig`` and ``decision`` are for different numbers of ranks.
    """
    if sig.world != decision.world:
        raise UsageError(f"signals of {sig.world} ranks with a decision of {decision.world}", field="world",
                         value=sig.world)
    scores = _scores(sig, decision)
    keff, pi = k_eff(sig.energy)
    cands = [(math.inf, -k, "nonfinite") for k in range(sig.world) if not sig.usable[k]]
    cands += [(vals[k], -k, name) for name, vals in scores.items() for k in range(sig.world)
              if sig.usable[k] and math.isfinite(vals[k])]
    best = max(cands, default=None)  # ties: the lowest rank, then the signal name
    summary = {"max_score": best[0] if best else math.nan, "max_rank": -best[1] if best else None,
               "max_signal": best[2] if best else None, "flagged": list(decision.ranks), "k_eff": keff,
               "b_simple": sig.noise.b_simple}
    return {"type": "step", "step": decision.step if step is None else step, "action": decision.action,
            "flagged": list(decision.ranks),
            "flags": [{"rank": f.rank, "signal": f.signal, "score": f.score, "z": f.z,
                       "threshold": f.threshold, "since": f.since} for f in decision.flags],
            "where": {str(r): text for r, text in decision.where.items()},
            "summary": summary, "scores": scores, "weights": pi.tolist(),
            "transient": {k: list(v) for k, v in decision.transient.items()},
            "cusum": {k: list(v) for k, v in decision.cusum.items()}, "signals": sig.to_dict()}


def decision_scalars(monitor: Any, per_rank: bool = False) -> dict[str, float]:
    """The monitor's latest step as flat scalars (``flat_scalars`` of its ``step_record``): what the
    framework callbacks hand to their loggers.

    Args:
        monitor: a ``naig.monitor.Monitor`` that has decided at least one step.
        per_rank: add the ``rank{k}/...`` series.

    Raises:
        UsageError: before the monitor's first decision.
    """
    if monitor.decision is None:
        raise UsageError("the monitor has not decided a step yet", field="monitor")
    return flat_scalars(step_record(monitor.signals, monitor.decision), per_rank)


def flat_scalars(record: dict, per_rank: bool = False) -> dict[str, float]:
    """A step record as flat scalar keys under ``PREFIX`` (the TensorBoard and logger view).

    Args:
        record: a ``step_record``.
        per_rank: add ``rank{k}/...`` series (scores per signal, weight, rel_norm, cos, energy).
    """
    s = record["summary"]
    out = {f"{PREFIX}step": float(record["step"]), f"{PREFIX}max_score": float(s["max_score"]),
           f"{PREFIX}max_rank": math.nan if s["max_rank"] is None else float(s["max_rank"]),
           f"{PREFIX}k_eff": float(s["k_eff"]), f"{PREFIX}flagged_ranks": float(len(s["flagged"])),
           f"{PREFIX}b_simple": float(s["b_simple"])}
    if per_rank:
        sig = record["signals"]
        for k in range(sig["world"]):
            for name, vals in record["scores"].items():
                out[f"{PREFIX}rank{k}/score_{name}"] = float(vals[k])
            out[f"{PREFIX}rank{k}/weight"] = float(record["weights"][k])
            for q in ("rel_norm", "cos", "energy"):
                out[f"{PREFIX}rank{k}/{q}"] = float(sig[q][k])
    return out


class RecordWriter(ABC):
    """A monitor callback that writes each step's record on rank 0 (base class of the writers).

    Subclasses implement ``_open`` (rank 0, first step: the header), ``_write`` (a record) and
    ``_close``. Use ``attach(monitor)`` to install the writer; calling it before that raises.

    Args:
        per_rank: per-rank series besides the step summary (where the format has a choice).
    """

    def __init__(self, per_rank: bool = False) -> None:
        if not isinstance(per_rank, bool):
            raise UsageError("must be True or False", field="per_rank", value=per_rank)
        self.per_rank = per_rank
        self.monitor: Any = None
        self.on_error = "warn"
        self.lost = 0
        self.failure: str | None = None
        self._opened = False
        self._closed = False
        self._offset = 0

    def attach(self, monitor: Any, *, on_error: str = "warn") -> Any:
        """Add this writer to ``monitor`` (``Monitor.add_writer``: after its callback and the writers
        added before); returns ``monitor``.

        Args:
            monitor: a ``naig.monitor.Monitor`` (its settings go into the header and its detector's
                thresholds into the scores).
            on_error: what a failed write does (``ON_ERROR``). ``"warn"`` (default): the monitor
                is a passenger, so a full disk, a read-only folder or a logger that raises never
                ends training: one warning names the writer, the step and the error, the writer
                stops writing and counts each record it did not write in ``lost`` (``close`` says
                how many), and every rank's ``Monitor.observe`` warns once too. ``"raise"``:
                the error propagates (rank 0 only, so the other ranks then time out).

        Raises:
            UsageError: when this writer is already attached (it would write every step twice), or
                for an ``on_error`` outside ``ON_ERROR``.
        """
        if on_error not in ON_ERROR:
            raise UsageError(f"must be one of {', '.join(ON_ERROR)}", field="on_error", value=on_error)
        if self.monitor is not None:
            raise UsageError("is already attached to a monitor; make one writer per monitor",
                             field="callback")
        monitor.add_writer(self)
        self.monitor, self.on_error = monitor, on_error
        return monitor

    def __call__(self, sig: RankSignals, decision: Decision) -> None:
        """Write one step (rank 0 of the monitor's group only).

        Raises:
            UsageError: before ``attach``, or after ``close``.
        """
        if self.monitor is None or self.monitor.detector is None:
            raise UsageError("not attached to a monitor; install it with records.attach(monitor)",
                             field="callback")
        if self._closed:
            raise UsageError("is closed; make a new writer to write more steps", field="callback")
        if not self._rank_zero():
            return
        if not self._opened:
            self._opened = True
            self._guarded(lambda: self._open(self._header(decision)), decision.step, record=False)
        record = step_record(sig, decision, step=self._offset + decision.step)
        self._guarded(lambda: self._write(record), decision.step)

    def _guarded(self, write: Callable[[], None], step: int, record: bool = True) -> None:
        """Run ``write`` (a step's ``record``, or the opening header); on a failure apply ``on_error``
        (see ``attach``). Each step record not written counts in ``lost``; the header does not."""
        if self.failure is not None:
            if record:
                self._count_lost()
            return
        try:
            write()
        except Exception as exc:  # a passenger: OSError, a logger's own errors, an unusable append file
            if self.on_error == "raise":
                raise
            self._fail(exc, step, record)

    def _fail(self, exc: Exception, step: int, record: bool) -> None:
        """Stop writing after a failure at ``step``: one warning, the file closed, the record counted."""
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        self.failure = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
        try:
            self._close()
        except Exception:  # noqa: BLE001 - a full disk fails the final flush too; nothing more to save
            pass
        if record:
            self._count_lost()
        warnings.warn(f"naig.monitor: {self._describe()} could not write the record of step {step} "
                      f"({self.failure}); training goes on, this writer writes nothing more and "
                      "counts the records it loses (close() says how many)", RuntimeWarning, stacklevel=4)

    def _count_lost(self) -> None:
        self.lost += 1
        note = getattr(self.monitor, "note_lost_record", None)
        if callable(note):
            note()

    def _describe(self) -> str:
        where = getattr(self, "path", None) or getattr(self, "log_dir", None)
        return f"{type(self).__name__}({str(where)!r})" if where is not None else type(self).__name__

    def close(self) -> None:
        """Flush and close (idempotent); after a write failure, warn once with the records lost."""
        if self._opened and not self._closed and self.failure is None:
            self._close()
        if self.failure is not None and not self._closed:
            warnings.warn(f"naig.monitor: {self._describe()} lost {self.lost} record"
                          f"{'' if self.lost == 1 else 's'} after {self.failure}", RuntimeWarning,
                          stacklevel=2)
        self._closed = True

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _rank_zero(self) -> bool:
        return _group_rank(getattr(self.monitor, "group", None)) in (None, 0)

    def _header(self, decision: Decision) -> dict:
        from naig import __version__

        m, det = self.monitor, self.monitor.detector
        settings = {"blocks": m.blocks, "seed": m.seed, "line": list(m.line), "batch": m.batch,
                    "action": m.action, "false_alarm": det.false_alarm, "window": det.window,
                    "signals": list(det.signals), "scores": list(det.scores), "timeout": m.timeout}
        return {"type": "header", "schema": SCHEMA_VERSION, "naig": __version__,
                "created": datetime.now(timezone.utc).isoformat(timespec="seconds"), "world": decision.world,
                "hosts": list(decision.hosts), "monitor": settings, "step_offset": self._offset}

    @abstractmethod
    def _open(self, header: dict) -> None:
        """Start the output with the run's header (rank 0, first step)."""

    @abstractmethod
    def _write(self, record: dict) -> None:
        """Write one step's record (rank 0)."""

    def _close(self) -> None:  # noqa: B027 - optional: writers without a file have nothing to close
        return None


def _group_rank(group: Any) -> int | None:
    """This process's rank in ``group`` (None: no process group, one process)."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return None
    return dist.get_rank(group if group is not None else dist.group.WORLD)


def _rank_known_nonzero() -> bool:
    """Whether this process is known (group or launcher environment) not to be rank 0."""
    rank = _group_rank(None)
    if rank is None:
        env = os.environ.get("RANK")
        rank = int(env) if env is not None and env.isdigit() else None
    return rank not in (None, 0)


def _check_path(path: str | os.PathLike, field: str, append: bool, overwrite: bool = False) -> Path:
    """Check a record file before training: its directory exists, it is not a directory, and it does
    not exist unless ``append`` or ``overwrite`` (``naig.distributed.ddp``'s rule for its CSV).

    Raises:
        UsageError: naming ``field``.
    """
    if not isinstance(path, str | os.PathLike) or not str(path):
        raise UsageError("must be a file path", field=field, value=path)
    p = Path(path)
    if not p.absolute().parent.is_dir():
        raise UsageError(f"directory {p.absolute().parent} does not exist; create it or pass another path",
                         field=field, value=str(p))
    if p.is_dir():
        raise UsageError("is a directory; pass a file name", field=field, value=str(p))
    if not append and not overwrite and p.exists() and p.stat().st_size > 0:
        raise UsageError("exists; pass append=True to continue it, overwrite=True to replace it, or another "
                         "path", field=field, value=str(p))
    return p


def _file_mode(append: object, overwrite: object) -> tuple[bool, bool]:
    """(append, overwrite), checked: each True or False, not both.

    Raises:
        UsageError: naming the field.
    """
    for name, value in (("append", append), ("overwrite", overwrite)):
        if not isinstance(value, bool):
            raise UsageError("must be True or False", field=name, value=value)
    if append and overwrite:
        raise UsageError("and append=True both given; pass one (continue the file, or replace it)",
                         field="overwrite", value=True)
    return append, overwrite


class JsonlRecords(RecordWriter):
    """Rank 0 writes one JSON object per line (a header, then one per step); see the module.

    Args:
        path: the file; its directory must exist.
        append: continue an existing file of this schema (steps numbered after its last).
        overwrite: replace an existing file (e.g. the one a crashed run left).

    Raises:
        UsageError: a missing directory, a directory, an existing file without ``append`` or
            ``overwrite``, both of them, or (with ``append``) a file that is not a naig monitor
            JSONL (checked on rank 0 at the first step).
    """

    def __init__(self, path: str | os.PathLike, append: bool = False, *, overwrite: bool = False) -> None:
        super().__init__(per_rank=True)
        self.append, self.overwrite = _file_mode(append, overwrite)
        self.path = Path(path) if _rank_known_nonzero() else _check_path(path, "path", self.append,
                                                                          self.overwrite)
        if not _rank_known_nonzero() and self.append and self.path.is_file() and self.path.stat().st_size:
            _last_jsonl_step(self.path, None)  # a file that is not a monitor JSONL: refused before training
        self._fh: IO[str] | None = None

    def _open(self, header: dict) -> None:
        _check_path(self.path, "path", self.append, self.overwrite)
        if self.append and self.path.exists() and self.path.stat().st_size > 0:
            self._offset = _last_jsonl_step(self.path, header["world"])
            header["step_offset"] = self._offset
        self._fh = self.path.open("a" if self.append else "w", encoding="utf-8")
        self._line(header)

    def _line(self, obj: dict) -> None:
        self._fh.write(json.dumps(encode(obj), allow_nan=False) + "\n")
        self._fh.flush()

    def _write(self, record: dict) -> None:
        self._line(record)

    def _close(self) -> None:
        self._fh.close()


def _last_jsonl_step(path: Path, world: int | None) -> int:
    """The last step of an existing monitor JSONL of ``world`` ranks (any when None; UsageError otherwise)."""
    last, seen = 0, False
    try:
        with path.open(encoding="utf-8") as fh:
            for line in fh:
                obj = json.loads(line)
                if obj.get("type") == "header":
                    if obj.get("schema") != SCHEMA_VERSION or world not in (None, obj.get("world")):
                        raise ValueError("header")
                    seen = True
                elif obj.get("type") == "step":
                    last = max(last, int(obj["step"]))
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError, RecursionError) as exc:
        ranks = "" if world is None else f" and {world} ranks"
        raise UsageError(f"is not a naig monitor JSONL of schema {SCHEMA_VERSION}{ranks} "
                         f"({type(exc).__name__}); pass another path", field="path",
                         value=str(path)) from None
    if not seen:
        raise UsageError("has no naig monitor header; pass another path", field="path", value=str(path))
    return last


class CsvRecords(RecordWriter):
    """Rank 0 writes one CSV row per rank per step (``CSV_COLUMNS``); see the module.

    Args:
        path: the file; its directory must exist.
        append: continue an existing file with the same header (steps numbered after its last).
        overwrite: replace an existing file.

    Raises:
        UsageError: as ``JsonlRecords``.
    """

    def __init__(self, path: str | os.PathLike, append: bool = False, *, overwrite: bool = False) -> None:
        super().__init__(per_rank=True)
        self.append, self.overwrite = _file_mode(append, overwrite)
        self.path = Path(path) if _rank_known_nonzero() else _check_path(path, "path", self.append,
                                                                          self.overwrite)
        if not _rank_known_nonzero() and self.append and self.path.is_file() and self.path.stat().st_size:
            _last_csv_step(self.path)  # a file that is not a monitor CSV: refused before training
        self._fh: IO[str] | None = None
        self._csv: Any = None

    def _open(self, header: dict) -> None:
        _check_path(self.path, "path", self.append, self.overwrite)
        self._hosts = header["hosts"]
        old = self.append and self.path.exists() and self.path.stat().st_size > 0
        if old:
            self._offset = _last_csv_step(self.path)
        self._fh = self.path.open("a" if self.append else "w", newline="", encoding="utf-8")
        self._csv = csv.writer(self._fh)
        if not old:
            self._csv.writerow(CSV_COLUMNS)

    def _write(self, record: dict) -> None:
        sig, s = record["signals"], record["summary"]
        for k in range(sig["world"]):
            flags = [f"{f['signal']}/{f['score']}" for f in record["flags"] if f["rank"] == k]
            row = [record["step"], k, self._hosts[k] if k < len(self._hosts) else "", int(k in s["flagged"]),
                   ";".join(flags), record["where"].get(str(k), ""), *(_cell(sig[q][k]) for q in _PER_RANK),
                   sig["kinds"]["cos"], sig["kinds"]["sq_dist"], _cell(record["weights"][k]),
                   *(_cell(record["scores"].get(n, [math.nan] * sig["world"])[k]) for n in SIGNALS),
                   *(_cell(record[c].get(n, [math.nan] * sig["world"])[k]) for n in SIGNALS for c in SCORES),
                   _cell(s["max_score"]), _cell(s["k_eff"]), _cell(s["b_simple"])]
            self._csv.writerow(row)
        self._fh.flush()

    def _close(self) -> None:
        self._fh.close()


def _cell(v: Any) -> Any:
    """A CSV cell: bools as 0/1, floats with repr (nan, inf as Python writes them)."""
    if isinstance(v, bool):
        return int(v)
    return repr(float(v)) if isinstance(v, float) else v


def _last_csv_step(path: Path) -> int:
    try:
        with path.open(newline="", encoding="utf-8") as fh:
            rows = csv.reader(fh)
            if tuple(next(rows, ())) != CSV_COLUMNS:
                raise ValueError("header")
            return max((int(row[0]) for row in rows if row), default=0)
    except (ValueError, IndexError, UnicodeDecodeError) as exc:
        raise UsageError(f"is not a naig monitor CSV ({type(exc).__name__}); pass another path", field="path",
                         value=str(path)) from None


class TensorBoardRecords(RecordWriter):
    """Rank 0 writes scalars with ``torch.utils.tensorboard.SummaryWriter``; see the module.

    Args:
        log_dir: the run's directory (created at the first step; its parent must exist). TensorBoard
            adds an event file per writer, so an existing directory is fine. A rank known not to be
            rank 0 (process group or ``RANK``) checks nothing: it never writes.
        per_rank: add the ``rank{k}/...`` series.

    Raises:
        UsageError: when the tensorboard package is missing (``pip install naig[tensorboard]``), the
            parent of ``log_dir`` does not exist or ``log_dir`` is a file.
    """

    def __init__(self, log_dir: str | os.PathLike, per_rank: bool = False) -> None:
        super().__init__(per_rank)
        p = Path(log_dir) if isinstance(log_dir, str | os.PathLike) and str(log_dir) else None
        if p is not None and _rank_known_nonzero():  # never writes: nothing to check on this rank
            self.log_dir, self._tb, self._writer_cls = p, None, None
            return
        self._writer_cls = _summary_writer()
        if p is None or not p.absolute().parent.is_dir():
            where = p.absolute().parent if p is not None else None
            raise UsageError(f"directory {where} does not exist; create it or pass another log_dir" if where
                             else "must be a directory path", field="log_dir", value=log_dir)
        if p.exists() and not p.is_dir():
            raise UsageError("is a file; pass a directory", field="log_dir", value=str(p))
        self.log_dir, self._tb = p, None

    def _open(self, header: dict) -> None:
        self._tb = self._writer_cls(log_dir=str(self.log_dir))
        self._tb.add_text(f"{PREFIX}header", json.dumps(encode(header)), 0)

    def _write(self, record: dict) -> None:
        step = int(record["step"])
        for key, value in flat_scalars(record, self.per_rank).items():
            if key != f"{PREFIX}step":
                self._tb.add_scalar(key, value, step)

    def _close(self) -> None:
        self._tb.flush()
        self._tb.close()


def _summary_writer() -> type:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise UsageError("TensorBoard records need the tensorboard package: pip install naig[tensorboard]",
                         field="log_dir") from None
    return SummaryWriter


class LoggerRecords(RecordWriter):
    """Rank 0 calls ``fn(dict)`` once per step with flat scalar keys (``flat_scalars``).

    Args:
        fn: any logger's "log a dict" function, e.g. ``wandb.log`` or ``mlflow.log_metrics``.
        per_rank: add the ``rank{k}/...`` keys.

    Raises:
        UsageError: when ``fn`` is not callable.
    """

    def __init__(self, fn: Callable[[dict[str, float]], Any], per_rank: bool = False) -> None:
        super().__init__(per_rank)
        if not callable(fn):
            raise UsageError("must be a function taking a dict", field="fn", value=fn)
        self.fn = fn

    def _open(self, header: dict) -> None:
        pass

    def _write(self, record: dict) -> None:
        self.fn(flat_scalars(record, self.per_rank))


class Records(RecordWriter):
    """Several writers behind one callback: the record is built once and handed to each.

    Args:
        writers: ``RecordWriter``s (each keeps its own ``per_rank``).

    Raises:
        UsageError: no writer, or something that is not a ``RecordWriter``.
    """

    def __init__(self, *writers: RecordWriter) -> None:
        super().__init__()
        bad = [type(w).__name__ for w in writers if not isinstance(w, RecordWriter)]
        if not writers or bad:
            got = f" (got {', '.join(bad)})" if bad else ""
            raise UsageError(f"pass one or more record writers{got}", field="writers")
        self.writers = tuple(writers)

    def attach(self, monitor: Any, *, on_error: str = "warn") -> Any:
        """Install on ``monitor`` (see ``RecordWriter.attach``); the writers share its settings.

        A writer that fails stops alone (``on_error="warn"``): the others go on writing.
        """
        if self.monitor is not None or any(w.monitor is not None for w in self.writers):
            raise UsageError("a writer is already attached to a monitor; make one writer per monitor",
                             field="callback")
        out = super().attach(monitor, on_error=on_error)
        for w in self.writers:
            w.monitor, w.on_error = monitor, self.on_error
        return out

    def _open(self, header: dict) -> None:
        step = self.monitor.decision.step if getattr(self.monitor, "decision", None) is not None else 1
        for w in self.writers:
            w._opened = True
            w._guarded(lambda w=w: w._open(dict(header)), step, record=False)
        self._offset = max((w._offset for w in self.writers), default=0)

    def _write(self, record: dict) -> None:
        for w in self.writers:
            rec = dict(record, step=record["step"] - self._offset + w._offset)
            w._guarded(lambda w=w, rec=rec: w._write(rec), record["step"] - self._offset)

    @property
    def lost(self) -> int:  # type: ignore[override]
        """The most records any one writer lost."""
        return max((w.lost for w in self.writers), default=0)

    @lost.setter
    def lost(self, value: int) -> None:
        pass  # the writers count their own

    def close(self) -> None:
        """Close every writer."""
        for w in self.writers:
            w.close()
        self._closed = True



@dataclass(frozen=True)
class MonitorLog:
    """A monitor record file read back (``read_log``).

    Attributes:
        path: the file.
        format: ``jsonl`` or ``csv``.
        world: K.
        hosts: each rank's host (the last header's; empty strings when unknown).
        steps: (S,) int64 step numbers, in file order.
        scores: signal → (S, K) float64 scores (z/threshold; +inf for a non-finite rank, NaN unscored).
        flagged: (S, K) bool, the ranks the decision named.
        flags: per step, the ``(rank, signal, score)`` of every test that fired.
        where: per step, rank → where its gradient departs most (a bucket and its parameters),
            for the flagged ranks the integration could place.
        k_eff: (S,) float64 K_eff of each step.
        cut: what was cut off the end of the file ("" when nothing): a last line without its end
            (a full disk, a killed writer) is left out and every complete step before it is read.
    """

    path: Path
    format: str
    world: int
    hosts: tuple[str, ...]
    steps: np.ndarray
    scores: dict[str, np.ndarray]
    flagged: np.ndarray
    flags: tuple[tuple[tuple[int, str, str], ...], ...]
    where: tuple[dict[int, str], ...]
    k_eff: np.ndarray
    cut: str = ""

    def rank_rows(self) -> list[dict]:
        """One dict per rank: rank, host, steps, flagged_steps, flags (``signal/score`` → count),
        max_score (signal → max over steps, NaN when never scored), last_flagged (step or None),
        where (at the last flagged step, "" when not placed)."""
        rows = []
        for k in range(self.world):
            counts: dict[str, int] = {}
            for step_flags in self.flags:
                for rank, signal, score in step_flags:
                    if rank == k:
                        key = signal if signal == score == "nonfinite" else f"{signal}/{score}"
                        counts[key] = counts.get(key, 0) + 1
            hit = np.flatnonzero(self.flagged[:, k])
            rows.append({"rank": k, "host": self.hosts[k] if k < len(self.hosts) else "",
                         "steps": int(len(self.steps)), "flagged_steps": int(len(hit)), "flags": counts,
                         "max_score": {s: _nanmax(v[:, k]) for s, v in self.scores.items()},
                         "last_flagged": int(self.steps[hit[-1]]) if len(hit) else None,
                         "where": self.where[hit[-1]].get(k, "") if len(hit) else ""})
        return rows


def _nanmax(x: np.ndarray) -> float:
    x = x[~np.isnan(x)]
    return float(x.max()) if len(x) else math.nan


def read_log(path: str | os.PathLike) -> MonitorLog:
    """Read a monitor JSONL (``JsonlRecords``) or CSV (``CsvRecords``) file, told apart by its first byte.

    A last line cut short (a full disk, a killed writer) is left out and said in ``MonitorLog.cut``;
    every complete step before it is read. Memory is bounded by the file: a header declares at most
    ``MAX_WORLD`` ranks, each step holds its ranks' scores, and a line longer than its ranks need is
    refused before it is read whole.

    Raises:
        DataError: a missing, empty or corrupt file (deep nesting, a step beyond int64, a step without
            a score of a known signal, a line too long included), naming the file and line.
    """
    p = Path(path)
    if not p.is_file():
        raise DataError(f"{p}: {missing_reason(p)}")
    with p.open("rb") as fh:
        first = fh.read(1)
    if not first:
        raise DataError(f"{p}: the file is empty")
    return _read_jsonl(p) if first == b"{" else _read_csv(p)


def _bad(p: Path, line: int, what: str) -> DataError:
    return DataError(f"{p}, line {line}: {what}")


MAX_WORLD = 1 << 17
"""The most ranks a monitor log may declare (``read_log`` refuses more before allocating)."""
_HEADER_BYTES = 1 << 24  # the longest header line read (hosts of MAX_WORLD ranks fit)
_RANK_BYTES = 4096  # a step line may hold this many bytes per rank (the fields of one rank: ~700)
_MAX_STEP = (1 << 63) - 1  # steps are int64


def _line_limit(world: int | None) -> int:
    """The longest line ``read_log`` reads before the next header (bytes)."""
    return _HEADER_BYTES if world is None else max(_HEADER_BYTES, 65536 + _RANK_BYTES * world)


def _cut_note(i: int, raw: bytes, steps: int) -> str:
    return (f"line {i} was cut ({len(raw):,} bytes without an end: a full disk or a killed writer?); "
            f"read the {steps} complete step{'' if steps == 1 else 's'} before it")


def _parse_line(p: Path, i: int, raw: bytes) -> Any:
    """One JSONL line as an object (DataError for deep nesting or invalid UTF-8; ValueError: not JSON)."""
    try:
        return decode(json.loads(raw))
    except RecursionError:
        raise _bad(p, i, "JSON nested too deeply to be a monitor record") from None
    except UnicodeDecodeError as exc:
        if raw.endswith(b"\n"):
            raise DataError(f"{p}: not UTF-8 text ({exc.reason}); is it a monitor record?") from None
        raise


def _read_jsonl(p: Path) -> MonitorLog:
    world, hosts, rows, cut = None, (), [], ""
    with p.open("rb") as fh:
        last = 0
        for i in itertools.count(1):
            limit = _line_limit(world)
            raw = fh.readline(limit + 1)
            if not raw:
                break
            if len(raw) > limit:
                raise _bad(p, i, f"longer than {limit:,} bytes (a monitor record of {world or 'its'} ranks "
                                 "is shorter); is it a monitor record?")
            if not raw.strip():
                continue  # a blank line (e.g. an editor's final newline)
            try:
                obj = _parse_line(p, i, raw)
            except DataError:
                raise
            except ValueError as exc:
                if not raw.endswith(b"\n"):  # the last line, cut: every complete record before it counts
                    cut = _cut_note(i, raw, len(rows))
                    break
                raise _bad(p, i, f"not JSON: {str(exc).splitlines()[0][:80]}") from None
            kind = obj.get("type") if isinstance(obj, dict) else None
            if kind == "header":
                world, hosts = _check_header(p, i, obj, world)
                last = 0  # a new run
            elif kind == "step" and world is not None:
                rows.append(_step_row(p, i, obj, world))
                if rows[-1][0] <= last:
                    raise _bad(p, i, f"step {rows[-1][0]} after step {last}: steps must increase "
                                     "within a run (two runs concatenated without a header, or a "
                                     "repeated line?)")
                last = rows[-1][0]
            else:
                raise _bad(p, i, "expected a naig monitor header first" if world is None
                           else "not a naig monitor header or step")
    if world is None:
        raise DataError(f"{p}: no naig monitor header" + (f" ({cut})" if cut else ""))
    if not rows:
        raise DataError(f"{p}: a monitor header but no step recorded; nothing to report"
                        + (f" ({cut})" if cut else ""))
    return _log(p, "jsonl", world, hosts, rows, cut)


def _check_header(p: Path, i: int, obj: dict, world: int | None) -> tuple[int, tuple[str, ...]]:
    if obj.get("schema") != SCHEMA_VERSION:
        raise _bad(p, i, f"schema {obj.get('schema')!r}; this naig reads schema {SCHEMA_VERSION}")
    k, hosts = obj.get("world"), obj.get("hosts", [])
    if isinstance(k, bool) or not isinstance(k, int) or k < 1 or not isinstance(hosts, list):
        raise _bad(p, i, "a header without a valid world (ranks) or hosts")
    if k > MAX_WORLD or len(hosts) > k:
        raise _bad(p, i, f"a header of world = {k:.4g} ranks with {len(hosts)} hosts; a monitor log has at "
                         f"most {MAX_WORLD:,} ranks and a host per rank")
    if world is not None and k != world:
        raise _bad(p, i, f"a run of {k} ranks appended to one of {world}")
    return k, tuple(str(h) for h in hosts)


def _step_row(p: Path, i: int, obj: dict, world: int) -> tuple:
    """One JSONL step record: every malformed field is a one-line DataError naming it."""
    def field(name: str, parse: Callable[[Any], Any]) -> Any:
        if name not in obj:
            raise _bad(p, i, f"a step record without the field {name!r}")
        try:
            return parse(obj[name])
        except (KeyError, TypeError, ValueError, AttributeError, IndexError):
            raise _bad(p, i, f"a step record whose {name!r} is not valid: {_show(obj[name])}") from None

    step = field("step", _positive_int)
    flagged = field("flagged", lambda v: [_rank(r, world) for r in _list(v)])
    flags = field("flags", lambda v: tuple((_rank(f["rank"], world), str(f["signal"]), str(f["score"]))
                                           for f in _list(v)))
    scores = field("scores", lambda v: {str(s): _score_row(x, world) for s, x in v.items()})
    if not any(s in SIGNALS for s in scores):
        raise _bad(p, i, f"a step record with no score of a known signal ({', '.join(SIGNALS)}); got "
                         f"{_show(sorted(scores))}")
    keff = field("summary", lambda v: float(v["k_eff"]))
    where = {} if "where" not in obj else field(
        "where", lambda v: {_rank(r, world): str(text) for r, text in v.items()})
    return step, flagged, flags, scores, keff, where


def _show(value: object) -> str:
    text = json.dumps(value) if not isinstance(value, float) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _positive_int(v: object) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= _MAX_STEP:
        raise ValueError("not an integer in [1, 2**63)")
    return v


def _list(v: object) -> list:
    if not isinstance(v, list):
        raise TypeError("not a list")
    return v


def _rank(v: object, world: int) -> int:
    r = int(v) if isinstance(v, str) and v.isdigit() else v
    if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < world:
        raise ValueError(f"not a rank in 0..{world - 1}")
    return r


def _score_row(v: object, world: int) -> np.ndarray:
    x = np.asarray(_list(v), dtype=np.float64)
    if x.shape != (world,):
        raise ValueError(f"not {world} scores")
    return x


def _limited_lines(p: Path, fh: IO[str], limit: int, ends: list[bool]) -> Iterator[str]:
    """The lines of ``fh``, each at most ``limit`` characters (DataError beyond); ``ends[0]``: the last
    line read ended with a newline."""
    for i in itertools.count(1):
        line = fh.readline(limit + 1)
        if not line:
            return
        if len(line) > limit:
            raise _bad(p, i, f"longer than {limit:,} characters; is it a monitor record?")
        ends[0] = line.endswith("\n")
        yield line


def _read_csv(p: Path) -> MonitorLog:
    by_step: dict[int, dict] = {}
    hosts: dict[int, str] = {}
    cut = ""
    try:
        with p.open(newline="", encoding="utf-8") as fh:
            ends = [True]
            reader = csv.reader(_limited_lines(p, fh, _HEADER_BYTES, ends))
            head = tuple(next(reader, ()))
            if head != CSV_COLUMNS:
                missing = [c for c in CSV_COLUMNS if c not in head]
                raise _bad(p, 1, f"a monitor CSV header without the column {missing[0]!r}" if missing
                           and len(missing) < len(CSV_COLUMNS) // 2 else
                           "not a naig monitor CSV header (nor JSONL)")
            col = {c: j for j, c in enumerate(CSV_COLUMNS)}
            last = 0
            for row in reader:
                if not row:
                    continue  # a blank line
                if not ends[0] and len(row) != len(CSV_COLUMNS):  # the last line, cut
                    cut = f"line {reader.line_num} was cut ({len(row)} of {len(CSV_COLUMNS)} fields)"
                    break
                last = _csv_row(p, reader.line_num, row, col, by_step, hosts, last)
    except UnicodeDecodeError as exc:
        raise DataError(f"{p}: not UTF-8 text ({exc.reason}); is it a monitor record?") from None
    except csv.Error as exc:
        raise DataError(f"{p}: not CSV ({exc})") from None
    if not by_step:
        raise DataError(f"{p}: a monitor header but no step recorded; nothing to report"
                        + (f" ({cut})" if cut else ""))
    world = max(hosts) + 1
    if cut and len(by_step[last]["ranks"]) < world:  # the cut step's rows before the cut
        del by_step[last]
        cut += f": step {last} is incomplete; read the {len(by_step)} complete steps before it"
    elif cut:
        cut += f"; read the {len(by_step)} complete steps before it"
    if not by_step:
        raise DataError(f"{p}: no complete step recorded ({cut})")
    rows = []
    for step, d in by_step.items():
        if len(d["ranks"]) != world or sorted(d["ranks"]) != list(range(world)):
            shown = sorted(d["ranks"])[:8]
            raise DataError(f"{p}: step {step} has rows for {len(d['ranks'])} ranks ({shown}...), not the "
                            f"{world} of 0..{world - 1}")
        scores = {s: np.array([d["scores"][k][s] for k in range(world)]) for s in SIGNALS}
        rows.append((step, d["flagged"], tuple(d["flags"]), scores, d["k_eff"], d["where"]))
    return _log(p, "csv", world, tuple(hosts[k] for k in range(world)), rows, cut)


def _csv_row(p: Path, line: int, row: list[str], col: dict[str, int], by_step: dict, hosts: dict,
             last: int) -> int:
    """Add one CSV row to ``by_step``; returns its step (steps never go back: one run, or appended runs)."""
    if len(row) != len(CSV_COLUMNS):
        raise _bad(p, line, f"{len(row)} fields, expected {len(CSV_COLUMNS)} (truncated?)")

    def field(name: str, parse: Callable[[str], Any]) -> Any:
        try:
            return parse(row[col[name]])
        except ValueError:
            raise _bad(p, line, f"a row whose {name!r} is not valid: {row[col[name]][:40]!r}") from None

    step = field("step", lambda v: _positive_int(int(v)))
    rank = field("rank", lambda v: _rank(int(v), MAX_WORLD))
    flagged = row[col["flagged"]] == "1"
    scores = {s: field(f"score_{s}", float) for s in SIGNALS}
    keff = field("k_eff", float)
    if step < last:
        raise _bad(p, line, f"step {step} after step {last}: steps must increase (two runs concatenated, or "
                            "rows out of order?)")
    d = by_step.setdefault(step, {"ranks": [], "flagged": [], "flags": [], "scores": {}, "k_eff": keff,
                                  "where": {}})
    if rank in d["ranks"]:
        raise _bad(p, line, f"a second row for step {step}, rank {rank}")
    d["ranks"].append(rank)
    if row[col["where"]]:
        d["where"][rank] = row[col["where"]]
    d["scores"][rank] = scores
    if flagged:
        d["flagged"].append(rank)
    d["flags"] += [(rank, *f.split("/", 1)) if "/" in f else (rank, f, f)
                   for f in row[col["flags"]].split(";") if f]
    hosts[rank] = row[col["host"]]
    return step


def _log(p: Path, fmt: str, world: int, hosts: tuple[str, ...], rows: list[tuple], cut: str = ""
         ) -> MonitorLog:
    names = [s for s in SIGNALS if any(s in r[3] for r in rows)]
    scores = {s: np.array([r[3].get(s, np.full(world, np.nan)) for r in rows]).reshape(len(rows), world)
              for s in names}
    flagged = np.zeros((len(rows), world), dtype=bool)
    for i, r in enumerate(rows):
        flagged[i, r[1]] = True
    return MonitorLog(p, fmt, world, hosts, np.array([r[0] for r in rows], dtype=np.int64), scores, flagged,
                      tuple(r[2] for r in rows), tuple(r[5] for r in rows),
                      np.array([r[4] for r in rows], dtype=np.float64), cut)
