"""The monitor records' schema: what one step's record holds, its JSON encoding (NaN and ±inf as
strings), the CSV columns and the flat scalars the loggers get; ``naig.monitor.records`` says it
all in one place."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from naig.errors import UsageError
from naig.gibbs import naig_weights
from naig.monitor.detectors import SCORES, SIDES, SIGNALS, Decision

if TYPE_CHECKING:
    from naig.monitor.signals import RankSignals

__all__ = ["CSV_COLUMNS", "PREFIX", "SCHEMA_VERSION", "csv_columns", "csv_signals", "decision_scalars",
           "decode", "encode", "flat_scalars",
           "k_eff", "step_record"]


SCHEMA_VERSION = 1
PREFIX = "naig_monitor/"
_ENCODED = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
_PER_RANK = ("nonfinite", "usable", "sq_norm", "rel_norm", "energy", "cos", "sq_dist")
def csv_columns(signals: tuple[str, ...] = SIGNALS) -> tuple[str, ...]:
    """The CSV header for the scores of ``signals`` (in ``SIGNALS`` order): one row per rank per step."""
    return ("step", "rank", "host", "flagged", "flags", "where", *_PER_RANK, "cos_kind", "sq_dist_kind",
            "weight", *(f"score_{s}" for s in signals), *(f"{c}_{s}" for s in signals for c in SCORES),
            "max_score", "k_eff", "b_simple")


CSV_COLUMNS = csv_columns()
"""The CSV header: one row per rank per step."""


def csv_signals(header: tuple[str, ...]) -> tuple[str, ...] | None:
    """The signals of a monitor CSV header (a file written before a signal existed has fewer), or
    None when it is not one."""
    signals = tuple(s for s in SIGNALS if f"score_{s}" in header)
    return signals if signals and tuple(header) == csv_columns(signals) else None


def encode(obj: Any) -> Any:
    """``obj`` with every NaN/±inf float (nested too) as ``"NaN"``, ``"Infinity"``, ``"-Infinity"``.

    Example:
        >>> encode({"z": [1.5, float("inf"), float("nan")]})
        {'z': [1.5, 'Infinity', 'NaN']}
    """
    if isinstance(obj, float | np.floating):
        f = float(obj)
        return f if math.isfinite(f) else ("NaN" if math.isnan(f) else ("Infinity" if f > 0 else "-Infinity"))
    if isinstance(obj, Mapping):
        return {str(k): encode(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [encode(v) for v in obj]
    if isinstance(obj, np.integer | np.bool_):
        return obj.item()
    return obj


def decode(obj: Any) -> Any:
    """The inverse of ``encode``: the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"`` back to floats.

    Example:
        >>> decode({"z": [1.5, "Infinity", "NaN"]})["z"][:2]
        [1.5, inf]
    """
    if isinstance(obj, str):
        return _ENCODED.get(obj, obj)
    if isinstance(obj, dict):
        return {k: decode(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [decode(v) for v in obj]
    return obj


def k_eff(energies: np.ndarray) -> tuple[float, np.ndarray]:
    """K_eff = 1/Σ π_k² of the Gibbs weights π of the energies (β ``"auto"``), and π.

    Args:
        energies: (K,) float64 Fano–Fisher energies; non-finite ones get π = 0.

    Returns:
        (K_eff in [1, K], π (K,) float64 summing to 1); uniform π (K_eff = K) when no energy is finite.

    Example:
        >>> k_eff(np.array([0.0, 0.0, np.nan]))[0]
        2.0
    """
    pi = naig_weights(np.asarray(energies, dtype=np.float64), "auto")
    return float(1.0 / np.sum(pi * pi)), pi


def _scores(sig: RankSignals, decision: Decision) -> dict[str, list[float]]:
    """signal → (K,) the larger value/threshold of its tests (|·| for two-sided and the lower CUSUM);
    +inf for a non-finite rank. The thresholds are the decision's own (``Decision.thresholds``)."""
    out = {}
    for name in decision.transient.keys() | decision.cusum.keys():
        best = np.full(decision.world, np.nan)
        for score in SCORES:
            zs = (decision.transient if score == "transient" else decision.cusum).get(name)
            t = decision.thresholds.get(score, {}).get(name, math.nan)
            if zs is None or not math.isfinite(t):
                continue
            z = np.asarray(zs, dtype=np.float64)
            ratio = (np.abs(z) if SIDES[name] == "both" or score == "cusum" else z) / t
            best = np.where(np.isnan(best) | (ratio > best), ratio, best)
        best[~np.asarray(sig.usable, dtype=bool)] = math.inf
        out[name] = best.tolist()
    nan = [math.nan] * decision.world  # a signal the detector does not score: NaN (as the CSV reads it)
    return {name: out.get(name, nan) for name in SIGNALS}


