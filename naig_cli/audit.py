"""``naig audit REF FILE...``: score worker gradient/checkpoint files against a reference.

The library side is ``naig.audit`` (docs/design.md §6).
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich import box
from rich.markup import escape
from rich.table import Table

from naig.errors import UsageError
from naig_cli._common import (
    BetaOpt,
    JsonOpt,
    LineOpt,
    flag,
    fmt_num,
    handle_errors,
    opt,
    print_json,
    progress,
    stdout,
)

__all__ = ["audit"]

_MIN_CHUNK_MB = 0.0625  # 64 KiB: smaller chunks only add per-chunk overhead
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
        help="Reference .safetensors file (gradient or checkpoint) the workers are scored against.",
        show_default=False)],
    files: Annotated[list[Path], typer.Argument(
        help="Worker .safetensors files, or directories (every *.safetensors inside, sorted).",
        show_default=False)],
    beta: BetaOpt = "auto",
    seed: Annotated[int, opt("--seed", "Sketch seed (uint64).", min=0, max=2**64 - 1)] = 0,
    line: LineOpt = "1,2,4",
    keys: Annotated[str | None, opt("--keys", "Regex: audit only matching tensor names.")] = None,
    intersect: Annotated[bool, opt("--intersect", "Use common tensors on mismatch.")] = False,
    sketches: Annotated[int, opt("--sketches", "R sketch seeds: E as mean ± std.", min=1)] = 1,
    chunk_mb: Annotated[float, opt("--chunk-mb", "Streaming batch size in MiB (>= 0.0625).")] = 16.0,
    threads: Annotated[int | None, opt("--threads", "Files scored in parallel (default: all cores).",
                                       min=1, show_default=False)] = None,
    json_out: JsonOpt = False,
    csv_path: Annotated[Path | None, opt("--csv", "Also write the per-file table as CSV.")] = None,
) -> None:
    """Stream REF and FILEs, sketch them into g2 and score each worker's drift."""
    from naig.audit import AuditConfig, run_audit

    if not math.isfinite(chunk_mb) or chunk_mb < _MIN_CHUNK_MB:
        raise UsageError(f"must be a finite number >= {_MIN_CHUNK_MB}, e.g. 16", field="chunk",
                         value=chunk_mb)
    _check_csv_target(csv_path, [ref, *files])
    config = AuditConfig(beta=beta, seed=seed, line=line, keys=keys, intersect=intersect,
                         sketches=sketches, chunk=int(chunk_mb * 2**20) // 4,
                         **({} if threads is None else {"threads": threads}))
    with progress("auditing", None, bytes_=True) as advance:
        result = run_audit(ref, files, config, progress=advance)
    for note in result.warnings:
        sys.stderr.write(f"warning: {note}\n")
    doc = result.to_dict()
    doc["skipped_tensors"] = {flag(k): v for k, v in doc["skipped_tensors"].items()}  # "keys" → "--keys"
    if csv_path is not None:
        _write_csv(csv_path, doc["files"])
    if json_out:
        print_json(doc)
    else:
        _render(result, doc["files"])


def _check_csv_target(csv_path: Path | None, inputs: list[Path]) -> None:
    """Refuse, before any work, a --csv path that cannot or must not be written."""
    if csv_path is None:
        return
    problem = None
    if str(csv_path) in ("", ".") or csv_path.is_dir():
        problem = "is a directory; name a file such as audit.csv"
    elif csv_path.is_symlink() or (csv_path.exists() and not csv_path.is_file()):
        problem = "is a link or a special file; name a regular file such as audit.csv"
    elif csv_path.suffix.lower() == ".safetensors" or any(
        p.exists() and csv_path.exists() and os.path.samefile(p, csv_path) for p in inputs
    ):
        problem = "would overwrite an input; choose another path"
    elif not csv_path.absolute().parent.is_dir():
        problem = f"cannot be written: directory {csv_path.absolute().parent} does not exist"
    if problem:
        raise UsageError(problem, field="csv", value=str(csv_path))


