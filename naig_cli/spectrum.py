"""``naig spectrum``: certify the spectrum of the Fano–Fisher metric Ψ_ℓ (docs/design.md §3)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from naig.errors import UsageError
from naig.metric import E_MAX_FACTOR, parse_line
from naig.octonion import oriented_lines
from naig.spectrum import SCHEMA_VERSION, SpectrumReport, certify_spectrum, format_charpoly
from naig_cli._common import JsonOpt, LineOpt, handle_errors, print_json, stdout

__all__ = ["spectrum"]


@handle_errors
def spectrum(
    ctx: typer.Context,
    line: LineOpt = "1,2,4",
    all_lines: Annotated[bool, typer.Option("--all-lines", help="Check all 21 oriented lines.")] = False,
    exact: Annotated[bool, typer.Option(
        "--exact", help="Also certify the characteristic polynomial in exact rationals.")] = False,
    tol: Annotated[float, typer.Option(
        "--tol", help="Absolute tolerance of float checks, in [0, 4/3).")] = 1e-12,
    json_out: JsonOpt = False,
) -> None:
    """Certify that Ψ has rank 4 with all non-zero eigenvalues 8/3 (Theorem 4.1)."""
    line_given = ctx.get_parameter_source("line").name == "COMMANDLINE"
    _check_options(line_given, all_lines, tol)
    lines = oriented_lines() if all_lines else [parse_line(line)]
    reports = [certify_spectrum(ln, tol=tol, exact=exact) for ln in lines]
    ok = all(r.verified for r in reports)
    if json_out:
        docs = [r.to_dict() for r in reports]
        doc = {"verified": ok, "lines": docs} if all_lines else docs[0]
        print_json({"schema_version": SCHEMA_VERSION, **doc})
    elif all_lines:
        _render_all(reports)
    else:
        _render_one(reports[0])
    if not ok:
        raise typer.Exit(1)


def _check_options(line_given: bool, all_lines: bool, tol: float) -> None:
    if line_given and all_lines:
        raise UsageError("--line and --all-lines exclude each other; pass one of them")
    if not 0 <= tol < E_MAX_FACTOR / 2:  # also rejects NaN
        raise UsageError("must lie in [0, 4/3): half the gap between 0 and 8/3, e.g. 1e-12",
                         field="tol", value=tol)


def _eig_label(value: float, tol: float) -> str:
    if abs(value - E_MAX_FACTOR) <= tol:
        return "8/3"
    return "0" if abs(value) <= tol else f"{value:.16g}"


def _mark(ok: bool) -> str:
    return "[green]ok[/]" if ok else "[red]FAIL[/]"


def _render_one(r: SpectrumReport) -> None:
    t = Table(title=f"Fano–Fisher metric Ψ for line ℓ = {r.line}", show_header=True)
    t.add_column("check")
    t.add_column("value", justify="right")
    t.add_column("", justify="center")
    for value, count in reversed(r.multiplicities):
        t.add_row("eigenvalue × multiplicity", f"{_eig_label(value, r.tol)} × {count}", "")
    t.add_row("rank", str(r.rank), _mark(r.rank == 4))
    t.add_row("max |λ − 8/3| (non-zero λ)", f"{r.max_dev:.2e}", _mark(r.max_dev <= r.tol))
    t.add_row("symmetry max |Ψ − Ψᵀ|", f"{r.symmetry_residual:.2e}", _mark(r.symmetry_residual <= r.tol))
    t.add_row("PSD: min λ", f"{r.min_eigenvalue:.2e}", _mark(r.min_eigenvalue >= -r.tol))
    t.add_row(
        "g2 basis orthonormality",
        f"{r.orthonormality_residual:.2e}",
        _mark(r.orthonormality_residual <= r.tol),
    )
    t.add_row(
        "g2 basis derivations",
        f"{r.derivation_residual:.2e}",
        _mark(r.derivation_residual <= r.tol),
    )
    t.add_row(
        f"E ≤ (8/3)‖d‖² on {r.emax_drifts} random drifts",
        f"max E/E_max = {r.emax_worst_ratio:.6f}",
        _mark(r.emax_worst_ratio <= 1 + r.tol),
    )
    if r.charpoly is not None:
        t.add_row("det(λI − Ψ), exact rationals", format_charpoly(r.charpoly), _mark(r.verified))
    stdout.print(t)
    stdout.print(
        f"tolerance {r.tol:g}: " + ("[bold green]verified[/]" if r.verified else "[bold red]NOT verified[/]")
    )


def _render_all(reports: list[SpectrumReport]) -> None:
    t = Table(title="Fano–Fisher metric Ψ on all 21 oriented lines")
    for col in ("line", "rank", "eigenvalues", "max |λ − 8/3|", "char. poly", "status"):
        t.add_column(col)
    for r in reports:
        eigs = ", ".join(f"{_eig_label(v, r.tol)}×{c}" for v, c in reversed(r.multiplicities))
        poly = format_charpoly(r.charpoly) if r.charpoly is not None else "—"
        t.add_row(
            ",".join(map(str, r.line)),
            str(r.rank),
            eigs,
            f"{r.max_dev:.1e}",
            poly,
            "verified" if r.verified else "[red]FAIL[/]",
        )
    stdout.print(t)
    n = sum(r.verified for r in reports)
    stdout.print(
        f"{n}/{len(reports)} lines "
        + ("[bold green]verified[/]" if n == len(reports) else "[bold red]NOT verified[/]")
    )
