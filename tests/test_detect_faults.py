"""naig.detect.faults: every fault kind changes the gradient by its stated magnitude."""

import math
from collections import deque

import pytest
import torch

from naig.detect.faults import (
    DEFAULT_MAGNITUDES,
    FAULT_KINDS,
    FaultCell,
    apply_gradient_fault,
    catalogue,
    corrupt_batch,
    parse_kinds,
    replaced_rows,
)
from naig.errors import UsageError
from naig.faults import flip_bit16, flip_bit32

N = 40_000


def _grad(seed: int = 0) -> torch.Tensor:
    return torch.randn(N, generator=torch.Generator().manual_seed(seed)) * 1e-3


def _gen(seed: int = 1) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("bit", DEFAULT_MAGNITUDES["bitflip32"])
def test_bitflip32_flips_exactly_that_bit_of_one_element(bit: float) -> None:
    g = _grad()
    bad = apply_gradient_fault(FaultCell("bitflip32", bit), g, _gen())
    diff = torch.nonzero(bad.view(torch.int32) != g.view(torch.int32)).ravel()
    assert len(diff) == 1
    i = int(diff[0])
    xor = int(bad.view(torch.int32)[i]) ^ int(g.view(torch.int32)[i])
    assert xor & 0xFFFFFFFF == 1 << int(bit)


@pytest.mark.parametrize("bit", DEFAULT_MAGNITUDES["bitflip16"])
def test_bitflip16_flips_that_bit_of_the_bfloat16_value(bit: float) -> None:
    g = _grad()
    bad = apply_gradient_fault(FaultCell("bitflip16", bit), g, _gen())
    diff = torch.nonzero(bad != g).ravel()
    assert len(diff) == 1
    i = int(diff[0])
    old = g[i:i + 1].to(torch.bfloat16).view(torch.int16)
    new = bad[i:i + 1].to(torch.bfloat16).view(torch.int16)
    assert (int(old) ^ int(new)) & 0xFFFF == 1 << int(bit)
    assert float(bad[i:i + 1].to(torch.bfloat16).to(torch.float32)) == float(bad[i])  # exactly a bfloat16


def test_bit_helpers_on_known_values() -> None:
    assert flip_bit32(1.0, 31) == -1.0
    assert flip_bit32(1.0, 23) == 0.5  # exponent LSB: 127 -> 126
    assert flip_bit16(1.0, 15) == -1.0
    assert flip_bit16(1.0, 7) == 0.5
    assert flip_bit32(0.0, 30) == 2.0


@pytest.mark.parametrize("s", DEFAULT_MAGNITUDES["scale"])
def test_scale_changes_by_s_minus_one(s: float) -> None:
    g = _grad()
    bad = apply_gradient_fault(FaultCell("scale", s), g, _gen())
    assert torch.equal(bad, g * s)
    rel = float(torch.linalg.vector_norm((bad - g).double()) / torch.linalg.vector_norm(g.double()))
    assert rel == pytest.approx(abs(s - 1), rel=1e-6, abs=1e-7)


@pytest.mark.parametrize("f", DEFAULT_MAGNITUDES["coordflip"])
def test_coordflip_flips_that_fraction_of_coordinates(f: float) -> None:
    g = _grad()
    bad = apply_gradient_fault(FaultCell("coordflip", f), g, _gen())
    flipped = int((bad == -g).sum())
    assert flipped == round(f * N)
    assert int((bad == g).sum()) == N - flipped
    assert torch.equal(bad.abs(), g.abs())


@pytest.mark.parametrize("eps", DEFAULT_MAGNITUDES["noise"])
def test_noise_has_relative_size_eps(eps: float) -> None:
    g = _grad()
    bad = apply_gradient_fault(FaultCell("noise", eps), g, _gen())
    rel = float(torch.linalg.vector_norm((bad - g).double()) / torch.linalg.vector_norm(g.double()))
    assert rel == pytest.approx(eps, rel=0.02)  # chi with N = 40,000 degrees: sd 0.35%


@pytest.mark.parametrize("kind", ["nan", "inf"])
def test_nonfinite_sets_that_many_entries(kind: str) -> None:
    g = _grad()
    for count in (1, 7):
        bad = apply_gradient_fault(FaultCell(kind, count), g, _gen())
        bad_mask = ~torch.isfinite(bad)
        assert int(bad_mask.sum()) == count
        assert torch.equal(bad[~bad_mask], g[~bad_mask])
        assert (torch.isnan(bad[bad_mask]) if kind == "nan" else torch.isposinf(bad[bad_mask])).all()


