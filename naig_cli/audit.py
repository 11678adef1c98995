"""``naig audit REF FILE...``: score worker gradient/checkpoint files against a reference (SPEC §3.2)."""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

import typer
from rich import box
from rich.markup import escape
from rich.table import Table

from naig.errors import UsageError
from naig_cli._common import fmt_num, handle_errors, print_json, stderr, stdout

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
    "energy_std",
    "friction",
    "pi",
    "verdict",
    "sketch_ratio",
    "nonfinite_tensor",
]


@handle_errors
def audit(
    ref: Path = typer.Argument(..., help="Reference .safetensors file (gradient or checkpoint)."),
    files: list[Path] = typer.Argument(..., help="Worker .safetensors files or directories."),
    beta: str = typer.Option("auto", "--beta", help="Inverse temperature β >= 0, or 'auto'."),
    seed: int = typer.Option(0, "--seed", min=0, max=2**64 - 1, help="Sketch seed (uint64)."),
    line: str = typer.Option("1,2,4", "--line", help="Oriented Fano line I,J,K of Ψ."),
    keys: str = typer.Option(None, "--keys", help="Regex: audit only matching tensor names."),
    intersect: bool = typer.Option(False, "--intersect", help="Use common tensors on mismatch."),
    sketches: int = typer.Option(1, "--sketches", min=1, help="R sketch seeds: E as mean ± std."),
    chunk_mb: float = typer.Option(16.0, "--chunk-mb", help="Streaming batch size in MiB (>= 0.0625)."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON document on stdout."),
    csv_path: Path = typer.Option(None, "--csv", help="Also write the per-file table as CSV."),
) -> None:
    """Stream REF and FILEs, sketch them into g2 and score each worker's drift."""
    from naig.audit import AuditConfig, run_audit
    from naig.gibbs import parse_beta
    from naig.metric import parse_line

    if not math.isfinite(chunk_mb) or chunk_mb < _MIN_CHUNK_MB:
        raise UsageError(f"--chunk-mb {chunk_mb} must be a finite number >= {_MIN_CHUNK_MB}, e.g. 16")
    _check_csv_target(csv_path, [ref, *files])
    config = AuditConfig(
        beta=parse_beta(beta),
        seed=seed,
        line=parse_line(line),
        keys=keys,
        intersect=intersect,
        sketches=sketches,
        chunk=int(chunk_mb * 2**20) // 4,
    )
    result = _run_with_progress(run_audit, ref, files, config)
    for note in result.warnings:
        sys.stderr.write(f"warning: {note}\n")
    rows = _rows(result)
    if csv_path is not None:
        _write_csv(csv_path, rows)
    if json_out:
        print_json(_document(result, rows))
    else:
        _render(result, rows)


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
        raise UsageError(f"--csv {str(csv_path)!r} {problem}")


def _run_with_progress(run, ref, files, config):  # noqa: ANN001, ANN202
    if not sys.stderr.isatty():
        return run(ref, files, config)
    from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

    cols = (
        "[progress.description]{task.description}",
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
    )
    with Progress(*cols, console=stderr, transient=True) as bar:
        task = bar.add_task("auditing", total=None)
        return run(ref, files, config, progress=lambda n: bar.advance(task, n))


def _rows(result) -> list[dict]:  # noqa: ANN001
    return [
        {
            "file": str(f.path),
            "lag": f.meta("lag"),
            "step": f.meta("step"),
            "worker": f.meta("worker"),
            "cos": f.cos,
            "delta_norm": f.delta_norm,
            "energy": f.energy,
            "energy_std": f.energy_std,
            "friction": f.friction,
            "pi": f.pi,
            "verdict": f.verdict,
            "sketch_ratio": f.sketch_ratio,
            "nonfinite_tensor": f.nonfinite_tensor,
            "drift": f.drift,
        }
        for f in result.files
    ]


def _document(result, rows: list[dict]) -> dict:  # noqa: ANN001
    cfg = result.config
    return {
        "reference": str(result.reference),
        "reference_metadata": result.reference_metadata,
        "files": rows,
        "beta": result.beta,
        "beta_option": cfg.beta,
        "k_eff": result.k_eff,
        "n": result.n,
        "compression": result.compression,
        "bytes_read": result.bytes_read,
        "seconds": result.seconds,
        "throughput_bytes_per_s": result.throughput,
        "skipped_tensors": result.skipped,
        "line": list(cfg.line),
        "seed": cfg.seed,
        "sketches": cfg.sketches,
        "warnings": result.warnings,
    }


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


def _energy_cell(r: dict, multi: bool) -> str:
    spread = f" ± {r['energy_std']:.2f}" if multi and r["energy_std"] is not None else ""
    return fmt_num(r["energy"], ".2f") + spread


def _render(result, rows: list[dict]) -> None:  # noqa: ANN001
    multi = result.config.sketches > 1
    values = {k: {r[k] for r in rows} - {None} for k in ("lag", "step", "worker")}
    meta = [k for k, v in values.items() if len(v) > 1 or (len(v) == 1 and len(rows) == 1)]
    same = "".join(f", {k} {next(iter(v))} for all" for k, v in values.items() if k not in meta and v)
    title = escape(f"naig audit — reference {result.reference.name}{same}")  # names are user data
    t = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    t.add_column("file", no_wrap=True, overflow="ellipsis", min_width=12)
    for col in [*meta, "cos", "‖Δ‖", "E ± std" if multi else "E", "ρ", "π"]:
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
            _energy_cell(r, multi),
            fmt_num(r["friction"], ".3f"),
            fmt_num(r["pi"], ".4f"),
            f"[{_STYLE[r['verdict']]}]{r['verdict']}[/]",
        )
    stdout.print(t)
    stdout.print(_footer(result))


def _footer(result) -> str:  # noqa: ANN001
    cfg = result.config
    skipped = ", ".join(f"{v} {k}" for k, v in result.skipped.items() if v) or "none"
    return (
        f"β = {result.beta:.6g} ({'auto' if cfg.beta == 'auto' else 'fixed'})   "
        f"K_eff = {result.k_eff:.3f} of {len(result.files)}   n = {result.n:,}   "
        f"compression n/14 = {result.compression:,.0f}×   line = {cfg.line}   seed = {cfg.seed}\n"
        f"read {result.bytes_read / 2**20:,.1f} MiB in {result.seconds:.2f} s "
        f"({result.throughput / 2**20:,.0f} MiB/s)   tensors skipped: {skipped}"
    )