def _csv_cell(v: object) -> object:
    """Non-finite numbers become empty cells, as they become null in --json."""
    return "" if isinstance(v, float) and not math.isfinite(v) else v


def _write_csv(path: Path, rows: list[dict]) -> None:
    import csv
    import tempfile

    fd, tmp = tempfile.mkstemp(dir=path.absolute().parent, suffix=".csv.tmp")
    try:
        with os.fdopen(fd, "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=_COLUMNS, extrasaction="ignore")
            writer.writeheader()
            writer.writerows({k: _csv_cell(v) for k, v in r.items()} for r in rows)
        os.replace(tmp, path)  # atomic: a reader never sees half a file
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


_STYLE = {"integrated": "green", "frozen": "yellow", "non-finite": "red"}


def _energy_cell(r: dict) -> str:
    """E ± its analytic spread over sketch seeds (the spread of the mean when R sketches are averaged)."""
    spread = r["energy_spread"]
    return fmt_num(r["energy"], ".2f") + ("" if spread is None else f" ± {spread:.2f}")


def _rank_notice(result) -> str | None:  # noqa: ANN001
    """One line when some workers' E ± spread overlap: another --seed may reorder them."""
    pairs = result.rank_overlaps()
    if not pairs:
        return None
    i, j = pairs[0]
    a, b = (Path(result.files[k].path).name.removesuffix(".safetensors") for k in (i, j))
    return (f"note: ranking by E not stable under sketch noise: {len(pairs)} pair(s) overlap within "
            f"E ± spread (e.g. {a}, {b}); --sketches R divides the spread by √R")


def _render(result, rows: list[dict]) -> None:  # noqa: ANN001
    values = {k: {r[k] for r in rows} - {None} for k in ("lag", "step", "worker")}
    meta = [k for k, v in values.items() if len(v) > 1 or (len(v) == 1 and len(rows) == 1)]
    same = "".join(f", {k} {next(iter(v))} for all" for k, v in values.items() if k not in meta and v)
    title = escape(f"naig audit — reference {result.reference.name}{same}")  # names are user data
    t = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    t.add_column("file", no_wrap=True, overflow="ellipsis", min_width=12)
    for col in [*meta, "cos", "‖Δ‖", "E ± spread", "ρ", "π"]:
        t.add_column(col, justify="right", no_wrap=True)
    t.add_column("verdict", no_wrap=True, min_width=10)
    for r in rows:
        name = escape(Path(r["file"]).name.removesuffix(".safetensors"))
        cells = [escape(str(r[k])) if r[k] is not None else "—" for k in meta]
        t.add_row(
            name,
            *cells,
            fmt_num(r["cos"], ".6f"),
            fmt_num(r["delta_norm"], ".4g"),
            _energy_cell(r),
            fmt_num(r["friction"], ".3f"),
            fmt_num(r["pi"], ".4f"),
            f"[{_STYLE[r['verdict']]}]{r['verdict']}[/]",
        )
    stdout.print(t)
    stdout.print(_footer(result))
    notice = _rank_notice(result)
    if notice:
        stdout.print(escape(notice), soft_wrap=True)


def _footer(result) -> str:  # noqa: ANN001
    cfg = result.config
    skipped = ", ".join(f"{v} {flag(k)}" for k, v in result.skipped.items() if v) or "none"
    return (
        f"β = {result.beta:.6g} ({'auto' if cfg.beta == 'auto' else 'fixed'})   "
        f"K_eff = {result.k_eff:.3f} of {len(result.files)}   n = {result.n:,}   "
        f"compression n/14 = {result.compression:,.0f}×   line = {cfg.line}   seed = {cfg.seed}\n"
        f"read {result.bytes_read / 2**20:,.1f} MiB in {result.seconds:.2f} s "
        f"({result.throughput / 2**20:,.0f} MiB/s)   tensors skipped: {skipped}"
    )
