"""Reading a monitor log back (JSONL or CSV) into arrays, bounded in memory, every complete record
kept when the last was cut; see ``naig.monitor.records``."""

from __future__ import annotations

import codecs
import csv
import itertools
import json
import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from naig.errors import DataError
from naig.io import missing_reason
from naig.monitor.detectors import MAX_WORLD, SIGNALS  # MAX_WORLD: read_log refuses more ranks
from naig.monitor.records.schema import CSV_COLUMNS, SCHEMA_VERSION, csv_signals, decode

__all__ = ["MAX_WORLD", "MonitorLog", "read_log"]


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

    def runs(self) -> list[tuple[int, int]]:
        """(first, last) step of each run in the file, in file order: a run resumed from a checkpoint
        and appended (``append=True``) starts again at its resumed step, so the steps go back there.
        An appended run whose steps continue the file's (a fresh monitor: its steps are offset past
        the last) extends the run before it."""
        steps = self.steps.tolist()
        starts = [0, *(i for i in range(1, len(steps)) if steps[i] <= steps[i - 1])]
        return [(steps[a], steps[b - 1]) for a, b in zip(starts, [*starts[1:], len(steps)], strict=True)
                ] if steps else []

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
    """Read a monitor JSONL (``JsonlRecords``) or CSV (``CsvRecords``) file, told apart by its first byte
    (after a UTF-8 byte-order mark, which an editor may have saved it with: it is skipped).

    A last line cut short (a full disk, a killed writer) is left out and said in ``MonitorLog.cut``;
    every complete step before it is read. Memory is bounded by the file: a header declares at most
    ``MAX_WORLD`` ranks, each step holds its ranks' scores, and a line longer than its ranks need is
    refused before it is read whole.

    Raises:
        DataError: a missing, empty or corrupt file (deep nesting, a step beyond int64, a step without
            a score of a known signal, a line too long included), naming the file and line.
    """
    p = Path(path)
    if p.is_dir():  # the folder a run wrote its records into: name the files to pass
        try:
            logs = sorted(q.name for q in p.iterdir() if q.suffix in (".jsonl", ".csv") and q.is_file())
        except OSError:  # an unreadable folder: no names to offer
            logs = []
        hint = f"pass its log, e.g. {p / logs[0]}" if logs else "pass a monitor .jsonl or .csv file"
        raise DataError(f"{p}: is a folder, not a file; {hint}")
    if not p.is_file():
        raise DataError(f"{p}: {missing_reason(p)}")
    with p.open("rb") as fh:
        first = fh.read(len(codecs.BOM_UTF8) + 1).removeprefix(codecs.BOM_UTF8)[:1]
    if not first:
        raise DataError(f"{p}: the file is empty")
    return _read_jsonl(p) if first == b"{" else _read_csv(p)


