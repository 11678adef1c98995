"""Certify the spectrum of the Fano–Fisher metric Ψ_ℓ (docs/design.md §3).

``certify_spectrum`` gathers every check behind ``naig spectrum``: eigenvalues
with multiplicities, rank, max |λ − 8/3|, symmetry, positive semi-definiteness,
the g2 basis checks, the E_max bound on random drifts and, optionally, the
exact rational characteristic polynomial (Theorem 4.1: λ^10 (λ − 8/3)^4).
numpy only: importing this module never imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from naig.energy import e_max, energy
from naig.g2 import derivation_residual, orthonormality_residual
from naig.metric import (
    DEFAULT_LINE,
    E_MAX_FACTOR,
    EXPECTED_CHARPOLY,
    exact_charpoly,
    fano_fisher_metric,
    parse_line,
)
from naig.sketch import splitmix64, splitmix64_array

__all__ = [
    "SCHEMA_VERSION","SpectrumReport", "certify_spectrum", "factor_charpoly", "format_charpoly"]


SCHEMA_VERSION = 1  # of the `naig spectrum --json` document


@dataclass(frozen=True)
class SpectrumReport:
    """Outcome of certifying Ψ_ℓ for one oriented line."""

    line: tuple[int, int, int]  # the oriented Fano line ℓ
    psi: np.ndarray  # (14, 14) float64 metric
    eigenvalues: np.ndarray  # (14,) ascending, float64
    multiplicities: list[tuple[float, int]]  # (eigenvalue, count), ascending, grouped within tol
    rank: int  # number of |λ| > tol
    max_dev: float  # max |λ − 8/3| over the non-zero eigenvalues
    symmetry_residual: float  # max |Ψ − Ψᵀ|
    min_eigenvalue: float  # PSD means ≥ −tol
    orthonormality_residual: float  # max |tr(X_aᵀX_b) − δ_ab|
    derivation_residual: float  # max derivation-law residual over basis × unit pairs
    emax_drifts: int  # random drifts checked against E ≤ (8/3)‖d‖²
    emax_worst_ratio: float  # max E(d) / E_max(d) over them (≤ 1)
    charpoly: list[Fraction] | None  # exact coefficients, low → high (with exact=True)
    tol: float  # tolerance used for every floating-point check
    verified: bool  # every check passed

    def to_dict(self) -> dict:
        """JSON-ready dict (fractions as strings like ``"-32/3"``)."""
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["line"] = list(self.line)
        d["psi"] = self.psi.tolist()
        d["eigenvalues"] = self.eigenvalues.tolist()
        d["multiplicities"] = [{"value": v, "count": c} for v, c in self.multiplicities]
        d["charpoly"] = None if self.charpoly is None else [str(c) for c in self.charpoly]
        d["charpoly_factored"] = None if self.charpoly is None else format_charpoly(self.charpoly)
        return d


def _group(eigs: np.ndarray, tol: float) -> list[tuple[float, int]]:
    groups: list[list[float]] = []
    for lam in eigs:
        if groups and abs(lam - groups[-1][0]) <= tol:
            groups[-1].append(lam)
        else:
            groups.append([lam])
    return [(float(np.mean(g)), len(g)) for g in groups]


def _random_drifts(n: int, seed: int) -> np.ndarray:
    """(n, 14) drifts uniform in [−1, 1)^14 from the splitmix64 stream of ``seed``.

    splitmix64 (already the sketch's hash) keeps numpy.random, and its import
    time, out of ``naig spectrum``.
    """
    counter = np.arange(n * 14, dtype=np.uint64) + np.uint64(splitmix64(seed))
    bits = splitmix64_array(counter) >> np.uint64(11)  # 53 random bits
    return (bits.astype(np.float64) * 2.0**-52 - 1.0).reshape(n, 14)


def _emax_worst(psi: np.ndarray, n: int, seed: int) -> float:
    d = _random_drifts(n, seed)  # (n, 14)
    return float((energy(d, psi) / e_max(d)).max())


def certify_spectrum(
    line: tuple[int, int, int] | str = DEFAULT_LINE,
    tol: float = 1e-12,
    exact: bool = False,
    seed: int = 0,
    n_drifts: int = 1000,
) -> SpectrumReport:
    """Run every check of ``naig spectrum`` for one oriented line.

    Args:
        line: oriented Fano line, e.g. ``(1, 2, 4)`` or ``"1,2,4"``.
        tol: absolute tolerance for the floating-point checks.
        exact: also compute the characteristic polynomial in rational arithmetic.
        seed: seed of the random drifts used for the E_max bound.
        n_drifts: number of random drifts.

    Returns:
        A ``SpectrumReport``; ``verified`` is True iff rank is 4, the four
        non-zero eigenvalues are within ``tol`` of 8/3, Ψ is symmetric and PSD,
        the basis is orthonormal and made of derivations, E ≤ E_max, and (with
        ``exact``) the polynomial equals λ^10 (λ − 8/3)^4.

    Raises:
        UsageError: if ``line`` is not an oriented Fano line.
    """
    line = parse_line(line)
    psi = fano_fisher_metric(line)
    eigs = np.linalg.eigvalsh(psi)  # (14,) ascending
    nonzero = eigs[np.abs(eigs) > tol]
    charpoly = exact_charpoly(line) if exact else None
    report = dict(
        line=line,
        psi=psi,
        eigenvalues=eigs,
        multiplicities=_group(eigs, tol),
        rank=int(nonzero.size),
        max_dev=float(np.abs(nonzero - E_MAX_FACTOR).max()) if nonzero.size else float("inf"),
        symmetry_residual=float(np.abs(psi - psi.T).max()),
        min_eigenvalue=float(eigs[0]),
        orthonormality_residual=orthonormality_residual(),
        derivation_residual=derivation_residual(),
        emax_drifts=n_drifts,
        emax_worst_ratio=_emax_worst(psi, n_drifts, seed),
        charpoly=charpoly,
        tol=tol,
    )
    return SpectrumReport(**report, verified=_all_pass(report))


def _all_pass(r: dict) -> bool:
    tol = r["tol"]
    checks = [
        r["rank"] == 4,
        r["max_dev"] <= tol,
        r["symmetry_residual"] <= tol,
        r["min_eigenvalue"] >= -tol,
        r["orthonormality_residual"] <= tol,
        r["derivation_residual"] <= tol,
        r["emax_worst_ratio"] <= 1.0 + tol,
        r["charpoly"] is None or list(r["charpoly"]) == list(EXPECTED_CHARPOLY),
    ]
    return all(checks)


def factor_charpoly(coeffs: list[Fraction]) -> tuple[int, Fraction, int] | None:
    """Write a polynomial as λ^m (λ − r)^d when it has that form.

    Args:
        coeffs: monic polynomial coefficients, low → high degree.

    Returns:
        ``(m, r, d)`` derived from the coefficients and checked by expanding
        (λ − r)^d exactly, or ``None`` if the polynomial is not of that form.
    """
    m = next(i for i, c in enumerate(coeffs) if c != 0)
    rest = [Fraction(c) for c in coeffs[m:]]
    d = len(rest) - 1
    if d == 0:
        return (m, Fraction(0), 0)
    r = -rest[d - 1] / d
    expanded = [Fraction(1)]
    for _ in range(d):  # multiply by (λ − r)
        expanded = (
            [-r * expanded[0]]
            + [expanded[i - 1] - r * expanded[i] for i in range(1, len(expanded))]
            + [expanded[-1]]
        )
    return (m, r, d) if expanded == rest else None


def _term(c: Fraction, power: int) -> str:
    mag = "" if abs(c) == 1 and power else str(abs(c))
    var = "" if power == 0 else ("λ" if power == 1 else f"λ^{power}")
    return ("− " if c < 0 else "+ ") + (f"{mag} {var}".strip() if mag and var else mag or var)


def format_charpoly(coeffs: list[Fraction]) -> str:
    """Human form: factored as ``λ^10 (λ − 8/3)^4`` when possible, else expanded."""
    f = factor_charpoly(coeffs)
    if f is not None:
        m, r, d = f
        sign = "−" if r >= 0 else "+"
        return f"λ^{m} (λ {sign} {abs(r)})^{d}"
    terms = [_term(c, p) for p, c in reversed(list(enumerate(coeffs))) if c != 0]
    return " ".join(terms).lstrip("+ ")