@pytest.mark.parametrize("eps", DEFAULT_MAGNITUDES["layer"])
def test_layer_noise_confined_to_one_tensor_with_relative_size_eps(eps: float) -> None:
    sizes = [10_000, 20_000, 10_000]
    g = _grad()
    for seed in range(4):
        bad = apply_gradient_fault(FaultCell("layer", eps), g, _gen(seed), sizes)
        parts = list(zip((bad - g).split(sizes), g.split(sizes), strict=True))
        changed = [i for i, (d, _) in enumerate(parts) if bool(d.ne(0).any())]
        assert len(changed) == 1
        d, part = parts[changed[0]]
        rel = float(torch.linalg.vector_norm(d.double()) / torch.linalg.vector_norm(part.double()))
        assert rel == pytest.approx(eps, rel=0.03)


@pytest.mark.parametrize("kind", ["data-random", "data-text"])
def test_data_faults_replace_ceil_rho_b_sequences(kind: str) -> None:
    text = torch.arange(1000) % 251
    x = torch.randint(0, 256, (8, 16), generator=_gen(0))
    y = torch.roll(x, -1, 1)
    for rho in DEFAULT_MAGNITUDES[kind]:
        x2, y2 = corrupt_batch(FaultCell(kind, rho), x, y, text, _gen(2))
        rows = replaced_rows(rho, 8)
        assert rows == math.ceil(rho * 8)
        same = [bool(torch.equal(x2[i], x[i]) and torch.equal(y2[i], y[i])) for i in range(8)]
        assert same == [False] * rows + [True] * (8 - rows)
        assert torch.equal(x2[:rows, 1:], y2[:rows, :-1])  # still next-byte pairs
        if kind == "data-text":  # a window of the text read backwards: consecutive values decrease
            seq = torch.cat([x2[:rows], y2[:rows, -1:]], 1)
            steps = (seq[:, :-1] - seq[:, 1:]) % 251
            assert bool((steps == 1).all())
    assert torch.equal(x, torch.randint(0, 256, (8, 16), generator=_gen(0)))  # the input left alone


def test_stale_gradient_is_taken_at_theta_tau_steps_back() -> None:
    from naig.detect import protocol

    class Fake:
        wl = None

        @staticmethod
        def grad(theta: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return theta.clone()

    past = deque([torch.full((3,), float(t)) for t in range(21)], maxlen=21)  # θ_0 … θ_20 (current)
    for tau in DEFAULT_MAGNITUDES["stale"]:
        cell = FaultCell("stale", tau)
        got = protocol.faulty_grad(Fake(), cell, torch.zeros(3), (None, None), past, _gen())
        assert got.tolist() == [20.0 - tau] * 3


def test_replica_gradient_is_taken_alpha_times_the_initialisation_offset_away() -> None:
    from naig.detect import protocol

    class Fake:
        wl = None

        @staticmethod
        def grad(theta: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return theta.clone()

    past = deque([torch.tensor([1.0, 2.0, 3.0])], maxlen=1)
    offset = torch.tensor([10.0, -20.0, 0.5])
    for alpha in DEFAULT_MAGNITUDES["replica"]:
        got = protocol.faulty_grad(Fake(), FaultCell("replica", alpha), torch.zeros(3), (None, None), past,
                                   _gen(), offset)
        assert torch.allclose(got, past[-1] + alpha * offset, rtol=1e-6)


def test_every_kind_has_magnitudes_and_parses() -> None:
    assert set(DEFAULT_MAGNITUDES) == set(FAULT_KINDS)
    assert parse_kinds("noise,scale") == ("scale", "noise")  # catalogue order
    assert parse_kinds(None) == tuple(k for k in FAULT_KINDS if k != "replica")  # on request only
    assert len(catalogue(FAULT_KINDS)) == sum(len(v) for v in DEFAULT_MAGNITUDES.values())


@pytest.mark.parametrize("bad", ["", "scale,scale", "scale,bogus"])
def test_bad_kinds_refused_naming_faults(bad: str) -> None:
    with pytest.raises(UsageError) as e:
        parse_kinds(bad)
    assert e.value.field == "faults"


@pytest.mark.parametrize("cell", [FaultCell("bitflip32", 32), FaultCell("bitflip16", 1.5),
                                  FaultCell("noise", 0), FaultCell("coordflip", 1.5), FaultCell("nan", 0),
                                  FaultCell("scale", -1), FaultCell("stale", 1)])
def test_bad_magnitudes_or_input_faults_refused(cell: FaultCell) -> None:
    with pytest.raises(UsageError):
        apply_gradient_fault(cell, _grad(), _gen())


def test_signflip_names_the_vocabularys_kind_and_points_to_coordflip() -> None:
    """``signflip`` is −a·g in naig's one vocabulary (naig.faults); the fraction-of-coordinates flip
    naig detect sweeps is ``coordflip``, and asking for signflip says so in one line."""
    with pytest.raises(UsageError, match="coordflip") as e:
        parse_kinds("scale,signflip")
    assert e.value.field == "faults"