def step_record(sig: RankSignals, decision: Decision, *, offset: int = 0) -> dict:
    """One step's record (not encoded; NaN/inf as floats): see the module for the fields.

    Args:
        sig: the step's signals.
        decision: the step's decision (the same step).
        offset: added to every step number written, the step's and its flags' ``since`` (a file
            continued with ``append=True`` numbers its steps on from its last).

    Raises:
        UsageError: when ``sig`` and ``decision`` are for different numbers of ranks.
    """
    if sig.world != decision.world:
        raise UsageError(f"signals of {sig.world} ranks with a decision of {decision.world}", field="world",
                         value=sig.world)
    scores = _scores(sig, decision)
    keff, pi = k_eff(sig.energy)
    cands = [(math.inf, -k, "nonfinite") for k in range(sig.world) if not sig.usable[k]]
    cands += [(vals[k], -k, name) for name, vals in scores.items() for k in range(sig.world)
              if sig.usable[k] and math.isfinite(vals[k])]
    best = max(cands, default=None)  # ties: the lowest rank, then the signal name
    summary = {"max_score": best[0] if best else math.nan, "max_rank": -best[1] if best else None,
               "max_signal": best[2] if best else None, "flagged": list(decision.ranks), "k_eff": keff,
               "b_simple": sig.noise.b_simple}
    return {"type": "step", "step": decision.step + offset, "action": decision.action,
            "flagged": list(decision.ranks),
            "flags": [{"rank": f.rank, "signal": f.signal, "score": f.score, "z": f.z,
                       "threshold": f.threshold, "since": f.since + offset} for f in decision.flags],
            "where": {str(r): text for r, text in decision.where.items()},
            "summary": summary, "scores": scores, "weights": pi.tolist(),
            "transient": {k: list(v) for k, v in decision.transient.items()},
            "cusum": {k: list(v) for k, v in decision.cusum.items()}, "signals": sig.to_dict()}


def decision_scalars(monitor: Any, per_rank: bool = False) -> dict[str, float]:
    """The monitor's latest step as flat scalars (``flat_scalars`` of its ``step_record``): what the
    framework callbacks hand to their loggers.

    Args:
        monitor: a ``naig.monitor.Monitor`` that has decided at least one step.
        per_rank: add the ``rank{k}/...`` series.

    Raises:
        UsageError: before the monitor's first decision.
    """
    if monitor.decision is None:
        raise UsageError("the monitor has not decided a step yet", field="monitor")
    return flat_scalars(step_record(monitor.signals, monitor.decision), per_rank)


def flat_scalars(record: dict, per_rank: bool = False) -> dict[str, float]:
    """A step record as flat scalar keys under ``PREFIX`` (the TensorBoard and logger view).

    Args:
        record: a ``step_record``.
        per_rank: add ``rank{k}/...`` series (scores per signal, weight, rel_norm, cos, energy).
    """
    s = record["summary"]
    out = {f"{PREFIX}step": float(record["step"]), f"{PREFIX}max_score": float(s["max_score"]),
           f"{PREFIX}max_rank": math.nan if s["max_rank"] is None else float(s["max_rank"]),
           f"{PREFIX}k_eff": float(s["k_eff"]), f"{PREFIX}flagged_ranks": float(len(s["flagged"])),
           f"{PREFIX}b_simple": float(s["b_simple"])}
    if per_rank:
        sig = record["signals"]
        for k in range(sig["world"]):
            for name, vals in record["scores"].items():
                out[f"{PREFIX}rank{k}/score_{name}"] = float(vals[k])
            out[f"{PREFIX}rank{k}/weight"] = float(record["weights"][k])
            for q in ("rel_norm", "cos", "energy"):
                out[f"{PREFIX}rank{k}/{q}"] = float(sig[q][k])
    return out
