"""``naig audit REF FILE...``: score worker gradient/checkpoint files against a reference.

The library side is ``naig.audit`` (docs/design.md §6).
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer
from rich import box
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table

from naig.errors import DataError, UsageError
from naig.io import METADATA_KEYS
from naig_cli._common import (
    BetaOpt,
    JsonOpt,
    LineOpt,
    flag,
    fmt_num,
    handle_errors,
    kernel_notice,
    opt,
    print_json,
    printable,
    progress,
    stdout,
)

__all__ = ["audit", "SYMBOLS"]

SYMBOLS = """**Columns**: cos, the cosine of the worker's gradient with the reference's (exact); ‖Δ‖, the
distance between them; E ± spread, the Fano–Fisher energy dᵀΨd of the sketched drift d (mean ±
spread over --sketches); ρ, the relative friction E/((8/3)‖d‖²), 0 to 1 (0: d in Ψ's null space,
1: along its ridge); π, the Gibbs weight exp(−βE) / Σ exp(−βE); verdict: frozen when π < 0.01/K,
else integrated; K_eff = 1/Σπ², the workers the weights effectively use. More: README, Words and
symbols; docs/audit.md.
"""

_MIN_CHUNK_MB = 0.0625  # 64 KiB: smaller chunks only add per-chunk overhead
_MAX_CHUNK_MB = 65536  # 64 GiB of float32 per batch: beyond any machine's memory, and 1e308 overflowed int()
_COLUMNS = [
    "file",
    "lag",
    "step",
    "worker",
    "cos",
    "delta_norm",
    "energy",
    "energy_spread",
    "energy_std",
    "friction",
    "pi",
    "verdict",
    "sketch_ratio",
    "nonfinite_tensor",
]


@handle_errors
def audit(
    ref: Annotated[Path, typer.Argument(
        help="Reference the workers are scored against: a .safetensors file (gradient or checkpoint), "
             "or a sharded checkpoint (its *.safetensors.index.json, or the folder holding it).",
        show_default=False, metavar="REF")],
    files: Annotated[list[Path], typer.Argument(
        help="Workers: .safetensors files, sharded checkpoints (index file or its folder), or folders "
             "of files (every *.safetensors inside, sorted; sub-folders with --recursive).",
        show_default=False, metavar="FILES...")],
    beta: BetaOpt = "auto",
    seed: Annotated[int, opt("--seed", "Sketch seed (uint64).", min=0, max=2**64 - 1)] = 0,
    line: LineOpt = "1,2,4",
    keys: Annotated[str | None, opt("--keys", "Regex: audit only matching tensor names.")] = None,
    intersect: Annotated[bool, opt("--intersect", "Use common tensors on mismatch.")] = False,
    recursive: Annotated[bool, opt("--recursive", "Also audit the files in sub-folders.")] = False,
    sketches: Annotated[int, opt("--sketches", "R sketch seeds, at most 1024: E as mean ± std.", min=1)] = 1,
    chunk_mb: Annotated[float, opt("--chunk-mb", "Streaming batch size in MiB (0.0625 to 65536).")] = 16.0,
    threads: Annotated[int | None, opt("--threads", "Files scored in parallel (default: all cores).",
                                       min=1, show_default=False)] = None,
    json_out: JsonOpt = False,
    csv_path: Annotated[Path | None, opt("--csv", "Also write the per-file table as CSV; - prints it "
                                         "instead of the table.")] = None,
) -> None:
    """Stream REF and FILEs, sketch them into g2 and score each worker's drift."""
    from naig.audit import AuditConfig, run_audit

    if not math.isfinite(chunk_mb) or not _MIN_CHUNK_MB <= chunk_mb <= _MAX_CHUNK_MB:
        raise UsageError(f"must be a number in [{_MIN_CHUNK_MB}, {_MAX_CHUNK_MB}], e.g. 16", field="chunk",
                         value=chunk_mb)
    if json_out and str(csv_path) == "-":
        raise UsageError("standard output already carries --json; name a file such as audit.csv",
                         field="csv", value="-")
    _check_csv_target(csv_path, [ref, *files])
    config = AuditConfig(beta=beta, seed=seed, line=line, keys=keys, intersect=intersect,
                         sketches=sketches, chunk=int(chunk_mb * 2**20) // 4, recursive=recursive,
                         **({} if threads is None else {"threads": threads}))
    with progress("auditing", None, bytes_=True) as advance:
        result = run_audit(ref, files, config, progress=_noting_the_kernel(advance))
    for note in result.warnings:
        sys.stderr.write(f"warning: {printable(note)}\n")
    doc = printable(result.to_dict())  # file names with undecodable bytes: \xff
    doc["skipped_tensors"] = {flag(k): v for k, v in doc["skipped_tensors"].items()}  # "keys" → "--keys"
    if str(csv_path) == "-":
        _print_csv(doc["files"])
        return
    if csv_path is not None:
        _write_csv(csv_path, doc["files"])
    if json_out:
        print_json(doc)
    else:
        _render(result, doc["files"])


