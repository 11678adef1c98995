"""Ranks for tests/test_detect_live.py: ``naig.detect.live.run_cell`` on 3 real gloo processes.

``python -m tests.detect_ranks OUT.json`` makes this process rank 0 of 3 and starts ranks 1 and 2.
Each trains the small GPT (2 sequences of 16 bytes per rank) for 3 clean and 4 scored steps with a
×10 fault on a random rank, calls ``Monitor.observe`` before its all-reduce and also all-gathers
the observed gradients, from which rank 0 computes the benchmark's scores (``reference=True``).
Rank 0 writes the result. Every collective waits at most 30 s.
"""

from __future__ import annotations

import json
import sys

import torch

from naig.detect.faults import FaultCell
from naig.detect.live import run_cell
from naig.detect.protocol import DetectConfig, build_workload
from naig.distributed.launch import process_group

WORLD = 3


def main(out: str) -> None:
    torch.set_num_threads(1)
    cfg = DetectConfig(ranks=WORLD, steps=4, warmup=3, window=3, calibration=1, validation=0, test=1,
                       faults=("scale",), false_alarm=0.2, batch_size=2, context=16, data_bytes=50_000)
    argv = [sys.executable, "-m", "tests.detect_ranks", out]
    with process_group(WORLD, argv, timeout=30.0) as (rank, world):
        wl = build_workload(cfg)
        run = run_cell(cfg, wl, FaultCell("scale", 10.0), 0, rank, world, warmup=3, steps=4, reference=True)
        if rank == 0:
            with open(out, "w") as fh:
                json.dump(run, fh)


if __name__ == "__main__":
    main(sys.argv[1])
