"""The strategy interface: combine a batch of worker gradients into one update.

At each server update a strategy sees a ``Batch``: the B gradients g_k (B, n) to apply
together, their staleness τ_k, the workers that sent them, the current parameters θ_t
and the (stale) parameters each gradient was computed at. It returns an ``Update``:
the combined gradient ĝ (n,), handed to an unchanged torch optimizer, the coefficient
π_k of each gradient (ĝ = Σ_k π_k g̃_k, with g̃_k = g_k unless the rule corrects it),
a factor on the optimizer's learning rate for this update (1 for most rules) and, for
the rules that correct gradients, the size of the correction.

**No step.** ``Update.lr_scale == 0.0`` means "apply no optimizer step for this
update" (nothing survived: drop-stale dropped every gradient, or NAIG at window 1 gave
a non-finite energy weight 0); ``grad`` is then zeros and the caller must skip
``optimizer.step()`` (Adam would otherwise still move its moments).

**Zero weights.** A gradient with π_k = 0 is left out of the sum (``weighted_sum``), so
a NaN gradient that a content-aware rule rejected cannot poison ĝ through 0·NaN; a
content-blind rule gives it π_k > 0 and the NaN reaches θ (a divergence, the correct
result).

**Modes.** ``lockstep`` (fixed lags: a batch is the active workers of a server step)
and ``arrivals`` (a batch is a window of B arrivals; B = 1 is plain ASGD). Each rule
declares the modes it defines (``Strategy.modes``) and the smallest batch it is
defined for (``Strategy.min_batch``); ``Strategy.check`` refuses the rest with a
``UsageError`` naming the mode.

A strategy object lives for one run, so a rule may keep state across updates
(an EMA, a previous update, per-worker statistics).

Adding a rule is one file: subclass ``Strategy``, set ``name``, implement
``combine`` and decorate the class with ``@register``.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch
from torch import Tensor

from naig.errors import UsageError
from naig.gibbs import reference_index

if TYPE_CHECKING:
    from naig.sketch.torch_sketch import TorchSketch

__all__ = [
    "Batch",
    "Update",
    "StrategyOptions",
    "Strategy",
    "STRATEGIES",
    "MODES",
    "REFERENCES",
    "register",
    "make_strategy",
    "uniform_weights",
    "weighted_sum",
    "reference_row",
    "relative_correction",
    "parse_clip",
    "no_step",
]

MODES = ("lockstep", "arrivals")  # fixed lags (a server step's workers) / windows of B arrivals
REFERENCES = ("batch", "ema")  # NAIG's reference: the freshest of the batch / an EMA of updates


@dataclass(frozen=True)
class Batch:
    """The gradients one server update combines.

    Attributes:
        grads: (B, n) float gradients; row k was computed at ``theta_stale[k]``.
        staleness: (B,) int64 τ_k, server versions between ``theta_stale[k]`` and θ_t.
        workers: (B,) int64 index of the worker that sent each row.
        theta: (n,) the current parameters θ_t.
        theta_stale: (B, n) the parameters each gradient was computed at.
    """

    grads: Tensor
    staleness: Tensor
    workers: Tensor
    theta: Tensor
    theta_stale: Tensor


@dataclass(frozen=True)
class Update:
    """What a strategy hands the optimizer.

    Attributes:
        grad: (n,) combined gradient ĝ, in the dtype of the batch's gradients (zeros when
            ``lr_scale`` is 0).
        weights: (B,) coefficient π_k of each gradient, on the gradients' device. For the
            non-linear rules (median, trimmed mean) π_k is the fraction of ĝ's coordinates
            that row k supplies; for centered clipping the coefficient of g_k in v.
        lr_scale: factor on the optimizer's learning rate for this update; 0.0 means
            "no optimizer step" (see the module docstring).
        correction: ‖G̃ − G‖_F / ‖G‖_F over the batch's rows (G the received gradients,
            G̃ the corrected ones) for the rules that correct gradients (dc-asgd,
            dc-asgd-a, gap-aware); None for the others. NaN when ‖G‖ is 0 or not finite.
    """

    grad: Tensor
    weights: Tensor
    lr_scale: float = 1.0
    correction: float | None = None


def parse_clip(clip: float | str, field: str = "clip") -> float | str:
    """Validate a centered-clip radius: ``"auto"`` or a finite float > 0.

    Raises:
        UsageError: for anything else (field ``clip``).

    Example:
        >>> parse_clip("AUTO"), parse_clip("0.5")
        ('auto', 0.5)
    """
    if isinstance(clip, str) and clip.strip().lower() == "auto":
        return "auto"
    if isinstance(clip, bool):  # float(True) is 1.0: a config's `true` is not a number
        raise UsageError("not a number; use 'auto' or a number", field=field, value=clip)
    try:
        value = float(clip)
    except (TypeError, ValueError):
        raise UsageError("not a number; use 'auto' or a finite float > 0", field=field, value=clip) from None
    if not (math.isfinite(value) and value > 0):
        raise UsageError("must be 'auto' or a finite float > 0, e.g. 1.0", field=field, value=clip)
    return value


@dataclass(frozen=True)
class StrategyOptions:
    """Options shared by all strategies (each uses the ones it needs).

    Checked on construction (``UsageError`` naming the field). ``clip`` is normalised
    by ``parse_clip``; ``reference`` None resolves to ``"ema"`` in arrival mode with
    window 1 and to ``"batch"`` otherwise (``resolved_reference``).
    """

    beta: float | str = "auto"  # Gibbs inverse temperature (naig, naig-exact): float ≥ 0 or "auto"
    dc_lambda: float = 20.0  # dc-asgd's constant λ (measured: benchmarks/dc_lambda.py, docs/design.md §12)
    line: tuple[int, int, int] = (1, 2, 4)  # oriented Fano line ℓ of the metric Ψ_ℓ
    sketch: TorchSketch | None = None  # precomputed sketch of the flat layout (naig)
    lr: float = 1e-3  # η, the run's base learning rate (gap-aware under SGD counts gaps in η-steps)
    optimizer: str = "adam"  # "sgd" or "adam": gap-aware's typical step (η√v vs EMA of |Δθ|)
    mode: str = "lockstep"  # "lockstep" (fixed lags) or "arrivals" (windows of B arrivals)
    window: int = 1  # B, arrivals per server update (arrival mode; 1 = plain ASGD)
    workers: int | None = None  # K, the number of workers (None: unknown; drop-stale then needs
    #                             max_staleness)
    max_staleness: int | None = None  # drop-stale keeps τ ≤ this; None = K (`workers`)
    byzantine: int = 1  # f, faulty workers tolerated: trimmed-mean trims f per side; krum
    #                     scores K − f − 2 neighbours; multi-krum averages m = K − f
    clip: float | str = "auto"  # centered-clip radius c: float > 0, or "auto" = median_k ‖g_k − v‖
    reference: str | None = None  # naig reference: "batch" (freshest of the batch) or "ema"
    #                               (EMA(0.9) of the applied updates; window 1); None = by mode

    def __post_init__(self) -> None:
        object.__setattr__(self, "clip", parse_clip(self.clip))
        _require(self.mode in MODES, "mode", self.mode, "use lockstep or arrivals")
        _require(self.window >= 1, "window", self.window, "use a positive int (1 = plain ASGD)")
        _require(self.workers is None or self.workers >= 1, "workers", self.workers, "use a positive int")
        _require(self.max_staleness is None or self.max_staleness >= 0, "max_staleness", self.max_staleness,
                 "use an int >= 0 (the largest staleness kept), e.g. 4")
        _require(self.byzantine >= 0, "byzantine", self.byzantine, "use an int >= 0, e.g. 1")
        _require(self.reference is None or self.reference in REFERENCES, "reference", self.reference,
                 "use batch or ema")
        _require(self.optimizer in ("sgd", "adam"), "optimizer", self.optimizer, "use sgd or adam")
        _require(math.isfinite(self.lr) and self.lr > 0, "lr", self.lr, "use a finite value > 0")

    @property
    def batch_size(self) -> int | None:
        """The batch a rule combines in this mode: K in lockstep, B in arrivals (None: unknown)."""
        return self.window if self.mode == "arrivals" else self.workers

    @property
    def resolved_reference(self) -> str:
        """``reference``, or by mode: ``"ema"`` for arrivals with window 1, else ``"batch"``."""
        if self.reference is not None:
            return self.reference
        return "ema" if self.mode == "arrivals" and self.window == 1 else "batch"


def _require(ok: bool, field: str, value: object, message: str) -> None:
    if not ok:
        raise UsageError(message, field=field, value=value)


class Strategy(ABC):
    """Base class of a gradient-combination rule.

    Attributes:
        name: registry name (the spelling users list in ``strategies``).
        uses_lags: False when the rule is the synchronous ideal (all gradients at θ_t).
        modes: the modes (``MODES``) in which the rule is defined.
        min_batch: the smallest batch (lockstep: K; arrivals: B) the rule is defined for.
    """

    name: ClassVar[str]
    uses_lags: ClassVar[bool] = True
    modes: ClassVar[frozenset[str]] = frozenset(MODES)
    min_batch: ClassVar[int] = 1

    def __init__(self, options: StrategyOptions) -> None:
        self.options = options

    @classmethod
    def check(cls, options: StrategyOptions) -> tuple[str, ...]:
        """Refuse a mode or batch size the rule does not define; return warnings.

        Args:
            options: the run's options (``mode``, ``window``, ``workers``, ...).

        Returns:
            One-line warnings for settings the rule runs with but degrades on (e.g. krum
            with K < 2f + 3); empty for most rules.

        Raises:
            UsageError: field ``strategies``, value the rule's name, naming the mode.
        """
        if options.mode not in cls.modes:
            raise UsageError(f"is not defined in {options.mode} mode; "
                             f"{cls.mode_hint(options.mode)}", field="strategies", value=cls.name)
        size = options.batch_size
        need = cls.needed_batch(options)
        if size is not None and size < need:
            what = "window B" if options.mode == "arrivals" else "number of workers K"
            raise UsageError(f"needs a {what} of at least {need} in {options.mode} mode (got {size}); "
                             f"{cls.size_hint(options)}", field="strategies", value=cls.name)
        return ()

    @classmethod
    def needed_batch(cls, options: StrategyOptions) -> int:
        """The smallest batch the rule is defined for under ``options`` (default ``min_batch``)."""
        return cls.min_batch

    @classmethod
    def mode_hint(cls, mode: str) -> str:
        """How to get the rule's effect in a mode it does not define (for error messages)."""
        return "use it in " + " or ".join(sorted(cls.modes)) + " mode"

    @classmethod
    def size_hint(cls, options: StrategyOptions) -> str:
        """What to change when the batch is too small (for error messages)."""
        return "use a larger `window`" if options.mode == "arrivals" else "use more workers"

    @abstractmethod
    def combine(self, batch: Batch) -> Update:
        """Combine the batch's gradients into one update (see ``Batch`` and ``Update``)."""


