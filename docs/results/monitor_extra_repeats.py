"""A rank that keeps reusing one batch, on fault seeds the protocol never used (issue 29).

docs/results/monitor-detection.md ("Targets"). ``naig detect --protocol persistent`` names a
repeated batch within 10 steps in 8 of its 10 test seeds (the target is 90 %); 10 seeds give an
interval of about ±25 points. This script records the repeated-batch run of further seeds exactly
as the protocol records its fault runs (``naig.detect.sequential.fault_runs``: the same model, text,
learning rate, onset at step 41 and bad rank drawn from the seed; seeds 100–129 by default, which
no role of the protocol uses: its validation seeds are 0–2, its test seeds 3–12), but 30 steps past
the onset instead of 10, and replays the default ``Monitor`` (``ndepwt/δ1``) on each: the delay to
naming the bad rank, the test that named it and wrong ranks named.

These seeds are validation data, not the protocol's test seeds: on 2026-12-07 they judged a
change of the detector that was then reverted (docs/design.md, "The CUSUM's fit at once").

It prints one line per seed, then P(named within 10 steps) with its exact 95 % interval and the
median delay. Run (about 2 minutes on one core, ``OMP_NUM_THREADS=1``; recordings cached in
``--cache``)::

    python docs/results/monitor_extra_repeats.py --cache .detect-cache/extra-repeats
"""

from __future__ import annotations

import argparse
import json
import statistics
import warnings
from pathlib import Path

import numpy as np
import torch

from naig.detect.calibrate import clopper_pearson
from naig.detect.measure import CANDIDATES, CODE_DEFAULT
from naig.detect.sequential import Context, Record, SequentialConfig, fault_runs
from naig.monitor import Monitor

__all__ = ["main"]

HORIZON = 30  # steps recorded past the onset (the protocol: 10)


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cache", type=Path, required=True, help="folder for the runs' recordings")
    p.add_argument("--seeds", default="100-129", help="fault seeds, FIRST-LAST (the protocol uses 0-12)")
    args = p.parse_args(argv)
    try:
        args.first, args.last = (int(s) for s in args.seeds.split("-"))
    except ValueError:
        p.error(f"--seeds: expected FIRST-LAST, got {args.seeds!r}")
    if not 12 < args.first <= args.last:
        p.error("--seeds: FIRST-LAST above 12 (0-12 are the protocol's validation and test seeds)")
    return args


def _run(ctx: Context, cache: Path, seed: int) -> Record:
    path = cache / f"repeat-{seed}-{HORIZON}.npz"
    if not path.exists():
        (rec,) = fault_runs(ctx, seed)
        np.savez(path, payload=rec.payload, dots=rec.dots, sq_dists=rec.sq_dists, weights=rec.weights,
                 bad=rec.bad, onset=rec.onset, skipped=rec.skipped)
    z = np.load(path)
    return Record(z["payload"], z["dots"], z["sq_dists"], int(z["bad"]), int(z["onset"]), "repeat", seed,
                  int(z["skipped"]), z["weights"])


def _named(rec: Record) -> tuple[int | None, str, int]:
    """(delay, the test that first named the bad rank, wrong ranks named from the onset on)."""
    mon = Monitor(**CANDIDATES[CODE_DEFAULT])
    delay, how, wrong = None, "-", 0
    for t in range(len(rec.payload)):
        kw = {"weights": rec.weights[t]} if mon.weights_due() else {}  # the replica check's steps
        flags = mon.decide(rec.payload[t], **kw).flags
        if t + 1 < rec.onset:
            continue
        wrong += len({f.rank for f in flags} - {rec.bad})
        hit = [f for f in flags if f.rank == rec.bad]
        if hit and delay is None:
            delay, how = t + 1 - rec.onset, f"{hit[0].signal} {hit[0].score}"
    return delay, how, wrong


def main(argv: list[str] | None = None) -> None:
    args = _args(argv)
    torch.set_num_threads(1)
    warnings.simplefilter("ignore", UserWarning)
    args.cache.mkdir(parents=True, exist_ok=True)
    ctx = Context(SequentialConfig(faults=("repeat",), horizon=HORIZON))
    delays = []
    for seed in range(args.first, args.last + 1):
        delay, how, wrong = _named(_run(ctx, args.cache, seed))
        delays.append(delay)
        print(json.dumps({"seed": seed, "delay": delay, "named_by": how, "wrong": wrong}), flush=True)
    within = sum(d is not None and d <= 10 for d in delays)
    _, low, high = clopper_pearson(within, len(delays))
    found = [d for d in delays if d is not None]
    print(f"named within 10 steps: {within} of {len(delays)} ({100 * within / len(delays):.0f} %, "
          f"95 % interval {100 * low:.0f}-{100 * high:.0f} %); within {HORIZON}: {len(found)}; median delay "
          f"{statistics.median(found) if found else '-'}")


if __name__ == "__main__":
    main()
