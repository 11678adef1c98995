"""The monitor: per-rank gradient signals before the data-parallel reduction, naming a bad rank.

Per-rank gradients exist only before the reduction; the monitor reads them there, shares one
small payload per rank (a 14-float sketch, ‖g‖², a non-finite count) and derives, identically on
every rank, each rank's Fano–Fisher energy, cosine and distance to the mean (exact where the
framework hands them over, sketched otherwise), norm relative to the others and the step's
gradient noise scale (``signals``); robust detectors score each rank against the others and
against its own history and name the bad rank (``detectors``); ``Monitor.observe`` does both
in a custom loop (``observe``); ``MonitorHook`` with ``monitor_comm_hook`` does it inside
``DistributedDataParallel`` (``ddp``); ``fully_shard_monitor`` inside FSDP2 (``fsdp``).
Framework integrations, one line each: ``lightning.MonitorCallback`` (a Lightning callback),
``transformers.MonitorCallback`` (a Hugging Face ``Trainer`` callback), ``accelerate.watch``
(optional extras; imported only from those modules). ``NaigCommHook`` (``routing``) is the older
DDP hook that routes the all-reduce by π.

Importing this package loads neither scipy nor the simulator.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from naig.lazy import lazy_names

# Each public name and the submodule that defines it, imported on first use (PEP 562): reading a
# log (``naig monitor report``, ``records.read_log``) then loads no torch, 0.3 s where it was 1.2.
_HOME = {
    "ddp": ("MonitorHook", "monitor_comm_hook"),
    "integration": ("GradientMonitor",),
    "detectors": ("ACTIONS", "SCORES", "SIGNALS", "BadRankError", "Decision", "Detector", "Flag",
                  "robust_threshold"),
    "observe": ("Monitor",),
    "routing": ("HookRecord", "NaigCommHook", "naig_comm_hook"),
    "signals": ("MonitorSketch", "NoiseScale", "NoiseScaleAverage", "RankSignals", "noise_scale",
                "rank_signals"),
}

if TYPE_CHECKING:
    from naig.monitor.ddp import MonitorHook, monitor_comm_hook
    from naig.monitor.detectors import (
        ACTIONS,
        SCORES,
        SIGNALS,
        BadRankError,
        Decision,
        Detector,
        Flag,
        robust_threshold,
    )
    from naig.monitor.integration import GradientMonitor
    from naig.monitor.observe import Monitor
    from naig.monitor.routing import HookRecord, NaigCommHook, naig_comm_hook
    from naig.monitor.signals import (
        MonitorSketch,
        NoiseScale,
        NoiseScaleAverage,
        RankSignals,
        noise_scale,
        rank_signals,
    )

__all__ = ["ACTIONS", "SCORES", "SIGNALS", "BadRankError", "Decision", "Detector", "Flag", "GradientMonitor",
           "HookRecord", "Monitor", "MonitorHook", "MonitorSketch", "NaigCommHook", "NoiseScale",
           "NoiseScaleAverage", "RankSignals", "monitor_comm_hook", "naig_comm_hook", "noise_scale",
           "rank_signals", "robust_threshold"]


__getattr__, __dir__ = lazy_names(__name__, _HOME, globals())
