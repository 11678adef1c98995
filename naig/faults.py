"""One fault vocabulary: what a faulty worker or rank sends instead of its clean gradient.

Every gradient fault of naig is here, once, with one meaning per name; ``naig simulate``
(``W:KIND[:ARG][@STEP]``, ``naig.simulate.faults``) and ``naig detect`` (a kind at a swept
magnitude, ``naig.detect.faults``) name these kinds and apply them with ``apply_fault``.
A transform acts in place on the gradient g (n,) float of one worker or rank:

=================  ===================  =====================================================
kind               ARG                  what is sent instead of g
=================  ===================  =====================================================
``scale:a``        a, finite            a·g (a = 0: a zero gradient)
``signflip:a``     a, finite            −a·g (a = 1: the whole gradient's sign flipped)
``coordflip:f``    f ∈ (0, 1]           g with the sign of max(1, round(f·n)) random coordinates
                                        flipped (f = 1: −g; ‖Δ‖² = 4 Σ_flipped g_i²)
``zero``           none                 0
``noise:σ``        σ ≥ 0, finite        g + σ‖g‖ z/√n, z ~ N(0, I) (so E‖Δ‖² = σ²‖g‖²)
``random``         none                 ‖g‖ z/‖z‖, z ~ N(0, I) (a random direction, same norm)
``nan[:c]``        c ≥ 1 entries        NaN in c random entries (no c: in every entry)
``inf[:c]``        c ≥ 1 entries        +inf in c random entries (no c: in every entry)
``bitflip32:b``    b ∈ 0..31            one random element with bit b of its float32 flipped
                                        (31 sign, 30..23 exponent, 22..0 mantissa)
``bitflip16:b``    b ∈ 0..15            one random element rounded to bfloat16, bit b flipped
                                        (15 sign, 14..7 exponent, 6..0 mantissa)
``layer:ε``        ε > 0                ``noise:ε`` confined to one random parameter tensor L:
                                        g_L + ε‖g_L‖ z/√n_L (needs the tensors' sizes)
=================  ===================  =====================================================

Bit flips are the faults silent-data-corruption studies report (arXiv 2502.12340); scaled,
sign-flipped and noisy gradients the usual Byzantine models. Randomness comes from an explicit
``torch.Generator``, drawn in a fixed order per kind (an element index; a permutation of the
coordinates; n normal values), so one seed gives one fault everywhere.

Example:
    >>> import torch
    >>> g = torch.ones(4)
    >>> apply_fault("signflip", 10.0, g, torch.Generator().manual_seed(0))
    >>> g.tolist()
    [-10.0, -10.0, -10.0, -10.0]
    >>> arg_problem("coordflip", 1.5)
    'must be a fraction in (0, 1]'
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from naig.errors import UsageError

__all__ = ["FaultKind", "KINDS", "apply_fault", "arg_problem", "corrupted", "parse_kind", "flip_bit32",
           "flip_bit16"]


@dataclass(frozen=True)
class FaultKind:
    """One kind of gradient fault (a row of the module's table).

    Attributes:
        name: the kind's one name.
        arg: what its ARG is (``"a"``, ``"f"``, ...); empty for a kind without one.
        needs_arg: True when ARG must be given; False when it is optional or absent (``arg``).
        example: an ARG for messages (``"10"``).
        problem: ARG → None when valid, else why not (a phrase after "the argument of KIND ...");
            None for a kind without an ARG.
    """

    name: str
    arg: str
    needs_arg: bool
    example: str
    problem: Callable[[float], str | None] | None


def _finite(a: float) -> str | None:
    return None if math.isfinite(a) else "must be finite"


def _finite_nonnegative(a: float) -> str | None:
    return None if math.isfinite(a) and a >= 0 else "must be finite and >= 0"


def _positive(a: float) -> str | None:
    return None if math.isfinite(a) and a > 0 else "must be finite and > 0"


def _fraction(a: float) -> str | None:
    return None if 0 < a <= 1 else "must be a fraction in (0, 1]"


def _count(a: float) -> str | None:
    return None if math.isfinite(a) and a >= 1 and a == int(a) else "must be an int >= 1 (entries)"


def _bit(top: int) -> Callable[[float], str | None]:
    return lambda b: None if b == int(b) and 0 <= b <= top else f"must be a bit 0..{top}"


KINDS: dict[str, FaultKind] = {k.name: k for k in (
    FaultKind("scale", "a", True, "10", _finite),
    FaultKind("signflip", "a", True, "10", _finite),
    FaultKind("coordflip", "f", True, "0.5", _fraction),
    FaultKind("zero", "", False, "", None),
    FaultKind("noise", "σ", True, "0.5", _finite_nonnegative),
    FaultKind("random", "", False, "", None),
    FaultKind("nan", "c", False, "1", _count),
    FaultKind("inf", "c", False, "1", _count),
    FaultKind("bitflip32", "b", True, "30", _bit(31)),
    FaultKind("bitflip16", "b", True, "14", _bit(15)),
    FaultKind("layer", "ε", True, "1", _positive),
)}
"""Every gradient fault kind, in the table's order."""


def arg_problem(kind: str, arg: float | None) -> str | None:
    """Why ``arg`` is not an argument of ``kind`` (None: it is), e.g. ``'must be finite'``.

    Raises:
        KeyError: ``kind`` is not in ``KINDS``.
    """
    k = KINDS[kind]
    if arg is None:
        return f"needs an argument, e.g. {kind}:{k.example}" if k.needs_arg else None
    return k.problem(float(arg)) if k.problem is not None else "takes no argument"


def parse_kind(text: str, kinds: Sequence[str] = tuple(KINDS),
               field: str = "fault") -> tuple[str, float | None]:
    """``KIND[:ARG]`` → ``(kind, arg)``, checked: ``"scale:1000"`` → ``("scale", 1000.0)``.

    Args:
        text: a kind of ``kinds`` and, where it takes one, its ARG.
        kinds: the kinds accepted here (default: every kind).
        field: the option the text came from, named in errors.

    Raises:
        UsageError: naming ``field`` and ``text``: an unknown kind (listing ``kinds``), an ARG that is
            no number, or one ``arg_problem`` refuses.

    Example:
        >>> parse_kind("scale:1000"), parse_kind("nan")
        (('scale', 1000.0), ('nan', None))
    """
    kind, colon, raw = str(text).strip().partition(":")
    if kind not in kinds:
        what = "is not a kind taken here" if kind in KINDS else "unknown fault kind"
        raise UsageError(f"{what}; use one of {', '.join(kinds)}", field=field, value=text)
    try:
        arg = float(raw) if colon else None
    except ValueError:
        raise UsageError(f"the argument of {kind} is not a number, e.g. {kind}:{KINDS[kind].example or 1}",
                         field=field, value=text) from None
    problem = arg_problem(kind, arg)
    if problem is not None:
        raise UsageError(f"{kind} {problem}", field=field, value=text)
    return kind, arg


def corrupted(grad: Tensor, kind: str, arg: float | None, generator: torch.Generator) -> Tensor:
    """A copy of ``grad`` (any shape, a float dtype) with the fault applied to its flattened values;
    ``grad`` is not changed. What a tensor hook (``Tensor.register_hook``) returns to corrupt a
    parameter's gradient before the data-parallel reduction sees it. The fault is applied on the
    generator's device (a CPU generator corrupts a CUDA gradient through a host copy).

    Raises:
        ValueError: as ``apply_fault``.
    """
    flat = grad.detach().reshape(-1).to(generator.device, copy=True)
    apply_fault(kind, arg, flat, generator)
    return flat.to(grad.device).view_as(grad)


def apply_fault(kind: str, arg: float | None, grad: Tensor, generator: torch.Generator,
                layout: Sequence[int] | None = None) -> None:
    """Replace ``grad`` in place by what a worker with this fault sends (the module's table).

    Args:
        kind: a name of ``KINDS``.
        arg: its ARG (None where it has none or it is optional), valid for ``kind``.
        grad: (n,) float gradient, changed in place (a view of a row works).
        generator: the fault's random draws, on ``grad``'s device.
        layout: the parameter tensors' sizes in flat order (``layer`` only; default: one tensor).

    Raises:
        ValueError: an unknown kind or an argument ``arg_problem`` refuses.
    """
    if kind not in KINDS or arg_problem(kind, arg) is not None:
        raise ValueError(f"{kind}:{arg}: {arg_problem(kind, arg) if kind in KINDS else 'unknown kind'}")
    _APPLY[kind](grad, arg, generator, layout)


def _scale(g: Tensor, a: float | None, gen: torch.Generator, layout: Sequence[int] | None) -> None:
    g.mul_(a)


def _signflip(g: Tensor, a: float | None, gen: torch.Generator, layout: Sequence[int] | None) -> None:
    g.mul_(-a)  # type: ignore[operator]


def _coordflip(g: Tensor, f: float | None, gen: torch.Generator, layout: Sequence[int] | None) -> None:
    n = g.numel()
    idx = torch.randperm(n, generator=gen, device=gen.device)[:max(1, round(f * n))].to(g.device)  # type: ignore[operator]
    g[idx] = -g[idx]


def _zero(g: Tensor, a: float | None, gen: torch.Generator, layout: Sequence[int] | None) -> None:
    g.zero_()


def _noise(g: Tensor, sigma: float | None, gen: torch.Generator, layout: Sequence[int] | None) -> None:
    """g += σ‖g‖ z/√n in place (z standard normal; ‖·‖ in float64)."""
    norm = float(torch.linalg.vector_norm(g, dtype=torch.float64))
    z = torch.randn(g.shape, generator=gen, device=g.device, dtype=g.dtype)
    g.add_(z, alpha=sigma * norm / math.sqrt(g.numel()))  # type: ignore[operator]


def _random(g: Tensor, a: float | None, gen: torch.Generator, layout: Sequence[int] | None) -> None:
    norm = float(torch.linalg.vector_norm(g, dtype=torch.float64))
    z = torch.randn(g.shape, generator=gen, device=g.device, dtype=g.dtype)
    z_norm = float(torch.linalg.vector_norm(z, dtype=torch.float64))
    g.copy_(z).mul_(norm / z_norm if z_norm > 0 else 0.0)


def _non_finite(value: float) -> Callable[..., None]:
    def put(g: Tensor, c: float | None, gen: torch.Generator, layout: Sequence[int] | None) -> None:
        if c is None:
            g.fill_(value)
            return
        g[torch.randperm(g.numel(), generator=gen, device=gen.device)[:int(c)].to(g.device)] = value
    return put


def _bitflip(flip: Callable[[float, int], float]) -> Callable[..., None]:
    def put(g: Tensor, b: float | None, gen: torch.Generator, layout: Sequence[int] | None) -> None:
        i = int(torch.randint(g.numel(), (1,), generator=gen, device=gen.device))
        g[i] = flip(float(g[i]), int(b))  # type: ignore[arg-type]
    return put


def _layer(g: Tensor, eps: float | None, gen: torch.Generator, layout: Sequence[int] | None) -> None:
    sizes = list(layout) if layout is not None else [g.numel()]
    which = int(torch.randint(len(sizes), (1,), generator=gen, device=gen.device))
    start = sum(sizes[:which])
    _noise(g[start:start + sizes[which]], eps, gen, None)


def flip_bit32(value: float, bit: int) -> float:
    """``value`` as float32 with bit ``bit`` (0 = mantissa LSB, 31 = sign) of its pattern flipped."""
    t = torch.tensor([value], dtype=torch.float32).view(torch.int32)
    mask = torch.tensor([1 << bit], dtype=torch.int64).to(torch.int32)  # bit 31 wraps to the sign bit
    return float((t ^ mask).view(torch.float32)[0])


def flip_bit16(value: float, bit: int) -> float:
    """``value`` rounded to bfloat16 with bit ``bit`` (0 = mantissa LSB, 15 = sign) flipped, as a float."""
    t = torch.tensor([value], dtype=torch.float32).to(torch.bfloat16).view(torch.int16)
    mask = torch.tensor([1 << bit], dtype=torch.int32).to(torch.int16)
    return float((t ^ mask).view(torch.bfloat16).to(torch.float32)[0])


_APPLY = {"scale": _scale, "signflip": _signflip, "coordflip": _coordflip, "zero": _zero, "noise": _noise,
          "random": _random, "nan": _non_finite(math.nan), "inf": _non_finite(math.inf),
          "bitflip32": _bitflip(flip_bit32), "bitflip16": _bitflip(flip_bit16), "layer": _layer}
