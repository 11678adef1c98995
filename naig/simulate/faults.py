"""Injected worker faults, one grammar for every engine (docs/design.md §12).

A fault is written ``W:KIND[:ARG][@STEP]``: worker W (any worker, the reference
included) misbehaves from server update STEP on (default 0; the distributed engine: from
the first job on parameter version STEP). Gradient faults change what it sends instead
of its gradient g (n,); they are naig's one fault vocabulary (``naig.faults``, the same names
and meanings ``naig detect`` uses), all but ``layer`` (a flat gradient row has no tensors):

================  ==============================================================
``signflip:a``      −a·g
``scale:a``         a·g
``noise:σ``         g + ε, ε ~ N(0, σ²‖g‖²/n · I)  (so E‖ε‖² = σ²‖g‖²)
``zero``            0
``nan[:c]``         NaN in c random coordinates (no c: in every coordinate)
``random``          ‖g‖ · z/‖z‖, z ~ N(0, I)  (a random direction of the same norm)
``coordflip:f``     the sign of a fraction f of the coordinates flipped
``inf[:c]``         +inf in c random coordinates (no c: in every coordinate)
``bitflip32:b``     bit b of one random float32 coordinate flipped (``bitflip16:b``: bfloat16)
================  ==============================================================

Process faults exist only where workers are processes (``--engine distributed``):

============  ==============================================================
``kill``        the worker process kills itself with SIGKILL (a crashed machine)
``hang``        it stops answering (the server's message timeout declares it lost)
============  ==============================================================

Each engine declares the kinds it applies (``FAULT_KINDS`` of its module) and
``check_faults`` refuses the others with a one-line error. Several faults may name one worker;
they apply in the order given. Randomness comes
from an explicit ``torch.Generator`` (one draw of n values per noisy or random row, in
row order, then fault order).

Example:
    >>> import torch
    >>> faults = parse_faults(["1:signflip:10", "0:zero@2"])
    >>> [str(f) for f in faults]
    ['1:signflip:10@0', '0:zero@2']
    >>> g = torch.ones(3, 2)
    >>> apply_faults(faults, g, torch.tensor([0, 1, 2]), step=0, generator=torch.Generator()).tolist()
    [False, True, False]
    >>> g.tolist()
    [[1.0, 1.0], [-10.0, -10.0], [1.0, 1.0]]
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from naig.errors import UsageError
from naig.faults import KINDS, apply_fault, arg_problem

__all__ = ["Fault", "FAULT_KINDS", "GRADIENT_FAULTS", "PROCESS_FAULTS", "parse_fault", "parse_faults",
           "check_faults", "apply_faults", "faulty_workers"]

FAULT_KINDS = ("signflip", "scale", "noise", "zero", "nan", "random", "coordflip", "inf", "bitflip32",
               "bitflip16", "kill", "hang")
GRADIENT_FAULTS = frozenset(FAULT_KINDS[:-2])  # what a worker sends instead of its gradient (naig.faults)
PROCESS_FAULTS = frozenset(("kill", "hang"))  # what a worker process does (distributed engine)
_FORMAT = "use W:KIND[:ARG][@STEP], e.g. 1:signflip:10 or 0:nan@50"
_PATTERN = re.compile(r"^(?P<worker>[^:@]+):(?P<kind>[^:@]+)(?::(?P<arg>[^@]+))?(?:@(?P<step>.+))?$")


@dataclass(frozen=True)
class Fault:
    """One injected fault.

    Attributes:
        worker: the worker index W ≥ 0.
        kind: one of ``FAULT_KINDS``.
        arg: the kind's ARG (``naig.faults``: a, σ, f, c, b); None where it has none or it is not given.
        start: the first server update (0-based) at which the fault is active.
    """

    worker: int
    kind: str
    arg: float | None = None
    start: int = 0

    def __str__(self) -> str:
        arg = "" if self.arg is None else f":{self.arg:g}"
        return f"{self.worker}:{self.kind}{arg}@{self.start}"

    def active(self, step: int) -> bool:
        """True from server update ``start`` on."""
        return step >= self.start

    def apply(self, grad: Tensor, generator: torch.Generator) -> None:
        """Replace ``grad`` (n,) in place by what the faulty worker sends (``naig.faults.apply_fault``)."""
        if self.kind in PROCESS_FAULTS:
            raise ValueError(f"{self.kind} is a process fault; only the distributed worker acts on it")
        apply_fault(self.kind, self.arg, grad, generator)


def parse_fault(text: str) -> Fault:
    """Parse one ``W:KIND[:ARG][@STEP]``.

    Raises:
        UsageError: field ``faults``, naming the text and the fix.

    Example:
        >>> parse_fault("2:noise:0.5@100")
        Fault(worker=2, kind='noise', arg=0.5, start=100)
    """
    if "," in text:
        raise UsageError("one fault per `faults`: give the option once for each fault (e.g. 1:zero, "
                         "then 2:nan@5)", field="faults", value=text)
    m = _PATTERN.match(text.strip())
    if m is None:
        raise UsageError(_FORMAT, field="faults", value=text)
    worker = _int(m["worker"], text, "the worker W")
    kind = m["kind"].strip().lower()
    if kind not in FAULT_KINDS:
        why = (f"{kind} is naig's noise in one parameter tensor, and a simulated gradient is one flat row"
               if kind in KINDS else f"unknown fault kind {kind!r}")
        raise UsageError(f"{why}; use {_KIND_LIST}", field="faults", value=text)
    start = 0 if m["step"] is None else _int(m["step"], text, "STEP")
    return Fault(worker, kind, _arg(kind, m["arg"], text), start)


def _int(part: str, text: str, what: str) -> int:
    try:
        value = int(part.strip())
    except ValueError:
        raise UsageError(f"{what} must be an int >= 0; {_FORMAT}", field="faults", value=text) from None
    if value < 0:
        raise UsageError(f"{what} must be an int >= 0; {_FORMAT}", field="faults", value=text)
    return value


def _arg(kind: str, part: str | None, text: str) -> float | None:
    if kind in PROCESS_FAULTS or not KINDS[kind].arg:
        if part is not None:
            raise UsageError(f"{kind} takes no argument, e.g. 2:{kind}@100", field="faults", value=text)
        return None
    if part is None:
        if KINDS[kind].needs_arg:
            raise UsageError(f"{kind} needs an argument, e.g. 1:{kind}:{KINDS[kind].example}",
                             field="faults", value=text)
        return None
    try:
        value = float(part)
    except ValueError:
        raise UsageError(f"the argument of {kind} must be a number; {_FORMAT}", field="faults",
                         value=text) from None
    problem = arg_problem(kind, value)
    if problem is not None:
        raise UsageError(f"the argument of {kind} {problem}", field="faults", value=text)
    return value


def _kind_list() -> str:
    """``signflip:a, scale:a, ..., nan[:c], ..., kill or hang`` for messages."""
    words = [k if k in PROCESS_FAULTS or not KINDS[k].arg else
             f"{k}:{KINDS[k].arg}" if KINDS[k].needs_arg else f"{k}[:{KINDS[k].arg}]" for k in FAULT_KINDS]
    return f"{', '.join(words[:-1])} or {words[-1]}"


_KIND_LIST = _kind_list()


def parse_faults(texts: str | Sequence[str]) -> tuple[Fault, ...]:
    """Parse faults given one per string (a repeatable option), in order.

    Args:
        texts: a sequence of ``W:KIND[:ARG][@STEP]`` strings, or one such string.

    Raises:
        UsageError: field ``faults`` for the first malformed one, or one given twice (it would apply
            twice: ``1:scale:10`` twice is ×100).
    """
    given = [texts] if isinstance(texts, str) else list(texts)
    out = tuple(parse_fault(t) for t in given)
    twice = next((i for i, f in enumerate(out) if f in out[:i]), None)
    if twice is not None:
        raise UsageError("is given twice; give each fault once", field="faults", value=given[twice])
    return out


def check_faults(faults: Iterable[Fault], workers: int, kinds: frozenset[str] = GRADIENT_FAULTS,
                 where: str = "this engine") -> None:
    """Refuse a fault on a worker that does not exist, or of a kind ``where`` does not apply.

    Args:
        faults: parsed faults.
        workers: K.
        kinds: the kinds the engine applies.
        where: the engine's name, for the message.

    Raises:
        UsageError: field ``faults``, naming the fault and the fix.

    Example:
        >>> check_faults(parse_faults(["4:zero"]), workers=4)
        Traceback (most recent call last):
        ...
        naig.errors.UsageError: faults='4:zero@0': worker 4 does not exist; the 4 workers are 0..3
    """
    for f in faults:
        if f.worker >= workers:
            raise UsageError(f"worker {f.worker} does not exist; the {workers} workers are 0..{workers - 1}",
                             field="faults", value=str(f))
        if f.kind not in kinds:
            fix = ("needs worker processes: use `engine` distributed" if f.kind in PROCESS_FAULTS
                   else f"use one of {', '.join(k for k in FAULT_KINDS if k in kinds)}")
            raise UsageError(f"{f.kind} is not applied by {where}; {fix}", field="faults", value=str(f))


def faulty_workers(faults: Iterable[Fault]) -> tuple[int, ...]:
    """The sorted distinct workers named by ``faults`` (tables mark them)."""
    return tuple(sorted({f.worker for f in faults}))


def apply_faults(faults: Sequence[Fault], grads: Tensor, workers: Tensor, step: int,
                 generator: torch.Generator) -> Tensor:
    """Apply the faults active at ``step`` to the rows of ``grads`` in place.

    Args:
        faults: parsed faults, applied in order.
        grads: (B, n) float gradients; row k was sent by ``workers[k]``.
        workers: (B,) int worker index of each row.
        step: the server update being assembled (0-based).
        generator: a ``torch.Generator`` on ``grads``' device (noise, random).

    Returns:
        (B,) bool, True for the rows a fault changed.
    """
    touched = torch.zeros(grads.shape[0], dtype=torch.bool)
    active = [f for f in faults if f.active(step) and f.kind in GRADIENT_FAULTS]
    if active:
        for row, worker in enumerate(workers.tolist()):
            for f in active:
                if f.worker == worker:
                    f.apply(grads[row], generator)
                    touched[row] = True
    return touched
