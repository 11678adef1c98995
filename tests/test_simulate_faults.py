"""Injected faults: parsing, errors, and what each faulty worker sends (naig.simulate.faults)."""

import math

import pytest
import torch

from naig.errors import UsageError
from naig.faults import KINDS
from naig.simulate.faults import (
    FAULT_KINDS,
    Fault,
    apply_faults,
    check_faults,
    faulty_workers,
    parse_fault,
    parse_faults,
)

G = torch.tensor([[3.0, 4.0, 0.0, 0.0], [1.0, -1.0, 2.0, 0.5], [0.0, 0.0, 0.0, 2.0]])


def _apply(texts: list[str], step: int = 0, seed: int = 0, grads: torch.Tensor = G) -> torch.Tensor:
    g = grads.clone()
    apply_faults(parse_faults(texts), g, torch.tensor([0, 1, 2]), step, torch.Generator().manual_seed(seed))
    return g


def test_parse_every_form() -> None:
    assert parse_fault("1:signflip:10") == Fault(1, "signflip", 10.0, 0)
    assert parse_fault(" 0:NaN@50 ") == Fault(0, "nan", None, 50)
    assert parse_fault("3:scale:-0.5@7") == Fault(3, "scale", -0.5, 7)
    assert parse_fault("2:noise:1e-1") == Fault(2, "noise", 0.1, 0)
    assert parse_fault("2:random") == Fault(2, "random")
    assert parse_faults("1:zero") == (Fault(1, "zero"),)
    needs = {k for k, kind in KINDS.items() if kind.needs_arg}
    assert [f.kind for f in parse_faults([f"0:{k}" + (":1" if k in needs else "")
                                          for k in FAULT_KINDS])] == list(FAULT_KINDS)
    assert parse_fault("1:nan:3@2") == Fault(1, "nan", 3.0, 2) and parse_fault("0:bitflip32:30").arg == 30


