"""``naig detect``: which per-rank score names a bad rank, measured on real gradients (issue 20).

K ranks of the small GPT compute real gradients at a shared θ trained on the clean mean
(``protocol``); at each step every fault of a catalogue with magnitudes (``faults``) is applied
to one random rank on a copy; every detector (``scores``: norm, cosine, exact and sketched
distance, the Fano–Fisher energy, the NaN check, the monitor's combined rule) scores every
rank; thresholds are calibrated to a false-alarm rate on calibration seeds (``calibrate``), the
default detector is chosen on validation seeds and the figures are reported on test seeds
(``report``). docs/detect.md holds the measured table.
"""

from naig.detect.calibrate import auc, clopper_pearson, rate_interval, threshold
from naig.detect.faults import DEFAULT_MAGNITUDES, FAULT_KINDS, FaultCell, apply_gradient_fault, corrupt_batch
from naig.detect.protocol import DetectConfig, SeedRun, run_protocol
from naig.detect.report import DetectResult, evaluate
from naig.detect.scores import DETECTORS, KINDS, Scorer, StepStats

__all__ = ["DEFAULT_MAGNITUDES", "DETECTORS", "FAULT_KINDS", "KINDS", "DetectConfig", "DetectResult",
           "FaultCell", "Scorer", "SeedRun", "StepStats", "apply_gradient_fault", "auc", "clopper_pearson",
           "corrupt_batch", "evaluate", "run_protocol", "rate_interval", "threshold"]
