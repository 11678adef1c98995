"""Train the small byte-level GPT under DistributedDataParallel with NAIG's communication hook.

Every rank trains the same GPT (naig.simulate.model, ``gpt-nano``) on its own minibatch
stream of the standard library's ``.py`` files; DDP averages the gradients; the hook
(``naig.distributed.NaigCommHook``) sketches each rank's bucket, shares the 14 floats,
and logs E_k (against the mean sketch), cos to the all-reduced bucket and π_k for every
rank. With ``--route`` it also scales each rank's bucket by K·π_k before the mean.

One machine (this process is rank 0 and starts the others):

    python examples/ddp_gpt.py --nproc 3 --steps 50 [--route] [--csv ddp.csv]

Several machines (torchrun starts every rank; the same script):

    torchrun --nnodes 2 --nproc-per-node 4 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
        examples/ddp_gpt.py --steps 500

Rank 0 prints the training loss and the hook's E, cos and π every ``--every`` steps, then
the validation loss before and after.
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from naig.distributed import HookRecord, NaigCommHook
from naig.distributed.launch import process_group
from naig.errors import run_main
from naig.simulate.data import ByteData, load_bytes
from naig.simulate.model import GPT, get_preset, lm_loss
from naig.threads import check_threads


def _args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nproc", type=int, default=3, help="ranks on this machine (without torchrun)")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--route", action="store_true", help="scale each rank's bucket by K·π_k")
    p.add_argument("--beta", default="auto")
    p.add_argument("--csv", default=None, help="rank 0 writes the hook's records here")
    p.add_argument("--every", type=int, default=10, help="print every N steps")
    p.add_argument("--data-bytes", type=int, default=500_000)
    p.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads per rank (default 1: a model this small only loses time to more)")
    return p.parse_args(argv)


def _summary(records: list[HookRecord]) -> str:
    """E, cos and π per rank, averaged over the step's buckets."""
    k = len(records[0].pi)

    def avg(field: str) -> str:
        vals = [statistics.fmean(getattr(r, field)[i] for r in records) for i in range(k)]
        return " ".join(f"{v:.3g}" for v in vals)

    cos = " ".join(f"{statistics.fmean(r.cos[i] for r in records):.3f}" for i in range(k))
    return f"E {avg('energies')} | cos {cos} | π {avg('pi')}"


def main(argv: list[str]) -> None:
    args = _args(argv)
    with process_group(args.nproc, [sys.executable, __file__, *argv]) as (rank, world):
        _train(args, rank, world)  # the DDP objects die with the function, before the group does


def _train(args: argparse.Namespace, rank: int, world: int) -> None:
    torch.set_num_threads(check_threads(args.threads, "--threads"))
    torch.manual_seed(0)
    cfg = get_preset("gpt-nano")
    data = ByteData.from_bytes(load_bytes(None, args.data_bytes))
    model = GPT(cfg, generator=torch.Generator().manual_seed(0))
    ddp = DistributedDataParallel(model)
    hook = NaigCommHook(model, route=args.route, beta=args.beta, csv_path=args.csv).register(ddp)
    opt = torch.optim.Adam(ddp.parameters(), lr=args.lr)
    gen = torch.Generator().manual_seed(1_000 + rank)  # each rank its own minibatches
    val_gen = torch.Generator().manual_seed(99)
    val = [data.batch("val", 16, cfg.context, val_gen) for _ in range(4)]

    @torch.no_grad()
    def evaluate() -> float:
        return statistics.fmean(float(lm_loss(model(x), y)) for x, y in val)

    before = evaluate()
    for step in range(1, args.steps + 1):
        x, y = data.batch("train", args.batch_size, cfg.context, gen)
        opt.zero_grad()
        loss = lm_loss(ddp(x), y)
        loss.backward()
        opt.step()
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss)
        if rank == 0 and (step % args.every == 0 or step == args.steps):
            train = float(mean_loss) / world
            print(f"step {step:4d}  train {train:.4f}  {_summary(hook.last)}", flush=True)
    if rank == 0:
        mode = "routed (K·π_k)" if args.route else "watched (plain DDP mean)"
        print(f"{world} ranks, {mode}: validation loss {before:.4f} -> {evaluate():.4f} nats/byte")


if __name__ == "__main__":
    run_main(main, sys.argv[1:])