def uniform_weights(grads: Tensor) -> Tensor:
    """π_k = 1/B for the B rows of ``grads`` (B, n): (B,) float32 on their device."""
    k = grads.shape[0]
    return torch.full((k,), 1.0 / k, device=grads.device)


def weighted_sum(weights: Tensor, grads: Tensor) -> Tensor:
    """ĝ = Σ_{k: π_k ≠ 0} π_k g_k: rows of weight 0 are left out, so 0·NaN cannot poison ĝ.

    Args:
        weights: (B,) coefficients π_k (any float dtype, on ``grads``' device).
        grads: (B, n) gradients.

    Returns:
        (n,) in ``grads``' dtype; zeros when every weight is 0.

    Example:
        >>> g = torch.tensor([[1.0, 2.0], [float("nan"), 0.0]])
        >>> weighted_sum(torch.tensor([0.5, 0.0]), g).tolist()
        [0.5, 1.0]
    """
    pi = weights.to(device=grads.device, dtype=grads.dtype)
    keep = pi != 0
    if bool(keep.all()):
        return pi @ grads
    rows = keep.nonzero().squeeze(1)
    return pi.index_select(0, rows) @ grads.index_select(0, rows)


def reference_row(staleness: Tensor, workers: Tensor) -> int:
    """The freshest row of a batch: min τ, ties to the lowest worker (``naig.gibbs.reference_index``).

    Args:
        staleness: (B,) int staleness τ_k.
        workers: (B,) int worker index of each row.

    Returns:
        The row index (not the worker index).

    Example:
        >>> reference_row(torch.tensor([3, 1, 1]), torch.tensor([0, 5, 2]))
        2
    """
    return reference_index(staleness.tolist(), workers.tolist())


