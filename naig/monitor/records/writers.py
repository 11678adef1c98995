"""The record writers (JSONL, CSV, TensorBoard, any logger, several at once), written by rank 0 of
the monitor's group; see ``naig.monitor.records``."""

from __future__ import annotations

import codecs
import csv
import json
import math
import os
import warnings
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from naig.errors import DataError, NaigError, UsageError
from naig.monitor.detectors import SCORES, SIGNALS, Decision
from naig.monitor.records.schema import (
    _PER_RANK,
    CSV_COLUMNS,
    PREFIX,
    SCHEMA_VERSION,
    csv_signals,
    encode,
    flat_scalars,
    step_record,
)

if TYPE_CHECKING:
    from naig.monitor.signals import RankSignals

__all__ = ["ON_ERROR", "CsvRecords", "JsonlRecords", "LoggerRecords", "Records", "RecordWriter",
           "TensorBoardRecords"]

ON_ERROR = ("warn", "raise")
"""What a failed write does (``RecordWriter.attach``): warn and go on (default), or raise."""


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
        self._offset, self._first = 0, 1

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
            UsageError: when this writer is already attached (it would write every step twice), for
                an ``on_error`` outside ``ON_ERROR``, or a ``monitor`` that is not one.
        """
        if on_error not in ON_ERROR:
            raise UsageError(f"must be one of {', '.join(ON_ERROR)}", field="on_error", value=on_error)
        if self.monitor is not None:
            raise UsageError("is already attached to a monitor; make one writer per monitor",
                             field="callback")
        if not callable(getattr(monitor, "add_writer", None)):
            raise UsageError(f"got {type(monitor).__name__}; pass the naig.monitor.Monitor to write the "
                             "records of", field="monitor")
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
            self._opened, self._first = True, decision.step
            self._guarded(lambda: self._open(self._header(decision)), decision.step, record=False)
        record = step_record(sig, decision, offset=self._offset)
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
        first = (str(exc).strip().splitlines() or [""])[0]
        if not isinstance(exc, NaigError):  # a library's message may be long; naig's own say the fix last
            first = first[:200]
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
        """Flush and close (idempotent), and leave the monitor (``Monitor.remove_writer``: it goes on
        deciding, and another writer may be attached); after a write failure, warn once with the
        records lost."""
        self._leave()
        if self._opened and not self._closed and self.failure is None:
            self._close()
        if self.failure is not None and not self._closed:
            warnings.warn(f"naig.monitor: {self._describe()} lost {self.lost} record"
                          f"{'' if self.lost == 1 else 's'} after {self.failure}", RuntimeWarning,
                          stacklevel=2)
        self._closed = True

    def _leave(self) -> None:
        remove = getattr(self.monitor, "remove_writer", None)
        if remove is not None:
            remove(self)

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

    def _continued(self, last: int, *, rewinds: bool) -> int:
        """The offset of this run's step numbers in a file whose last step is ``last``.

        A fresh monitor (its first step is 1) continues the file: offset ``last``. A monitor resumed
        from a checkpoint (``Monitor.load_state_dict``; its first step is the checkpoint's + 1) writes
        its own steps, which are training's: offset 0. When the file holds steps from the resumed
        step on (the run went on past its checkpoint, then crashed), those belong to a timeline the
        checkpoint does not hold: a format that reads each run after its header (``rewinds``, JSONL)
        gets this run's steps again from the resumed step, said in one warning; one that cannot
        (CSV: steps never go back) is refused.

        Raises:
            UsageError: a CSV that holds steps from the resumed step on (naming both steps).
        """
        first = self._first
        if first == 1:
            return last
        if last >= first:
            what = (f"holds steps up to {last}, past the checkpoint this monitor resumed from (step "
                    f"{first - 1}): steps {first}..{last} are of a run the checkpoint does not hold")
            if not rewinds:
                raise UsageError(f"a CSV cannot hold two runs' steps {first}..{last}: it {what}; pass "
                                 "overwrite=True, another path, or a JSONL", field="path",
                                 value=str(self.path))
            warnings.warn(f"naig.monitor: {self.path} {what}; this run writes its own from step {first} on, "
                          "after a new header (read_log reads both runs)", stacklevel=4)
        return 0

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


def _holds_records(p: Path) -> bool:
    """``p`` is a file with something in it: not missing, not empty, not a UTF-8 byte-order mark alone
    (which ``read_log`` reads as an empty file)."""
    try:
        if not p.is_file():
            return False
        size = p.stat().st_size
        return size > len(codecs.BOM_UTF8) or (size > 0 and p.read_bytes() != codecs.BOM_UTF8)
    except OSError:
        return False


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
    if not append and not overwrite and _holds_records(p):
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


_WRITING: weakref.WeakValueDictionary[str, _FileRecords] = weakref.WeakValueDictionary()
"""The file writers of this process by real path, until closed (or collected): one file, one writer."""


class _FileRecords(RecordWriter):
    """A writer to one file (JSONL, CSV): the path checked on construction (rank 0), and with
    ``append`` an existing file read first (``_check_existing``: one of this writer's kind)."""

    def __init__(self, path: str | os.PathLike, append: bool = False, *, overwrite: bool = False) -> None:
        super().__init__(per_rank=True)
        self.append, self.overwrite = _file_mode(append, overwrite)
        self.path = Path(path) if _rank_known_nonzero() else _check_path(path, "path", self.append,
                                                                          self.overwrite)
        if not _rank_known_nonzero() and self.append and self.path.is_file() and _holds_records(self.path):
            self._check_existing()
        self._fh: IO[str] | None = None
        self._key = os.path.realpath(self.path)
        other = _WRITING.get(self._key)
        if other is not None and not other._closed:  # both would write it, one line over the other
            raise UsageError(f"{other._describe()} writes this file already (until it is closed); give each "
                             "writer its own path", field="path", value=str(path))
        _WRITING[self._key] = self

    def close(self) -> None:
        """As ``RecordWriter.close``; the path is then free for another writer of this process."""
        super().close()
        if _WRITING.get(self._key) is self:
            del _WRITING[self._key]

    @abstractmethod
    def _check_existing(self) -> None:
        """Refuse (``UsageError``) an existing file at ``path`` this writer cannot append to."""


class JsonlRecords(_FileRecords):
    """Rank 0 writes one JSON object per line (a header, then one per step); see the module.

    Args:
        path: the file; its directory must exist.
        append: continue an existing file of this schema (steps numbered after its last).
        overwrite: replace an existing file (e.g. the one a crashed run left).

    Raises:
        UsageError: a missing directory, a directory, an existing file without ``append`` or
            ``overwrite``, both of them, or (with ``append``) a file that is not a naig monitor
            JSONL, or whose last line has no line break (a run cut mid-line), naming the line
            (checked on rank 0 when made, and for the rank count at the first step).
    """

    def _check_existing(self) -> None:
        _last_jsonl_step(self.path, None)  # a file that is not a monitor JSONL: refused before training

    def _open(self, header: dict) -> None:
        _check_path(self.path, "path", self.append, self.overwrite)
        if self.append and _holds_records(self.path):
            self._offset = self._continued(_last_jsonl_step(self.path, header["world"]), rewinds=True)
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
    last, seen, number = 0, False, 0
    try:
        with path.open(encoding="utf-8-sig") as fh:
            for line in fh:
                number += 1  # named in the error
                line = line.removeprefix("\ufeff")  # a byte-order mark within: read_log reads it too
                if not line.endswith("\n"):
                    raise ValueError("no line break at its end (a run cut mid-line?)")
                if not line.strip():
                    continue  # a blank line: read_log skips it too
                obj = json.loads(line)
                if obj.get("type") == "header":
                    if obj.get("schema") != SCHEMA_VERSION or world not in (None, obj.get("world")):
                        raise ValueError("header")
                    seen = True
                elif obj.get("type") == "step":
                    last = max(last, int(obj["step"]))
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError, RecursionError,
            OverflowError) as exc:
        ranks = "" if world is None else f" and {world} ranks"
        if isinstance(exc, UnicodeDecodeError):  # raised reading the next line, before it was counted
            number, why = number + 1, f"not UTF-8 text ({exc.reason})"
        else:
            why = str(exc).splitlines()[0][:120] if isinstance(exc, ValueError) else type(exc).__name__
        raise UsageError(f"is not a naig monitor JSONL of schema {SCHEMA_VERSION}{ranks} to append to "
                         f"(line {number}: {why}); pass another path, or overwrite=True", field="path",
                         value=str(path)) from None
    if not seen:
        raise UsageError("has no naig monitor header; pass another path", field="path", value=str(path))
    if last:
        _readable(path)
    return last


def _readable(path: Path) -> None:
    """Refuse (``UsageError``) to append to a log ``read_log`` refuses: the file would stay unreadable
    (a repeated line, a step that is not a whole number >= 1, a malformed field)."""
    from naig.monitor.records.reader import read_log

    try:
        read_log(path)
    except DataError as exc:
        why = str(exc).removeprefix(f"{path}: ")[:200]
        raise UsageError(f"cannot be appended to: read_log refuses it ({why}); pass another path, or "
                         "overwrite=True", field="path", value=str(path)) from None


class CsvRecords(_FileRecords):
    """Rank 0 writes one CSV row per rank per step (``CSV_COLUMNS``); see the module.

    Args:
        path: the file; its directory must exist.
        append: continue an existing file with the same header (steps numbered after its last).
        overwrite: replace an existing file.

    Raises:
        UsageError: as ``JsonlRecords``; with ``append``, also a file whose last line has no line break
            (a run cut mid-row) or a malformed row, naming the line. A file of another rank count is
            found at the first step: this writer then writes nothing (``on_error``, see ``attach``).
    """

    def _check_existing(self) -> None:
        _last_csv_step(self.path)  # a file that is not a monitor CSV: refused before training
        self._csv: Any = None

    def _open(self, header: dict) -> None:
        _check_path(self.path, "path", self.append, self.overwrite)
        self._hosts = header["hosts"]
        old = self.append and _holds_records(self.path)
        self._columns = CSV_COLUMNS
        if old:  # continued with the file's own header (one written before a signal existed has fewer)
            last, self._columns, ranks = _last_csv_step(self.path)
            self._offset = self._continued(last, rewinds=False)
            if last and ranks != header["world"]:  # (read_log refuses a file of two rank counts)
                raise UsageError(f"its last step has rows for {ranks} ranks (a run of {ranks} ranks, or a "
                                 f"step cut short by a crash), this run has {header['world']}; pass another "
                                 "path", field="path", value=str(self.path))
            missing = [s for s in SIGNALS if s not in (csv_signals(self._columns) or ())]
            if missing:
                names = ", ".join(missing)
                warnings.warn(f"naig.monitor: {self.path} was written before the signal(s) {names} existed: "
                              "the rows appended keep its columns, without their scores (the flags column "
                              "still names them); write to a new file to record them", stacklevel=2)
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
            if self._columns != CSV_COLUMNS:
                cells = dict(zip(CSV_COLUMNS, row, strict=True))
                row = [cells[c] for c in self._columns]
            self._csv.writerow(row)
        self._fh.flush()

    def _close(self) -> None:
        self._fh.close()


def _cell(v: Any) -> Any:
    """A CSV cell: bools as 0/1, floats with repr (nan, inf as Python writes them)."""
    if isinstance(v, bool):
        return int(v)
    return repr(float(v)) if isinstance(v, float) else v


def _last_csv_step(path: Path) -> tuple[int, tuple[str, ...], int]:
    """The last step of a monitor CSV, its header (``CSV_COLUMNS``, or fewer signals' columns) and the
    number of rank rows of that step, read one row at a time.

    Raises:
        UsageError: not a monitor CSV, naming the first line that is not one: another header, a row
            with another number of fields, a step or rank that is not an integer >= 1 (>= 0 for a rank),
            steps that go back, or a last line without its line break (a run cut mid-row: appending
            would join the next row to it).
    """
    line = 1
    try:
        with path.open(newline="", encoding="utf-8-sig") as fh:
            rows = csv.reader(fh)
            head = tuple(next(rows, ()))
            if csv_signals(head) is None:
                raise ValueError("not a monitor header")
            last, ranks = 0, 0
            for row in rows:
                line = rows.line_num
                if not row:
                    continue
                if len(row) != len(head):
                    raise ValueError(f"{len(row)} fields, expected {len(head)}")
                step, rank = int(row[0]), int(row[1])
                place = ranks if step == last else 0  # each step's rows are ranks 0, 1, ... in order
                if step < 1 or step < last or step > 2**62 or rank != place:
                    raise ValueError(f"step {row[0]}, rank {row[1]} after step {last} (expected rank "
                                     f"{place})")
                last, ranks = step, place + 1
        with path.open("rb") as fh:
            fh.seek(-1, os.SEEK_END)
            if fh.read(1) != b"\n":
                line = rows.line_num
                raise ValueError("no line break at its end (a run cut mid-row?); end the file with one "
                                 "or pass overwrite=True")
    except (ValueError, IndexError, UnicodeDecodeError, csv.Error) as exc:
        raise UsageError(f"is not a naig monitor CSV to append to (line {line}: {exc}); pass another path",
                         field="path", value=str(path)) from None
    return last, head, ranks


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
            w._opened, w._first = True, self._first  # a resumed monitor's first step: each writer's offset
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
        """Close every writer and leave the monitor."""
        self._leave()
        for w in self.writers:
            w.close()
        self._closed = True
