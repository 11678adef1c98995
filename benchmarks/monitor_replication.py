"""The monitor as a user attaches it, on real text: false alarms per 1000 clean steps, persistent faults.

A replication of the independent evaluation behind issue 29 (its harness is not in this repository),
written from the user documentation only (README.md, docs/monitor.md) by a fresh reviewer on
2026-12-06 and kept here so that its figures can be rerun (docs/results/monitor-detection.md,
"Independent replication"). A 2-layer byte-level transformer (d 64, 4 heads, feed-forward 256,
context 64, vocab 256: 137,216 parameters; Adam, lr 1e-3) trains under plain DDP on gloo with the
default ``Monitor()`` (``false_alarm=1e-3`` per step, action ``log``) attached as docs/monitor.md
shows (``MonitorHook(...).register(ddp)``, ``JsonlRecords``). Each rank reads its own random windows
of a text corpus (seeded by seed, rank and step). Optional faults on one rank from one step on:
``scale2`` / ``scale05`` (its loss, so its gradient, ×2 / ×0.5) and ``repeat`` (it reuses the batch
it drew at the fault's step).

Usage (one run, 4 ranks; the corpus: any bytes of real text, e.g. the standard library's sources)::

    cat $(ls /usr/lib/python3.11/*.py | LC_ALL=C sort) > corpus.bin
    OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node 4 benchmarks/monitor_replication.py \\
        train --corpus corpus.bin --seed 0 --steps 300 --batch 8 --out runs/clean_b8_s0
    ... train ... --seed 10 --steps 200 --fault scale2 --fault-rank 2 --fault-step 150 --out runs/fault_scale2
    python benchmarks/monitor_replication.py count runs     # the tables: clean/ and fault_ runs

``count`` reads every ``runs/*/monitor.jsonl``: clean runs (``clean_*``) give flagged steps after
the warm-up (steps > ``WARMUP``) per 1000 with an exact Poisson 95% interval, per batch size; fault
runs (``fault_*``) whether the faulty rank was named, the delay from the fault's step, and the other
ranks named.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from scipy.stats import chi2
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from naig.monitor import Monitor, MonitorHook
from naig.monitor.records import JsonlRecords

__all__ = ["main"]

WARMUP = 16  # the default monitor checks only non-finite values until 16 clean steps are pooled
FAULTS = ("none", "scale2", "scale05", "repeat")


class TinyGPT(nn.Module):
    """A byte-level causal transformer: (B, T) int64 bytes → (B, T, 256) logits."""

    def __init__(self, vocab: int = 256, d: int = 64, ctx: int = 64, layers: int = 2, heads: int = 4) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, batch_first=True, norm_first=True)
            for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(ctx), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        h = self.tok(x) + self.pos(torch.arange(t))
        for block in self.blocks:
            h = block(h, src_mask=self.mask[:t, :t], is_causal=True)
        return self.head(self.ln(h))


def train(a: argparse.Namespace) -> None:
    """One run under torchrun; rank 0 writes ``a.out``/monitor.jsonl."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(a.seed)
    model = TinyGPT(ctx=a.ctx)
    ddp = DistributedDataParallel(model)
    opt = torch.optim.Adam(ddp.parameters(), lr=1e-3)
    monitor = Monitor()
    if rank == 0:
        Path(a.out).mkdir(parents=True, exist_ok=True)
    writer = JsonlRecords(str(Path(a.out) / "monitor.jsonl"), overwrite=True)
    writer.attach(monitor)
    MonitorHook(model, monitor=monitor).register(ddp)
    data = np.frombuffer(Path(a.corpus).read_bytes(), dtype=np.uint8)

    def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        idx = np.random.default_rng([a.seed, rank, step]).integers(0, len(data) - a.ctx - 1, size=a.batch)
        xy = torch.from_numpy(np.stack([data[i:i + a.ctx + 1] for i in idx]).astype(np.int64))
        return xy[:, :-1], xy[:, 1:]

    faulty, fixed = a.fault != "none" and rank == a.fault_rank, None
    for step in range(1, a.steps + 1):
        on = faulty and step >= a.fault_step
        if on and a.fault == "repeat":
            fixed = fixed if fixed is not None else batch(step)
            x, y = fixed
        else:
            x, y = batch(step)
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(ddp(x).reshape(-1, 256), y.reshape(-1))
        (loss * ({"scale2": 2.0, "scale05": 0.5}.get(a.fault, 1.0) if on else 1.0)).backward()
        opt.step()
    writer.close()
    dist.destroy_process_group()