def relative_correction(corrected: Tensor, grads: Tensor) -> float:
    """‖G̃ − G‖_F / ‖G‖_F over the batch, accumulated in float64 (NaN when ‖G‖ is 0 or not finite).

    Example:
        >>> round(relative_correction(torch.tensor([[3.0, 4.0]]) * 1.1, torch.tensor([[3.0, 4.0]])), 6)
        0.1
    """
    num = torch.linalg.vector_norm(corrected - grads, dtype=torch.float64)
    den = torch.linalg.vector_norm(grads, dtype=torch.float64)
    den_f = float(den)
    if not math.isfinite(den_f) or den_f == 0.0:
        return math.nan
    return float(num) / den_f


def no_step(grads: Tensor) -> Update:
    """The update that applies nothing: zero gradient, zero weights, ``lr_scale`` 0."""
    return Update(grads.new_zeros(grads.shape[1]), grads.new_zeros(grads.shape[0]), lr_scale=0.0)


STRATEGIES: dict[str, type[Strategy]] = {}


def register(cls: type[Strategy]) -> type[Strategy]:
    """Class decorator adding a strategy to ``STRATEGIES`` under ``cls.name``."""
    STRATEGIES[cls.name] = cls
    return cls


def make_strategy(name: str, options: StrategyOptions | None = None) -> Strategy:
    """Instantiate a registered strategy after ``Strategy.check`` (warnings are dropped here;
    call ``STRATEGIES[name].check(options)`` to show them).

    Raises:
        UsageError: for an unknown name (the message lists the known ones), or a mode or
            batch size the rule does not define.
    """
    if name not in STRATEGIES:
        raise UsageError(f"unknown strategy; use a comma list of {', '.join(STRATEGIES)}",
                         field="strategies", value=name)
    options = options or StrategyOptions()
    STRATEGIES[name].check(options)
    return STRATEGIES[name](options)