def _noting_the_kernel(advance: Callable[[int], None]) -> Callable[[int], None]:
    """``advance``, which first warns (once) when the C kernel is missing: at the first bytes read,
    so that inputs refused before any work get their one error line and nothing else."""
    noted = False

    def first_then_advance(n: int = 1) -> None:
        nonlocal noted
        if not noted:
            noted = True
            notice = kernel_notice()
            if notice:
                sys.stderr.write(f"warning: {notice}\n")
        advance(n)

    return first_then_advance


def _check_csv_target(csv_path: Path | None, inputs: list[Path]) -> None:
    """Refuse, before any work, a --csv path that cannot or must not be written."""
    if csv_path is None or str(csv_path) == "-":
        return
    problem = None
    if str(csv_path) in ("", ".") or csv_path.is_dir():
        problem = "is a directory; name a file such as audit.csv"
    elif csv_path.is_symlink() or (csv_path.exists() and not csv_path.is_file()):
        problem = "is a link or a special file; name a regular file such as audit.csv"
    elif csv_path.name.lower().endswith((".safetensors", ".safetensors.index.json")):
        problem = "names a safetensors file or a checkpoint index (what audit reads); name a file such as " \
                  "audit.csv"
    elif any(p.exists() and csv_path.exists() and os.path.samefile(p, csv_path) for p in inputs):
        problem = "would overwrite an input; choose another path"
    elif not csv_path.absolute().parent.is_dir():
        problem = f"cannot be written: directory {csv_path.absolute().parent} does not exist"
    else:
        problem = _unwritable(csv_path.absolute().parent)
    if problem:
        raise UsageError(problem, field="csv", value=str(csv_path))


def _unwritable(folder: Path) -> str | None:
    """Why no file can be made in ``folder`` (a probe file made and removed), or None."""
    import tempfile

    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".naig-csv-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
        return f"cannot be written in {folder} ({why}); choose a folder you can write"
    return None


def _csv_cell(v: object) -> object:
    """Non-finite numbers become empty cells, as they become null in --json."""
    return "" if isinstance(v, float) and not math.isfinite(v) else v


def _csv_rows(fh, rows: list[dict], end: str = "\r\n") -> None:  # noqa: ANN001
    import csv

    writer = csv.DictWriter(fh, fieldnames=_COLUMNS, extrasaction="ignore", lineterminator=end)
    writer.writeheader()
    writer.writerows({k: _csv_cell(v) for k, v in r.items()} for r in rows)


def _print_csv(rows: list[dict]) -> None:
    """``--csv -``: the CSV on standard output, in place of the table (lines end in \\n, as a
    pipe expects; a file written with --csv keeps the RFC 4180 \\r\\n)."""
    _csv_rows(sys.stdout, rows, end="\n")
    sys.stdout.flush()


def _write_csv(path: Path, rows: list[dict]) -> None:
    from naig.io import temp_beside

    tmp = None
    try:
        fd, tmp = temp_beside(path, ".csv.tmp")
        with os.fdopen(fd, "w", newline="") as fh:
            _csv_rows(fh, rows)
        os.replace(tmp, path)  # atomic: a reader never sees half a file
    except OSError as exc:  # the folder became unwritable, or the disk filled: name --csv, not the temp file
        raise DataError(f"could not be written ({exc.strerror or type(exc).__name__}); nothing was written",
                        field="csv", value=str(path)) from None
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)