@pytest.mark.parametrize("text,words", [
    ("1", "use W:KIND[:ARG][@STEP]"),
    ("x:zero", "the worker W must be an int >= 0"),
    ("-1:zero", "the worker W must be an int >= 0"),
    ("1:flip:3", "unknown fault kind 'flip'"),
    ("1:signflip", "signflip needs an argument, e.g. 1:signflip:10"),
    ("1:zero:3", "zero takes no argument"),
    ("1:scale:big", "the argument of scale must be a number"),
    ("1:scale:inf", "must be finite"),
    ("1:noise:-1", "must be finite and >= 0"),
    ("1:nan@soon", "STEP must be an int >= 0"),
    ("1:nan@-2", "STEP must be an int >= 0"),
])
def test_malformed_faults_are_one_line_usage_errors(text: str, words: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_fault(text)
    assert words in str(info.value) and info.value.field == "faults" and info.value.value == text
    assert "\n" not in str(info.value)


def test_a_fault_on_a_missing_worker_is_refused() -> None:
    check_faults(parse_faults(["3:zero"]), workers=4)
    with pytest.raises(UsageError, match="worker 4 does not exist; the 4 workers are 0..3") as info:
        check_faults(parse_faults(["1:zero", "4:nan@3"]), workers=4)
    assert info.value.field == "faults"


def test_signflip_scale_zero_nan() -> None:
    g = _apply(["0:signflip:10", "1:zero", "2:scale:0.5"])
    assert g[0].tolist() == [-30.0, -40.0, 0.0, 0.0]
    assert g[1].tolist() == [0.0] * 4 and g[2].tolist() == [0.0, 0.0, 0.0, 1.0]
    assert torch.isnan(_apply(["1:nan"])[1]).all() and torch.equal(_apply(["1:nan"])[0], G[0])


def test_faults_start_at_their_step_and_compose_in_order() -> None:
    assert torch.equal(_apply(["0:signflip:2@5"], step=4), G)
    assert _apply(["0:signflip:2@5"], step=5)[0].tolist() == [-6.0, -8.0, 0.0, 0.0]
    assert _apply(["0:scale:2", "0:signflip:3"])[0].tolist() == [-18.0, -24.0, 0.0, 0.0]
    touched = apply_faults(parse_faults(["2:zero@1", "0:zero@3"]), G.clone(), torch.tensor([2, 0, 1]), 2,
                           torch.Generator())
    assert touched.tolist() == [True, False, False]  # rows follow `workers`, not row order


def test_random_keeps_the_norm_and_changes_the_direction() -> None:
    g = _apply(["0:random"], seed=1)
    assert float(g[0].norm()) == pytest.approx(5.0, rel=1e-6)
    assert float(torch.dot(g[0], G[0])) / 25.0 < 0.999
    assert torch.equal(_apply(["0:random"], seed=1), g)  # same generator state, same draw
    assert not torch.equal(_apply(["0:random"], seed=2), g)


def test_noise_has_variance_sigma_squared_norm_squared_over_n() -> None:
    n = 200_000
    grads = torch.zeros(1, n, dtype=torch.float64)
    grads[0, :4] = torch.tensor([3.0, 4.0, 0.0, 0.0])
    g = grads.clone()
    apply_faults(parse_faults(["0:noise:2"]), g, torch.tensor([0]), 0, torch.Generator().manual_seed(0))
    eps = g - grads
    # per-coordinate variance σ²‖g‖²/n = 4·25/n; its sample estimate has relative std √(2/n) ≈ 0.3%
    assert float(eps.var()) * n / 100.0 == pytest.approx(1.0, abs=0.02)
    assert abs(float(eps.mean())) < 5 * math.sqrt(100.0 / n / n)


def test_faulty_workers_are_listed_once() -> None:
    assert faulty_workers(parse_faults(["3:zero", "1:nan", "3:random"])) == (1, 3)


def test_a_comma_list_says_one_fault_per_option() -> None:
    with pytest.raises(UsageError, match="one fault per `faults`") as info:
        parse_fault("1:signflip:10,2:zero")
    assert info.value.field == "faults"


def test_the_vocabulary_kinds_act_as_naig_faults_defines_them() -> None:
    """Kinds simulate gained from naig.faults: coordflip flips round(f·n) signs, nan:c / inf:c put c
    non-finite entries (nan alone: every entry), bitflip32:31 flips one element's sign bit."""
    g = _apply(["1:coordflip:0.5", "2:inf:1", "0:bitflip32:31"])
    assert int((g[1] == -G[1]).sum()) == 2 and int((g[1] == G[1]).sum()) == 2
    assert int(torch.isinf(g[2]).sum()) == 1
    assert torch.equal(g[0].abs(), G[0].abs())  # one sign bit flipped (of 0.0: -0.0, which compares equal)
    assert int(torch.signbit(g[0]).sum()) == 1
    assert bool(torch.isnan(_apply(["1:nan"])[1]).all())
    assert int(torch.isnan(_apply(["1:nan:2"])[1]).sum()) == 2


@pytest.mark.parametrize("text,words", [
    ("1:coordflip:1.5", "the argument of coordflip must be a fraction in (0, 1]"),
    ("1:nan:0.5", "the argument of nan must be an int >= 1"),
    ("1:bitflip16:16", "the argument of bitflip16 must be a bit 0..15"),
    ("1:layer:1", "layer is naig's noise in one parameter tensor, and a simulated gradient is one flat"),
])
def test_vocabulary_arguments_are_checked_as_naig_faults_checks_them(text: str, words: str) -> None:
    with pytest.raises(UsageError, match=words.replace("(", r"\(").replace(")", r"\)").replace("]", r"\]")):
        check_faults(parse_faults([text]), workers=4)


def test_a_fault_given_twice_is_refused() -> None:
    """`--faults 1:scale:10 --faults 1:scale:10` ran, applying the fault twice (×100); strategies given
    twice were already refused."""
    with pytest.raises(UsageError, match="given twice") as err:
        parse_faults(["1:scale:10", "2:nan", "1:scale:10@0"])
    assert err.value.value == "1:scale:10@0"
    assert len(parse_faults(["1:scale:10", "1:scale:10@5"])) == 2  # another start: another fault
