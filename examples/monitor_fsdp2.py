"""Find a bad rank in FSDP2 (``fully_shard``) training with ``naig.monitor.fsdp.fully_shard_monitor``.

Every rank trains the small byte-level GPT (``gpt-nano``), each transformer block and the root
sharded with ``fully_shard``, on its own minibatches (gloo on CPU, NCCL on GPUs). The monitor
replaces each FSDP module's reduce-scatter with one that first sketches this rank's unsharded
gradient, then calls FSDP's own; every rank decides the same thing after the step's last
module. With ``--fault-rank R`` rank R corrupts its whole gradient at ``--fault-step`` through its
loss, with a kind of ``naig.faults`` that a loss factor gives (``--fault``: ``nan``, ``inf``,
``scale:A``, ``signflip:A``: the loss times NaN, inf, A or −A); rank 0 prints the decision (rank,
host, FSDP module, test). With ``--action raise`` every rank stops before that step's update and
the script exits 1 with the step's line (``error: step N: rank R ...``; under torchrun on every rank).

Under torchrun (the intended launcher; one or several machines):

    torchrun --nproc-per-node 4 examples/monitor_fsdp2.py --fault-rank 2 --fault scale:1000

One machine without torchrun (this process is rank 0 and starts the others):

    python examples/monitor_fsdp2.py --nproc 4 --fault-rank 2 --fault nan
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

from naig.distributed.launch import ENV_STORE, backend_for, process_group, under_launcher
from naig.errors import UsageError, run_main
from naig.faults import parse_kind
from naig.monitor import BadRankError, Decision, Monitor, RankSignals
from naig.monitor.fsdp import fully_shard_monitor
from naig.simulate.data import ByteData, load_bytes
from naig.simulate.model import GPT, get_preset, lm_loss
from naig.threads import DEFAULT_THREADS, check_threads

LOSS_FAULTS = ("nan", "inf", "scale", "signflip")  # the kinds of naig.faults a loss factor gives


def _factor(kind: str, arg: float | None) -> float:
    """The loss factor of a fault of the whole gradient (``LOSS_FAULTS``; nan and inf: every entry)."""
    return {"nan": math.nan, "inf": math.inf, "scale": arg, "signflip": -(arg or 0.0)}[kind]


def _in(value: int, low: int, high: int | None, option: str, why: str) -> None:
    """Refuse ``option value`` outside [low, high] (no upper bound: None) in one line (``UsageError``)."""
    if value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"in {low}..{high}"
        raise UsageError(f"{option} {value}: must be {bound} ({why})")


def _args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nproc", type=int, default=4, help="ranks on this machine (without torchrun)")
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--window", type=int, default=8, help="the detectors' per-rank history")
    p.add_argument("--action", choices=("log", "warn", "skip", "raise"), default="skip",
                   help="skip (default): no update from a flagged step (exclude: DDP only)")
    p.add_argument("--fault-rank", type=int, default=None, help="this rank corrupts its gradient")
    p.add_argument("--fault", default=None, metavar="KIND[:ARG]",
                   help="nan (the default), inf (every entry), scale:A or signflip:A (naig.faults), e.g. "
                   "scale:1000 (needs --fault-rank)")
    p.add_argument("--fault-step", type=int, default=None, help="default: window + 4")
    p.add_argument("--data-bytes", type=int, default=300_000)
    p.add_argument("--threads", type=int, default=DEFAULT_THREADS,
                   help="torch CPU threads per rank (default 1: a model this small only loses time to more)")
    args = p.parse_args(argv)
    torch.set_num_threads(check_threads(args.threads, "--threads"))
    if args.fault_rank is None and (args.fault is not None or args.fault_step is not None):
        given = "--fault" if args.fault is not None else "--fault-step"
        raise UsageError(f"{given} needs --fault-rank R, the rank that corrupts its gradient (without it no "
                         "rank is faulty)")
    args.fault = "nan" if args.fault is None else args.fault
    if args.fault_step is None:
        args.fault_step = args.window + 4
    world = int(os.environ.get("WORLD_SIZE", args.nproc))
    _in(args.nproc, 1, None, "--nproc", "processes on this machine")
    _in(args.steps, 1, None, "--steps", "training steps")
    if args.fault_rank is not None:
        _in(args.fault_rank, 0, world - 1, "--fault-rank", f"a rank of the {world}")
        _in(args.fault_step, 1, args.steps, "--fault-step", f"a step of --steps {args.steps}")
    args.fault = parse_kind(args.fault, LOSS_FAULTS, field="--fault")
    if args.fault[0] in ("nan", "inf") and args.fault[1] is not None:
        raise UsageError(f"--fault {args.fault[0]}:{args.fault[1]:g}: through the loss every entry turns "
                         f"{args.fault[0]}; use {args.fault[0]} (a count needs a gradient hook: "
                         "examples/monitor_ddp.py)")
    return args


def main(argv: list[str]) -> None:
    args = _args(argv)
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    argv_ranks = [sys.executable, __file__, *argv]
    local_child = under_launcher() and os.environ.get(ENV_STORE) == "1"  # a rank this script started
    with process_group(args.nproc, argv_ranks, backend=backend_for(device)) as (rank, world):
        if device.type == "cuda":
            device = torch.device("cuda", rank % torch.cuda.device_count())
            torch.cuda.set_device(device)
        stopped = _train(args, rank, world, device)
    if stopped is not None and not local_child:  # --action raise stopped training: exit 1 (run_main)
        raise stopped  # on every rank under torchrun; here on rank 0, once its ranks have ended


def _train(args: argparse.Namespace, rank: int, world: int, device: torch.device) -> BadRankError | None:
    """Train; the BadRankError that stopped it (``--action raise``), or None."""
    cfg = get_preset("gpt-nano")
    data = ByteData.from_bytes(load_bytes(None, args.data_bytes))
    model = GPT(cfg, generator=torch.Generator().manual_seed(0)).to(device)
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    flagged: list[Decision] = []

    def report(sig: RankSignals, decision: Decision) -> None:
        if rank == 0 and decision.flagged:
            flagged.append(decision)
            print(decision.describe(), flush=True)

    monitor = Monitor(window=args.window, action=args.action, batch=args.batch_size, callback=report)
    watch = fully_shard_monitor(model, monitor).attach(opt)
    gen = torch.Generator().manual_seed(1_000 + rank)  # each rank its own minibatches
    losses = []
    stopped: BadRankError | None = None
    for step in range(1, args.steps + 1):
        x, y = (t.to(device) for t in data.batch("train", args.batch_size, cfg.context, gen))
        factor = _factor(*args.fault) if rank == args.fault_rank and step == args.fault_step else 1.0
        opt.zero_grad()
        loss = lm_loss(model(x), y)
        (loss * factor).backward()
        try:
            opt.step()
        except BadRankError as exc:  # every rank alike; main raises it once the summary is written
            stopped = exc
            break
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss)
        losses.append(float(mean_loss) / world)
    if rank == 0:
        print(f"{world} ranks, {watch.step} steps, action {args.action}: {len(flagged)} flagged step(s); "
              f"cos and distance sketched; {watch.extra_bytes} B per rank per step beyond FSDP's "
              f"({len(watch.comms)} FSDP modules); mean train loss {_mean(losses)}")
        for d in flagged:
            print(f"bad rank: {', '.join(f'{r} ({d.hosts[r]})' for r in d.ranks)} at step {d.step}")
    return stopped


def _mean(losses: list[float]) -> str:
    """The mean of the applied steps' losses, or – when training stopped before the first."""
    return f"{statistics.fmean(losses):.4f}" if losses else "–"


if __name__ == "__main__":
    run_main(main, sys.argv[1:])
