"""The fault catalogue of ``naig detect``: what a bad rank sends instead of its clean gradient.

Each fault kind has one magnitude, swept from invisible to obvious (``DEFAULT_MAGNITUDES``).
Gradient faults are naig's one fault vocabulary (``naig.faults``: the same names and meanings
as ``naig simulate --faults``), applied to a copy of the rank's clean gradient g (n,) float32; input faults
(``stale``, ``data-random``, ``data-text``) change what the gradient is computed from and
are computed by the protocol (``naig.detect.protocol``) with ``corrupt_batch``.

==============  ===========================  ==================================================
kind            magnitude                    what the faulty rank sends
==============  ===========================  ==================================================
``bitflip32``   bit b ∈ 0..31                g with bit b of one random float32 element flipped
                                             (31 sign, 30..23 exponent, 22..0 mantissa)
``bitflip16``   bit b ∈ 0..15                g with one random element rounded to bfloat16 and
                                             bit b of it flipped (15 sign, 14..7 exponent,
                                             6..0 mantissa)
``scale``       s ≥ 0                        s·g (s = 0: a zero gradient)
``coordflip``   fraction f ∈ (0, 1]          g with the sign of a random f·n coordinates
                                             flipped (f = 1: −g; ‖Δ‖² = 4 Σ_flipped g_i²)
``noise``       ε > 0                        g + ε‖g‖ z/√n, z ~ N(0, I) (E‖Δ‖ ≈ ε‖g‖)
``nan``         count c ≥ 1                  g with c random entries NaN
``inf``         count c ≥ 1                  g with c random entries +inf
``layer``       ε > 0                        noise of relative size ε confined to one random
                                             parameter tensor L: g_L + ε‖g_L‖ z/√n_L
``stale``       τ ≥ 1 steps                  ∇L(θ_{t−τ}; its own current batch)
``data-random`` fraction ρ ∈ (0, 1]          the gradient of its batch with ⌈ρB⌉ sequences
                                             replaced by uniform random bytes
``data-text``   fraction ρ ∈ (0, 1]          ... replaced by another text: windows of the
                                             training text read backwards
``replica``     α > 0                        ∇L(θ_t + α(θ₀′ − θ₀); its own batch): a replica
                                             whose parameters are off by α times the difference
                                             of two initialisations (θ₀′ another seed's)
==============  ===========================  ==================================================

``replica`` is the DiLoCo fault of a replica with a different initialisation, in its simplest
form: with one local SGD step (H = 1) the pseudo-gradient θ − θ_local is the learning rate times
the gradient, so the scores see exactly this gradient; several local steps (H > 1) are not
measured. It is not in ``DEFAULT_KINDS``: name it in ``faults``.

Bit flips and bad data are the faults silent-data-corruption studies report (arXiv 2502.12340);
scaled, stale and sign-flipped gradients are the usual Byzantine and staleness models. The
coordinate flip was called ``signflip`` before naig had one vocabulary; ``signflip:a`` is now −a·g
everywhere (``coordflip:1``, the same gradient, is what the sweep runs).
Randomness comes from an explicit ``torch.Generator``.

Example:
    >>> import torch
    >>> g = torch.ones(8)
    >>> apply_gradient_fault(FaultCell("scale", 2.0), g, torch.Generator().manual_seed(0)).tolist()
    [2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0]
    >>> g.tolist() == [1.0] * 8                       # the clean gradient is never changed
    True
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from naig.errors import UsageError
from naig.faults import apply_fault, arg_problem

__all__ = ["FAULT_KINDS", "DEFAULT_KINDS", "GRADIENT_KINDS", "INPUT_KINDS", "DEFAULT_MAGNITUDES", "UNITS",
           "FaultCell", "catalogue", "parse_kinds", "apply_gradient_fault", "corrupt_batch",
           "replaced_rows"]

GRADIENT_KINDS = ("bitflip32", "bitflip16", "scale", "coordflip", "noise", "nan", "inf", "layer")
INPUT_KINDS = ("stale", "data-random", "data-text", "replica")
FAULT_KINDS = GRADIENT_KINDS + INPUT_KINDS
DEFAULT_KINDS = tuple(k for k in FAULT_KINDS if k != "replica")
"""The kinds run when none are named: every kind of data-parallel gradients; ``replica`` (local-update
training's pseudo-gradients, not what a data-parallel monitor watches) runs on request."""
DEFAULT_MAGNITUDES: dict[str, tuple[float, ...]] = {
    "bitflip32": (0, 16, 22, 23, 27, 30, 31),
    "bitflip16": (0, 6, 7, 11, 14, 15),
    "scale": (0.0, 0.5, 1.1, 1.5, 2.0, 10.0, 1000.0),
    "coordflip": (0.01, 0.1, 0.5, 1.0),
    "noise": (0.1, 0.3, 1.0, 3.0, 10.0),
    "nan": (1,),
    "inf": (1,),
    "layer": (0.3, 1.0, 3.0, 10.0, 100.0),
    "stale": (1, 2, 5, 10, 20),
    "data-random": (0.125, 0.25, 0.5, 1.0),
    "data-text": (0.25, 0.5, 1.0),
    "replica": (0.001, 0.01, 0.1, 1.0),
}
"""The magnitudes swept per kind (from invisible to obvious for most kinds)."""
UNITS = {"bitflip32": "bit", "bitflip16": "bit", "scale": "×", "coordflip": "fraction", "noise": "ε",
         "nan": "entries", "inf": "entries", "layer": "ε", "stale": "τ steps", "data-random": "fraction",
         "data-text": "fraction", "replica": "α"}


@dataclass(frozen=True)
class FaultCell:
    """One fault kind at one magnitude (a row of the report).

    Attributes:
        kind: one of ``FAULT_KINDS``.
        magnitude: its magnitude (see the module's table).
    """

    kind: str
    magnitude: float

    def __str__(self) -> str:
        return f"{self.kind}:{self.magnitude:g}"


def parse_kinds(kinds: Sequence[str] | str | None) -> tuple[str, ...]:
    """The fault kinds to run, in catalogue order (None: ``DEFAULT_KINDS``).

    Raises:
        UsageError: an unknown or repeated kind, or none, naming ``faults``.
    """
    if kinds is None:
        return DEFAULT_KINDS
    vals = tuple(k.strip() for k in kinds.split(",")) if isinstance(kinds, str) else tuple(kinds)
    if "signflip" in vals:
        raise UsageError("signflip is −a·g in naig's fault vocabulary (naig.faults); the sign flip of a "
                         "fraction of the coordinates swept here is coordflip (coordflip:1 is −g)",
                         field="faults", value=",".join(vals))
    bad = [k for k in vals if k not in FAULT_KINDS]
    if not vals or bad or len(set(vals)) != len(vals):
        raise UsageError(f"use a comma list of distinct kinds from {', '.join(FAULT_KINDS)}", field="faults",
                         value=",".join(vals))
    return tuple(k for k in FAULT_KINDS if k in vals)


def catalogue(kinds: Sequence[str]) -> tuple[FaultCell, ...]:
    """Every (kind, magnitude) cell of ``kinds`` with the default magnitudes."""
    return tuple(FaultCell(k, float(m)) for k in kinds for m in DEFAULT_MAGNITUDES[k])


def apply_gradient_fault(cell: FaultCell, grad: Tensor, gen: torch.Generator,
                         layout: Sequence[int] | None = None) -> Tensor:
    """What a rank with fault ``cell`` sends instead of its clean gradient ``grad`` (n,) float32.

    Args:
        cell: a gradient fault (``GRADIENT_KINDS``).
        grad: the clean gradient (n,), left unchanged.
        gen: the generator of the fault's random draws (element, coordinates, noise).
        layout: the parameter tensors' sizes in flat order (``layer`` only; default: one tensor).

    Returns:
        A new (n,) float32 tensor.

    Raises:
        UsageError: for an input fault (computed by the protocol) or a magnitude out of range.
    """
    if cell.kind not in GRADIENT_KINDS:
        raise UsageError("is an input fault; the protocol computes it from θ or the batch", field="faults",
                         value=str(cell))
    _check_magnitude(cell)
    g = grad.detach().clone()
    apply_fault(cell.kind, cell.magnitude, g, gen, layout)
    return g


_FRACTIONS = ("data-random", "data-text")  # input kinds whose magnitude is a fraction in (0, 1]


def _check_magnitude(cell: FaultCell) -> None:
    """Refuse a magnitude the kind does not take: finite, >= 0, and for a gradient kind what
    ``naig.faults.arg_problem`` accepts (noise > 0 here: a sweep's zero noise is no fault)."""
    m, k = cell.magnitude, cell.kind
    ok = math.isfinite(m) and m >= 0  # a swept magnitude: a size, never negative
    if k in GRADIENT_KINDS:
        ok = ok and arg_problem(k, m) is None and (k != "noise" or m > 0)  # noise 0 is no fault
    elif k in _FRACTIONS:
        ok = ok and 0 < m <= 1
    else:  # stale: τ ≥ 1 steps; replica: α > 0
        ok = ok and (m >= 1 and m == int(m) if k == "stale" else m > 0)
    if not ok:
        raise UsageError(f"magnitude out of range for {k}", field="faults", value=str(cell))


def replaced_rows(fraction: float, batch: int) -> int:
    """⌈ρB⌉, the sequences a ``data-*`` fault replaces (at least 1, at most B)."""
    return min(batch, max(1, math.ceil(fraction * batch - 1e-9)))


def corrupt_batch(cell: FaultCell, x: Tensor, y: Tensor, text: Tensor, gen: torch.Generator
                  ) -> tuple[Tensor, Tensor]:
    """The batch (B, T) of a ``data-*`` fault: its first ⌈ρB⌉ sequences replaced.

    Args:
        cell: a ``data-random`` or ``data-text`` cell.
        x: (B, T) int64 inputs; y: (B, T) int64 next-byte targets (left unchanged).
        text: (N,) int64 the training text (``data-text`` reads windows of it backwards).
        gen: the generator of the random bytes or window starts (on the batch's device).

    Returns:
        New (x, y) with the replaced rows.
    """
    _check_magnitude(cell)
    b, t = x.shape
    rows = replaced_rows(cell.magnitude, b)
    if cell.kind == "data-random":
        seq = torch.randint(0, 256, (rows, t + 1), generator=gen, device=x.device)
    elif cell.kind == "data-text":
        start = torch.randint(0, len(text) - t - 1, (rows, 1), generator=gen, device=x.device)
        seq = text[start + torch.arange(t + 1, device=x.device)].flip(1)
    else:
        raise UsageError("is not a data fault", field="faults", value=str(cell))
    x2, y2 = x.clone(), y.clone()
    x2[:rows], y2[:rows] = seq[:, :-1], seq[:, 1:]
    return x2, y2