_STYLE = {"integrated": "green", "frozen": "yellow", "non-finite": "red"}
_BIG = 1e6  # larger magnitudes are shown as 1.234e+30, so a huge gradient cannot widen the table
_FILE_MIN = 10  # the file column folds (never cuts) its names, down to this width
_DROP = ("worker", "step", "ρ", "lag", "‖Δ‖", "cos")  # left out in this order when the table is too wide
_INDEX = ".safetensors.index.json"


def _display_name(file: str) -> str:
    """A file's row label: its stem; a sharded checkpoint as folder/stem of its index."""
    p = Path(file)
    if p.name.endswith(_INDEX):
        return f"{p.parent.name}/{p.name.removesuffix(_INDEX)}"
    return p.name.removesuffix(".safetensors")


def _energy_cell(r: dict) -> str:
    """E ± its analytic spread over sketch seeds (the spread of the mean when R sketches are averaged)."""
    e = fmt_num(r["energy"], ".2f", big=_BIG)
    spread = r.get("energy_spread")
    return e if spread is None else f"{e} ± {fmt_num(spread, '.2f', big=_BIG)}"


def _row_names(files: list[str]) -> list[str]:
    """Row labels: file stems; where two stems collide (``--recursive``), paths below the common folder."""
    names = [_display_name(f) for f in files]
    if len(set(names)) == len(names):
        return names
    base = Path(os.path.commonpath([str(Path(f).parent) for f in files]))
    return [_display_name(f) if Path(f).parent == base else
            f"{Path(f).parent.relative_to(base).as_posix()}/{_display_name(f)}" for f in files]


def _rank_notice(result) -> str | None:  # noqa: ANN001
    """One line when some workers' E ± spread overlap: another --seed may reorder them."""
    pairs = result.rank_overlaps()
    if not pairs:
        return None
    i, j = pairs[0]
    a, b = (_display_name(printable(str(result.files[k].path))) for k in (i, j))
    return (f"note: ranking by E not stable under sketch noise: {len(pairs)} pair(s) overlap within "
            f"E ± spread (e.g. {a}, {b}); --sketches R divides the spread by √R")


def _title(result, rows: list[dict]) -> tuple[str, list[str]]:  # noqa: ANN001
    """The title, with metadata that every file carries with one value; the varying keys become columns."""
    values = {k: [r[k] for r in rows] for k in METADATA_KEYS}
    constant = {k: v[0] for k, v in values.items() if len(rows) > 1 and v[0] is not None and len(set(v)) == 1}
    shown = [k for k, v in values.items() if k not in constant and any(x is not None for x in v)]
    same = "".join(f", {k} {v} for all" for k, v in constant.items())
    return f"naig audit — reference {_display_name(printable(str(result.reference)))}{same}", shown


def _columns(result, rows: list[dict]) -> tuple[str, dict[str, list[str]]]:  # noqa: ANN001
    """The title and each column's plain-text cells (metadata, scores, verdict), in table order."""
    title, meta = _title(result, rows)
    cols = {k: [str(r[k]) if r[k] is not None else "—" for r in rows] for k in meta}
    cols["cos"] = [fmt_num(r["cos"], ".6f") for r in rows]
    cols["‖Δ‖"] = [fmt_num(r["delta_norm"], ".4g") for r in rows]
    cols["E ± spread"] = [_energy_cell(r) for r in rows]
    cols["ρ"] = [fmt_num(r["friction"], ".3f") for r in rows]
    cols["π"] = [fmt_num(r["pi"], ".4f") for r in rows]
    cols["verdict"] = [r["verdict"] for r in rows]
    return title, cols


def _table(title: str, cols: dict[str, list[str]], names: list[str], keys: list[str]) -> Table:
    """The table of the ``keys`` columns next to a file column that folds (never cuts) long names."""
    t = Table(title=escape(title), box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True,
              show_edge=False)
    t.add_column("file", overflow="fold", min_width=min(_FILE_MIN, max(map(len, names))))
    for k in keys:
        t.add_column(k, justify="left" if k == "verdict" else "right", no_wrap=True,
                     min_width=max(map(len, [k, *cols[k]])))
    for i in range(len(names)):
        cells = [escape(cols[k][i]) for k in keys]  # names and metadata are user data: no markup
        if keys and keys[-1] == "verdict":
            cells[-1] = f"[{_STYLE[cols['verdict'][i]]}]{cells[-1]}[/]"
        t.add_row(escape(names[i]), *cells)
    return t


