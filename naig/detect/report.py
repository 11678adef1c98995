"""From the scores of every seed to the report: thresholds, rates with intervals, the default detector.

``evaluate`` calibrates each detector's threshold on the clean steps of the calibration seeds
(``naig.detect.calibrate.threshold``), then on the validation and test seeds measures, per
fault cell and detector, the detection rate, top-1 localisation and AUC with 95% intervals
over seeds, and on the clean test steps the false-alarm rate actually observed.

**The default detector** is the one with the highest validation score: the mean over fault
kinds of the mean over that kind's magnitudes of the detection rate on the validation seeds
(every kind weighs the same, whatever its number of magnitudes); ties go to the higher mean
AUC. The test seeds never enter that choice.

Example:
    >>> from naig.detect.protocol import DetectConfig, run_protocol
    >>> cfg = DetectConfig(ranks=3, steps=2, warmup=3, window=3, calibration=1, validation=1, test=1,
    ...                    faults=("nan",), false_alarm=0.2, batch_size=2, context=16, data_bytes=50_000)
    >>> res = evaluate(cfg, run_protocol(cfg), n_params=0, seconds=0.0)
    >>> res.rows[0]["detectors"]["nan"]["detection"][0], res.default
    (1.0, 'nan')
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from naig.detect.calibrate import auc, clopper_pearson, rate_interval, threshold
from naig.detect.faults import UNITS, FaultCell
from naig.detect.protocol import DetectConfig, SeedRun
from naig.detect.scores import DETECTORS, KINDS

__all__ = ["DetectResult", "evaluate", "cell_rates", "METRICS"]

METRICS = ("detection", "top1", "auc")


@dataclass(frozen=True)
class DetectResult:
    """A ``naig detect`` report.

    Attributes:
        config: the run.
        n_params: n, the model's parameters.
        seconds: wall time of the run.
        thresholds: detector → its calibrated threshold.
        false_alarms: detector → {flagged, total, rate, low, high} on clean test rank-steps.
        rows: per fault cell (test seeds): {fault, magnitude, unit, rel_change (median ‖Δ‖/‖g‖),
            detectors: {detector: {metric: [mean, low, high]}}}.
        kinds: fault kind → detector → mean test detection rate over its magnitudes.
        validation: detector → validation score (None without validation seeds).
        default: the detector chosen on the validation seeds (None without them).
    """

    config: DetectConfig
    n_params: int
    seconds: float
    thresholds: dict[str, float]
    false_alarms: dict[str, dict[str, float]]
    rows: list[dict]
    kinds: dict[str, dict[str, float]]
    validation: dict[str, float] | None
    default: str | None

    def to_dict(self) -> dict:
        """Plain values for ``--json`` (NaN and inf kept as floats; the CLI writes them as null)."""
        return {"config": self.config.to_dict(), "n_params": self.n_params, "seconds": self.seconds,
                "detectors": {d: {"kind": KINDS[d], "threshold": self.thresholds[d],
                                  "false_alarm": self.false_alarms[d]} for d in DETECTORS},
                "rows": self.rows, "kinds": self.kinds, "validation": self.validation,
                "default": self.default}


def cell_rates(runs: list[SeedRun], c: int, d: int, thr: float) -> dict[str, list[float]]:
    """Per seed: detection, top-1 and AUC of cell c for detector d at threshold ``thr``."""
    out: dict[str, list[float]] = {m: [] for m in METRICS}
    for run in runs:
        s = run.faulted[c, :, d, :]  # (steps, K)
        idx = np.arange(s.shape[0])
        own = s[idx, run.ranks[c]]
        others = s.copy()
        others[idx, run.ranks[c]] = -np.inf
        out["detection"].append(float(np.mean(own > thr)))
        out["top1"].append(float(np.mean(own > others.max(axis=1))))
        out["auc"].append(auc(own, run.clean[:, d, :]))
    return out


def _rows(cfg: DetectConfig, runs: list[SeedRun], thr: dict[str, float]) -> list[dict]:
    rows = []
    for c, cell in enumerate(cfg.cells):
        change = np.concatenate([r.rel_change[c] for r in runs]) if runs else np.array([math.nan])
        dets = {}
        for d, name in enumerate(DETECTORS):
            rates = cell_rates(runs, c, d, thr[name])
            dets[name] = {m: list(rate_interval(np.array(rates[m]))) for m in METRICS}
        rows.append({"fault": cell.kind, "magnitude": cell.magnitude, "unit": UNITS[cell.kind],
                     "rel_change": float(np.nanmedian(change)) if np.isfinite(change).any() else
                     (math.inf if np.isinf(change).any() else math.nan), "detectors": dets})
    return rows


def _kinds(cells: tuple[FaultCell, ...], rows: list[dict], metric: str = "detection"
           ) -> dict[str, dict[str, float]]:
    """Fault kind → detector → the mean over the kind's magnitudes of the metric's mean."""
    out: dict[str, dict[str, float]] = {}
    for kind in dict.fromkeys(c.kind for c in cells):
        mine = [r for r in rows if r["fault"] == kind]
        out[kind] = {d: float(np.nanmean([r["detectors"][d][metric][0] for r in mine])) for d in DETECTORS}
    return out


def evaluate(cfg: DetectConfig, runs: list[SeedRun], n_params: int, seconds: float) -> DetectResult:
    """Calibrate on the calibration seeds, choose on validation, report on test (see the module)."""
    by_role = {role: [r for r in runs if r.role == role] for role in ("calibration", "validation", "test")}
    cal = by_role["calibration"]
    thr = {name: threshold(np.concatenate([r.clean[:, d, :].ravel() for r in cal]), cfg.false_alarm)
           for d, name in enumerate(DETECTORS)}
    false_alarms = {}
    for d, name in enumerate(DETECTORS):
        clean = np.concatenate([r.clean[:, d, :].ravel() for r in by_role["test"]])
        flagged = int((clean > thr[name]).sum())
        rate, low, high = clopper_pearson(flagged, len(clean))
        false_alarms[name] = {"flagged": flagged, "total": len(clean), "rate": rate, "low": low, "high": high}
    rows = _rows(cfg, by_role["test"], thr)
    validation, default = None, None
    if by_role["validation"]:
        vrows = _rows(cfg, by_role["validation"], thr)
        det, area = _kinds(cfg.cells, vrows), _kinds(cfg.cells, vrows, "auc")
        validation = {d: float(np.mean([det[k][d] for k in det])) for d in DETECTORS}
        mean_auc = {d: float(np.nanmean([area[k][d] for k in area])) for d in DETECTORS}
        default = max(DETECTORS, key=lambda d: (validation[d], mean_auc[d]))
    return DetectResult(cfg, n_params, seconds, thr, false_alarms, rows, _kinds(cfg.cells, rows), validation,
                        default)
