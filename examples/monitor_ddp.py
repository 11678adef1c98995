"""Find a bad rank in plain DistributedDataParallel training with ``naig.monitor.MonitorHook``.

Every rank trains the small byte-level GPT (``gpt-nano``) on its own minibatches of the standard
library's ``.py`` files under DDP (gloo, CPU). The hook reads each rank's gradient in DDP's
communication hook, before the all-reduce, and every rank decides the same thing at every step.
With ``--fault-rank R`` rank R corrupts one weight's gradient at ``--fault-step`` with a kind of
``naig.faults`` (``--fault KIND[:ARG]``: ``nan:1`` one NaN entry, ``scale:1000``, ``signflip:1``,
``bitflip32:30``, ...) and rank 0 prints the step's decision: the rank, its host, the bucket and
parameters, the test that fired; with the default action ``skip`` no rank applies that step. With
``--action raise`` every rank stops before that step's update and the script exits 1 with the
step's line (``error: step N: rank R ...``).

One machine (this process is rank 0 and starts the others):

    python examples/monitor_ddp.py --nproc 4 --fault-rank 2 --fault nan:1

Under torchrun (one or several machines; the same script):

    torchrun --nproc-per-node 4 examples/monitor_ddp.py --fault-rank 2 --fault scale:1000

``--comm-hook bf16`` / ``powersgd`` composes the monitor with torch's own DDP hooks: the monitor
reads each bucket, then that hook compresses and reduces it (``MonitorHook(comm_hook=...)``).

The detectors score each rank against the others (needs 4 ranks or more to see anything but
enormous departures) and against its own last ``--window`` steps (from step window + 1 on), so
the default fault step comes after the window. A sign flip is visible only when the ranks'
gradients agree (large batches); with the small default batch it is inside the noise.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel

from naig.distributed.launch import ENV_STORE, process_group, under_launcher
from naig.errors import UsageError, run_main
from naig.faults import corrupted, parse_kind
from naig.monitor import ACTIONS, BadRankError, Decision, Monitor, MonitorHook, RankSignals
from naig.simulate.data import ByteData, load_bytes
from naig.simulate.model import GPT, get_preset, lm_loss
from naig.threads import DEFAULT_THREADS, check_threads


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
    p.add_argument("--action", choices=ACTIONS, default="skip",
                   help="skip (default): no update from a flagged step; log lets a NaN poison the mean")
    p.add_argument("--exact", action="store_true", help="exact cos and distance from the all-reduced mean")
    p.add_argument("--comm-hook", choices=("none", "bf16", "powersgd"), default="none",
                   help="torch's DDP hook that reduces each bucket after the monitor has read it")
    p.add_argument("--fault-rank", type=int, default=None, help="this rank corrupts its gradient")
    p.add_argument("--fault", default=None, metavar="KIND[:ARG]",
                   help="a kind of naig.faults, e.g. nan:1 (one NaN entry; the default), scale:1000, "
                   "signflip:1 (needs --fault-rank)")
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
    args.fault = "nan:1" if args.fault is None else args.fault
    if args.fault_step is None:
        args.fault_step = args.window + 4
    world = int(os.environ.get("WORLD_SIZE", args.nproc))
    _in(args.nproc, 1, None, "--nproc", "processes on this machine")
    _in(args.steps, 1, None, "--steps", "training steps")
    if args.fault_rank is not None:
        _in(args.fault_rank, 0, world - 1, "--fault-rank", f"a rank of the {world}")
        _in(args.fault_step, 1, args.steps, "--fault-step", f"a step of --steps {args.steps}")
    args.fault = parse_kind(args.fault, field="--fault")
    return args


def main(argv: list[str]) -> None:
    args = _args(argv)
    local_child = under_launcher() and os.environ.get(ENV_STORE) == "1"  # a rank this script started
    with process_group(args.nproc, [sys.executable, __file__, *argv]) as (rank, world):
        stopped = _train(args, rank, world)  # the DDP objects die with the function, before the group does
    if stopped is not None and not local_child:  # --action raise stopped training: exit 1 (run_main)
        raise stopped  # on every rank under torchrun; here on rank 0, once its ranks have ended


def _corrupt(args: argparse.Namespace, rank: int, step: dict) -> object:
    """A gradient hook that corrupts this rank's gradient at the fault step (before DDP sees it)."""
    gen = torch.Generator().manual_seed(rank)

    def hook(g: torch.Tensor) -> torch.Tensor:
        if rank != args.fault_rank or step["now"] != args.fault_step:
            return g
        return corrupted(g, *args.fault, gen)
    return hook


def _comm_hook(name: str) -> dict:
    """The ``comm_hook``/``comm_state`` of ``MonitorHook`` for ``--comm-hook`` (none: DDP's all-reduce)."""
    if name == "bf16":
        return {"comm_hook": default_hooks.bf16_compress_hook}
    if name == "powersgd":
        state = powerSGD_hook.PowerSGDState(None, matrix_approximation_rank=1, start_powerSGD_iter=2)
        return {"comm_hook": powerSGD_hook.powerSGD_hook, "comm_state": state}
    return {}


def _train(args: argparse.Namespace, rank: int, world: int) -> BadRankError | None:
    """Train; the BadRankError that stopped it (``--action raise``), or None."""
    torch.manual_seed(0)
    cfg = get_preset("gpt-nano")
    data = ByteData.from_bytes(load_bytes(None, args.data_bytes))
    model = GPT(cfg, generator=torch.Generator().manual_seed(0))
    ddp = DistributedDataParallel(model)
    opt = torch.optim.Adam(ddp.parameters(), lr=args.lr)
    flagged: list[Decision] = []

    def report(sig: RankSignals, decision: Decision) -> None:
        if rank == 0 and decision.flagged:
            flagged.append(decision)
            print(decision.describe(), flush=True)

    monitor = Monitor(window=args.window, action=args.action, batch=args.batch_size, callback=report)
    hook = MonitorHook(model, monitor=monitor, exact=args.exact, **_comm_hook(args.comm_hook)).register(ddp)
    hook.attach(opt)
    step = {"now": 0}
    if args.fault_rank is not None:
        model.blocks[0].linear1.weight.register_hook(_corrupt(args, rank, step))
    gen = torch.Generator().manual_seed(1_000 + rank)  # each rank its own minibatches
    losses = []
    stopped: BadRankError | None = None
    for step["now"] in range(1, args.steps + 1):
        x, y = data.batch("train", args.batch_size, cfg.context, gen)
        opt.zero_grad()
        loss = lm_loss(ddp(x), y)
        loss.backward()
        try:
            opt.step()
        except BadRankError as exc:  # every rank alike; main raises it once the summary is written
            stopped = exc
            break
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss)
        losses.append(float(mean_loss) / world)
    if rank == 0:
        sig = monitor.signals
        kinds = "exact" if "cos" in sig.exact else "sketched"
        print(f"{world} ranks, {hook.step} steps, action {args.action}: {len(flagged)} flagged step(s); "
              f"cos and distance {kinds}; {hook.extra_bytes} B per rank per step beyond DDP's "
              f"({len(hook.parts)} bucket(s)); mean train loss {_mean(losses)}")
        for d in flagged:
            print(f"bad rank: {', '.join(f'{r} ({d.hosts[r]})' for r in d.ranks)} at step {d.step}")
    return stopped


def _mean(losses: list[float]) -> str:
    """The mean of the applied steps' losses, or – when training stopped before the first."""
    return f"{statistics.fmean(losses):.4f}" if losses else "–"


if __name__ == "__main__":
    run_main(main, sys.argv[1:])