def _needed(cols: dict[str, list[str]], names: list[str], keys: list[str]) -> int:
    """Columns the table needs with every cell whole and file names folded to ``_FILE_MIN``."""
    table = _table("", cols, [n[:_FILE_MIN] for n in names], keys)
    return Measurement.get(stdout, stdout.options.update(width=10_000), table).maximum


def _fit(cols: dict[str, list[str]], names: list[str], width: int) -> tuple[list[str], list[str], int]:
    """Leave out columns (in ``_DROP`` order, then the spread of E) until every cell fits whole
    next to the folded file column.

    Returns the columns kept, those left out and the width the table needs: more than
    ``width`` only when file, E, π and verdict alone do not fit (the terminal then wraps).
    """
    keys, dropped = list(cols), []
    for k in (*_DROP, "E ± spread"):
        if _needed(cols, names, keys) <= width:
            break
        if k == "E ± spread":  # E stays, without its spread
            cols["E"] = [c.split(" ± ")[0] for c in cols[k]]
            keys[keys.index(k)] = "E"
            dropped.append("spread of E")
        elif k in keys:
            keys.remove(k)
            dropped.append(k)
    return keys, dropped, _needed(cols, names, keys)


def _render(result, rows: list[dict]) -> None:  # noqa: ANN001
    title, cols = _columns(result, rows)
    names = _row_names([r["file"] for r in rows])
    keys, dropped, needed = _fit(cols, names, stdout.width)
    width = stdout.width
    stdout.width = max(width, needed)  # too narrow even for file, E, π, verdict: the terminal wraps
    try:
        stdout.print(_table(title, cols, names, keys))
    finally:
        stdout.width = width
    if dropped:
        stdout.print(f"left out to fit {stdout.width} columns: {', '.join(dropped)} (--json has them all)",
                     markup=False)
    for line in _pack(_footer(result), stdout.width):
        stdout.print(line, markup=False, no_wrap=True, overflow="ignore", crop=False)
    notice = _rank_notice(result)
    if notice:
        stdout.print(notice, markup=False)


def _pack(items: list[str], width: int, sep: str = "   ") -> list[str]:
    """Lay footer items out in lines of at most ``width`` characters, never splitting an item."""
    lines: list[str] = []
    for item in items:
        if lines and len(lines[-1]) + len(sep) + len(item) <= width:
            lines[-1] += sep + item
        else:
            lines.append(item)
    return lines


def _p_value(p: float | None) -> str:
    return "—" if p is None else f"{p:.2g}" if p >= 0.001 else "< 0.001"


def _lag_items(doc: dict | None) -> list[str]:
    """Footer items: does E (and ‖Δ‖) rank the files by staleness?"""
    if doc is None:
        return []
    how = "exact" if doc["exact"] else f"{doc['permutations']} permutations"
    items = [f"{label} vs lag: Spearman r = {fmt_num(c['spearman'], '+.2f')} (p = {_p_value(c['p_value'])})"
             for label, c in (("E", doc["energy"]), ("‖Δ‖", doc["delta_norm"]))]
    return [*items, f"(permutation test, {how}, {doc['files']} files)"]


def _footer(result) -> list[str]:  # noqa: ANN001
    cfg = result.config
    skipped = ", ".join(f"{v} {flag(k)}" for k, v in result.skipped.items() if v) or "none"
    return [
        f"β = {result.beta:.6g} ({'auto' if cfg.beta == 'auto' else 'fixed'})",
        f"K_eff = {result.k_eff:.3f} of {len(result.files)}",
        f"n = {result.n:,}",
        f"compression n/14 = {result.compression:,.0f}×",
        f"line = {cfg.line}",
        f"seed = {cfg.seed}",
        f"read {result.bytes_read / 2**20:,.1f} MiB in {result.seconds:.2f} s "
        f"({result.throughput / 2**20:,.0f} MiB/s)",
        f"tensors skipped: {skipped}",
        *_lag_items(result.lag_correlation),
    ]
