"""certify_spectrum and the charpoly factoring (docs/design.md §3)."""

import subprocess
import sys
from fractions import Fraction

import pytest

from naig.octonion import oriented_lines
from naig.spectrum import certify_spectrum, factor_charpoly, format_charpoly


def test_default_line_verifies():
    r = certify_spectrum()
    assert r.verified and r.rank == 4 and r.line == (1, 2, 4)
    assert [c for _, c in r.multiplicities] == [10, 4]
    assert r.multiplicities[1][0] == pytest.approx(8 / 3, abs=1e-13)
    assert r.max_dev <= 1e-14 and r.emax_worst_ratio <= 1.0


def test_exact_all_lines():
    for line in oriented_lines():
        r = certify_spectrum(line, exact=True)
        assert r.verified and format_charpoly(r.charpoly) == "λ^10 (λ − 8/3)^4"


def test_zero_tolerance_fails_verification():
    # the float checks are real: with tol 0 the rounding in eigvalsh makes them fail
    assert not certify_spectrum(tol=0.0).verified


def test_factor_charpoly_derives_the_form():
    assert factor_charpoly([Fraction(0), Fraction(-2), Fraction(1)]) == (1, Fraction(2), 1)
    assert factor_charpoly([Fraction(1), Fraction(0), Fraction(1)]) is None
    assert format_charpoly([Fraction(1), Fraction(0), Fraction(1)]) == "λ^2 + 1"


def test_spectrum_module_does_not_import_torch():
    code = "import naig_cli.main, naig.spectrum, sys; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