def _bad(p: Path, line: int, what: str) -> DataError:
    return DataError(f"{p}, line {line}: {what}")


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
            if i == 1:
                raw = raw.removeprefix(codecs.BOM_UTF8)
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
    if obj.get("schema") != SCHEMA_VERSION or isinstance(obj.get("schema"), bool):  # true == 1 in Python
        raise _bad(p, i, f"schema {obj.get('schema')!r}; this naig reads schema {SCHEMA_VERSION}")
    k, hosts = obj.get("world"), obj.get("hosts", [])
    if isinstance(k, bool) or not isinstance(k, int) or k < 1 or not isinstance(hosts, list):
        raise _bad(p, i, "a header without a valid world (ranks) or hosts")
    if k > MAX_WORLD or len(hosts) > k:
        shown = f"{k:.4g}" if k < 10**300 else f"~10^{int(k.bit_length() * 0.30103)}"  # beyond float64
        raise _bad(p, i, f"a header of world = {shown} ranks with {len(hosts)} hosts; a monitor log has at "
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
        except (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError):
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
    values = _list(v)
    if any(isinstance(e, bool) or not isinstance(e, int | float) for e in values):  # true would read as 1
        raise ValueError("a score that is not a number")
    x = np.asarray(values, dtype=np.float64)
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
        with p.open(newline="", encoding="utf-8-sig") as fh:
            ends = [True]
            reader = csv.reader(_limited_lines(p, fh, _HEADER_BYTES, ends))
            head = tuple(next(reader, ()))
            signals = csv_signals(head)  # a log written before a signal existed lacks its columns
            if signals is None:
                missing = [c for c in CSV_COLUMNS if c not in head]
                raise _bad(p, 1, f"a monitor CSV header without the column {missing[0]!r}" if missing
                           and len(missing) < len(CSV_COLUMNS) // 2 else
                           "not a naig monitor CSV header (nor JSONL)")
            col = {c: j for j, c in enumerate(head)}
            last = 0
            for row in reader:
                if not row:
                    continue  # a blank line
                if not ends[0]:  # the last line, cut (the writers end every row with a line break)
                    cut = (f"line {reader.line_num} was cut ({len(row)} of {len(head)} fields, no line "
                           "break at its end: a full disk or a killed writer?)")
                    break
                last = _csv_row(p, reader.line_num, row, col, signals, by_step, hosts, last)
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
        scores = {s: np.array([d["scores"][k][s] for k in range(world)]) for s in d["scores"][0]}
        rows.append((step, d["flagged"], tuple(d["flags"]), scores, d["k_eff"], d["where"]))
    return _log(p, "csv", world, tuple(hosts[k] for k in range(world)), rows, cut)


def _csv_row(p: Path, line: int, row: list[str], col: dict[str, int], signals: tuple[str, ...], by_step: dict,
             hosts: dict, last: int) -> int:
    """Add one CSV row to ``by_step``; returns its step (steps never go back: one run, or appended runs)."""
    if len(row) != len(col):
        raise _bad(p, line, f"{len(row)} fields, expected {len(col)} (truncated?)")

    def field(name: str, parse: Callable[[str], Any]) -> Any:
        try:
            return parse(row[col[name]])
        except ValueError:
            raise _bad(p, line, f"a row whose {name!r} is not valid: {row[col[name]][:40]!r}") from None

    step = field("step", lambda v: _positive_int(int(v)))
    rank = field("rank", lambda v: _rank(int(v), MAX_WORLD))
    flagged = row[col["flagged"]] == "1"
    scores = {s: field(f"score_{s}", float) for s in signals}
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
    _check_table_memory(p, len(rows), world, len(names))
    scores = {s: np.array([r[3].get(s, np.full(world, np.nan)) for r in rows]).reshape(len(rows), world)
              for s in names}
    flagged = np.zeros((len(rows), world), dtype=bool)
    for i, r in enumerate(rows):
        flagged[i, r[1]] = True
    return MonitorLog(p, fmt, world, hosts, np.array([r[0] for r in rows], dtype=np.int64), scores, flagged,
                      tuple(r[2] for r in rows), tuple(r[5] for r in rows),
                      np.array([r[4] for r in rows], dtype=np.float64), cut)


def _check_table_memory(p: Path, steps: int, world: int, signals: int) -> None:
    """Refuse, before building them, tables that would not fit: a float64 score per step, rank and
    signal (a signal missing at a step is filled with NaN) and a flag per step and rank. A log of many
    ranks whose steps hold few signals is small on disk and large here (a hand-made one of 17 MB took
    1.25 GB).

    Raises:
        DataError: naming the file, its steps, ranks and signals, and the memory available.
    """
    from naig.arrivals.engine import available_bytes

    need, free = steps * world * (8 * signals + 1), available_bytes()
    if free is not None and need > free // 2:  # the tables, and the rows parsed so far beside them
        raise DataError(f"{p}: its {steps:,} steps × {world:,} ranks × {signals} signals need "
                        f"{need / 2**30:,.1f} GiB as tables, more than half the {free / 2**30:,.1f} GiB "
                        "available; report a part of the log (its first lines) or use a larger machine")
