"""naig.faults: the one fault vocabulary, and the same name meaning the same gradient everywhere."""

import math
import re

import pytest
import torch

from naig.detect.faults import GRADIENT_KINDS, FaultCell, apply_gradient_fault
from naig.errors import UsageError
from naig.faults import KINDS, apply_fault, arg_problem, corrupted, parse_kind
from naig.simulate.faults import GRADIENT_FAULTS, parse_fault

G = torch.tensor([3.0, -4.0, 0.5, 2.0, -1.0, 0.25, 8.0, -0.125])


def _sent(kind: str, arg: float | None, seed: int = 3) -> torch.Tensor:
    g = G.clone()
    apply_fault(kind, arg, g, torch.Generator().manual_seed(seed))
    return g


def test_each_kind_sends_what_the_table_says() -> None:
    assert torch.equal(_sent("scale", 2.0), 2 * G) and torch.equal(_sent("signflip", 3.0), -3 * G)
    assert torch.equal(_sent("zero", None), torch.zeros(8))
    flipped = _sent("coordflip", 0.5)
    assert int((flipped == -G).sum()) == 4 and torch.equal(flipped.abs(), G.abs())
    assert bool(_sent("nan", None).isnan().all()) and int(_sent("nan", 2.0).isnan().sum()) == 2
    assert int(_sent("inf", 3.0).isinf().sum()) == 3
    rnd = _sent("random", None)
    assert float(rnd.norm()) == pytest.approx(float(G.norm()), rel=1e-6) and not torch.equal(rnd, G)
    assert int((_sent("bitflip32", 31.0) != G).sum()) == 1
    assert int((_sent("bitflip32", 31.0) == -G).sum()) == 1  # the sign bit of one element
    noisy = _sent("noise", 0.1)
    assert 0 < float((noisy - G).norm()) < float(G.norm())
    layer = G.clone()
    apply_fault("layer", 1.0, layer, torch.Generator().manual_seed(0), layout=[4, 4])
    changed = (layer != G).nonzero().flatten().tolist()
    assert changed and (max(changed) < 4 or min(changed) >= 4)  # one tensor of the two


@pytest.mark.parametrize(("kind", "arg", "why"), [
    ("scale", math.inf, "must be finite"), ("coordflip", 0.0, "fraction in (0, 1]"),
    ("noise", -1.0, "finite and >= 0"), ("nan", 1.5, "int >= 1"), ("bitflip16", 16.0, "bit 0..15"),
    ("zero", 1.0, "takes no argument"), ("signflip", None, "needs an argument, e.g. signflip:10"),
    ("layer", 0.0, "finite and > 0"),
])
def test_bad_arguments_are_named_and_never_applied(kind: str, arg: float | None, why: str) -> None:
    assert why in arg_problem(kind, arg)
    g = G.clone()
    with pytest.raises(ValueError, match=kind):
        apply_fault(kind, arg, g, torch.Generator())
    assert torch.equal(g, G)  # refused before anything changed


@pytest.mark.parametrize("kind", sorted(GRADIENT_FAULTS & set(GRADIENT_KINDS)))
def test_simulate_and_detect_send_the_same_gradient_for_a_name(kind: str) -> None:
    """One name, one algorithm: simulate's W:KIND:ARG and detect's cell of that kind and magnitude give
    the same gradient from the same generator seed."""
    arg = {"scale": 2.0, "coordflip": 0.5, "noise": 0.3, "nan": 2.0, "inf": 1.0, "bitflip32": 30.0,
           "bitflip16": 14.0}[kind]
    fault = parse_fault(f"0:{kind}:{arg:g}")
    sim = G.clone()
    fault.apply(sim, torch.Generator().manual_seed(11))
    det = apply_gradient_fault(FaultCell(kind, arg), G, torch.Generator().manual_seed(11))
    assert torch.equal(sim.nan_to_num(7.0), det.nan_to_num(7.0)) and torch.equal(sim.isnan(), det.isnan())


def test_every_kind_is_in_simulate_or_detect() -> None:
    assert set(KINDS) == GRADIENT_FAULTS | set(GRADIENT_KINDS)  # each kind is run by a tool


@pytest.mark.parametrize(("text", "why"), [
    ("nope", "unknown fault kind; use one of scale,"), ("scale", "scale needs an argument, e.g. scale:10"),
    ("scale:x", "is not a number"), ("coordflip:2", "fraction in (0, 1]"), ("zero:1", "takes no argument"),
])
def test_a_kind_text_is_parsed_or_refused_naming_the_option(text: str, why: str) -> None:
    with pytest.raises(UsageError, match=re.escape(why)) as info:
        parse_kind(text, field="--fault")
    assert str(info.value).startswith(f"--fault={text!r}: ")


def test_a_kind_outside_those_accepted_is_refused() -> None:
    assert parse_kind(" signflip:1 ") == ("signflip", 1.0) and parse_kind("nan") == ("nan", None)
    with pytest.raises(UsageError, match="use one of nan, scale"):
        parse_kind("coordflip:0.5", ("nan", "scale"))


def test_a_corrupted_copy_keeps_shape_and_dtype_and_leaves_the_gradient_alone() -> None:
    grad = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    before = grad.clone()
    bad = corrupted(grad, "nan", 1.0, torch.Generator().manual_seed(0))
    assert bad.shape == grad.shape and bad.dtype == grad.dtype and int(bad.isnan().sum()) == 1
    assert torch.equal(grad, before)
    flat = before.reshape(-1).clone()
    apply_fault("signflip", 2.0, flat, torch.Generator())
    assert torch.equal(corrupted(grad, "signflip", 2.0, torch.Generator()), flat.view(3, 4))