def _steps(path: Path) -> list[dict]:
    return [r for r in map(json.loads, path.read_text().splitlines()) if r.get("type") == "step"]


def poisson_interval(k: int, n: int) -> tuple[float, float]:
    """Exact (Garwood) 95% interval of a rate per 1000 from k events in n steps."""
    lo = 0.0 if k == 0 else chi2.ppf(0.025, 2 * k) / 2
    return 1000 * lo / n, 1000 * chi2.ppf(0.975, 2 * k + 2) / 2 / n


def count(root: Path) -> None:
    """Print the clean runs' false alarms per batch size and each fault run's detection."""
    clean: dict[int, list[int]] = {}
    for path in sorted(root.glob("clean_*/monitor.jsonl")):
        b = json.loads((path.parent / "args.json").read_text())["batch"]
        tested = [s for s in _steps(path) if s["step"] > WARMUP]
        flags = clean.setdefault(b, [0, 0])
        flags[0] += sum(1 for s in tested if s["flagged"])
        flags[1] += len(tested)
    print(f"{'batch':>5} {'flagged/steps':>14} {'per 1000':>9} {'95% interval':>14}")
    for b, (k, n) in sorted(clean.items()):
        lo, hi = poisson_interval(k, n)
        print(f"{b:5d} {f'{k}/{n}':>14} {1000 * k / n:9.2f} {f'{lo:.2f}-{hi:.2f}':>14}")
    for path in sorted(root.glob("fault_*/monitor.jsonl")):
        args = json.loads((path.parent / "args.json").read_text())
        bad, start, steps = args["fault_rank"], args["fault_step"], _steps(path)
        named = [s["step"] for s in steps if s["step"] >= start and bad in s["flagged"]]
        before = [s["step"] for s in steps if WARMUP < s["step"] < start and s["flagged"]]
        wrong = Counter(r for s in steps if s["step"] >= start for r in s["flagged"] if r != bad)
        delay, after = (named[0] - start if named else None), sum(s["step"] >= start for s in steps)
        print(f"{path.parent.name}: rank {bad} named {len(named)} of {after} fault steps, delay {delay}; "
              f"flagged before the fault {before}; others named {dict(wrong)}")


def _args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="mode", required=True)
    t = sub.add_parser("train", help="one run (under torchrun)")
    t.add_argument("--corpus", required=True, help="a file of real text (bytes)")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--steps", type=int, default=300)
    t.add_argument("--batch", type=int, default=8, help="sequences per rank per step")
    t.add_argument("--ctx", type=int, default=64)
    t.add_argument("--fault", default="none", choices=FAULTS)
    t.add_argument("--fault-rank", type=int, default=2)
    t.add_argument("--fault-step", type=int, default=150)
    t.add_argument("--out", required=True)
    c = sub.add_parser("count", help="the tables from the runs' records")
    c.add_argument("root", type=Path)
    return p.parse_args(argv)


def main(argv: list[str]) -> None:
    a = _args(argv)
    if a.mode == "count":
        count(a.root)
        return
    if int(os.environ.get("RANK", "0")) == 0:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "args.json").write_text(json.dumps(vars(a)))
    train(a)


if __name__ == "__main__":
    main(sys.argv[1:])
