"""The default monitor's false alarms on clean pools the protocol never used (issue 29).

docs/results/monitor-detection.md ("Targets"). ``naig detect --protocol persistent`` measures the
false-alarm rates of the default ``Monitor`` (``ndepwt/δ1``) on three clean test pools (2000
steps, 10 ranks each: batch 8, seeds 2 and 3; batch 64, seed 4). This script records further
pools exactly as the protocol records its own (``naig.detect.sequential.pool_run``: the same
model, text, learning rate and seeding scheme, pool seeds that no role of the protocol uses: 6
and 7 by default; ``--batch`` 8 or 64), replays them as the protocol replays its test pools
(``naig.detect.measure.replays``: 40 fixed subsets of K of the 10 ranks per K, the same replay
seeds' formula) and counts flagged clean steps after the warm-up at K = 3, 4, 8 and α = 10⁻³,
10⁻⁴. Nothing here is chosen: the monitor's settings are the protocol's default, fixed before
these pools existed.

It prints one JSON line per (pool, K, α), then a Markdown table of each pool's rate per 1000 and
of all pools of that batch size together (the protocol's, from ``--results``, and these), with exact
(Clopper–Pearson) 95 % intervals. Replays of one pool share its gradients, so an interval over
one pool is too narrow for the rate of another run: the spread between pools is the measure.

Run (``OMP_NUM_THREADS=1``; recordings cached in ``--cache``; on one core about 45 minutes for two
batch-8 pools, and 25–45 minutes to record each batch-64 pool plus 8 to replay it)::

    python docs/results/monitor_extra_pools.py --cache .detect-cache/extra-pools
    python docs/results/monitor_extra_pools.py --cache .detect-cache/extra-pools --batch 64 --seeds 8,9
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from pathlib import Path

import numpy as np
import torch

from naig.detect.calibrate import clopper_pearson
from naig.detect.measure import CANDIDATES, CODE_DEFAULT, false_alarms, method_names, replay_seed, replays
from naig.detect.sequential import Context, PoolSpec, SequentialConfig, pool_run

__all__ = ["main"]

PROTOCOL = {8: "protocol's seeds 2, 3", 64: "protocol's seed 4"}  # its test pools per batch size


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cache", type=Path, required=True, help="folder for the pools' recordings")
    p.add_argument("--seeds", default="6,7", help="pool seeds (the protocol uses 0-5)")
    p.add_argument("--batch", type=int, default=8, choices=(8, 64), help="batch size per rank")
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--results", type=Path, default=Path(__file__).with_name("monitor-detection.json"))
    return p.parse_args(argv)


def _pool(ctx: Context, cache: Path, seed: int, steps: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    path = cache / f"pool-{ctx.batch}-extra-{seed}-{steps}.npz"
    if not path.exists():
        t0 = time.time()
        payload, gram, weights = pool_run(ctx, PoolSpec(ctx.batch, "test", seed, steps))
        np.savez(path, payload=payload, gram=gram, weights=weights)
        print(json.dumps({"recorded": seed, "steps": steps, "seconds": round(time.time() - t0)}), flush=True)
    z = np.load(path)
    return z["payload"], z["gram"], z["weights"]


def main(argv: list[str] | None = None) -> None:
    args = _args(argv)
    torch.set_num_threads(1)
    warnings.simplefilter("ignore", UserWarning)
    args.cache.mkdir(parents=True, exist_ok=True)
    cfg, settings = SequentialConfig(), CANDIDATES[CODE_DEFAULT]
    ctx = Context(cfg, args.batch)
    counts: dict[tuple[str, int, float], tuple[int, int]] = {}
    for seed in (int(s) for s in args.seeds.split(",")):
        payload, gram, weights = _pool(ctx, args.cache, seed, args.steps)
        for k in cfg.fa_ranks:
            runs = replays(payload, gram, k, cfg.replays, replay_seed(k, seed), weights)
            for rate in cfg.fa_rates:
                row = false_alarms([method_names("monitor", r, cfg, {}, settings, rate) for r in runs],
                                   len(payload))
                counts[(f"seed {seed}", k, rate)] = (row["flagged"], row["steps"])
                print(json.dumps({"batch": args.batch, "seed": seed, "K": k, "alpha": rate,
                                  "flagged": row["flagged"], "steps": row["steps"],
                                  "per_1000": row["per_1000"]}), flush=True)
    saved = json.loads(args.results.read_text())
    for r in saved["false_alarms"]:
        if r.get("method") == "monitor" and r["batch"] == args.batch:
            counts[(PROTOCOL[args.batch], r["ranks"], r["alpha"])] = (r["flagged"], r["steps"])
    _table(counts, cfg)


def _table(counts: dict[tuple[str, int, float], tuple[int, int]], cfg: SequentialConfig) -> None:
    pools = list(dict.fromkeys(p for p, _, _ in counts))
    print("\n| K | α | " + " | ".join(pools) + " | all together (95 % interval) | [α/2, 2α] |")
    print("|---" * (len(pools) + 4) + "|")
    for k in cfg.fa_ranks:
        for rate in cfg.fa_rates:
            cells = [counts.get((p, k, rate)) for p in pools]
            flagged = sum(c[0] for c in cells if c)
            steps = sum(c[1] for c in cells if c)
            _, low, high = clopper_pearson(flagged, steps)
            each = [f"{1000 * c[0] / c[1]:.3f}" if c else "–" for c in cells]
            print(f"| {k} | {rate:g} | " + " | ".join(each) + f" | {1000 * flagged / steps:.3f} "
                  f"({1000 * low:.3f}–{1000 * high:.3f}) | {500 * rate:g}–{2000 * rate:g} |")


if __name__ == "__main__":
    main()
