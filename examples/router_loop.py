"""naig.Router in a real (small) asynchronous training loop, next to the plain mean (Hogwild!).

A small MLP learns a smooth regression target. Four simulated workers each compute a
gradient on their own minibatch, at a stale copy of the parameters: worker k's
staleness τ_k is drawn afresh every step (0..``--max-lag``), as a real asynchronous
server sees it. The server combines the K gradients with

    pi = router.weights(grads, staleness=taus)   # Gibbs weights of the Fano–Fisher energy
    g_hat = router.combine(grads, pi)            # Σ_k π_k g_k

and hands ĝ to an unchanged torch optimizer; the Hogwild! run uses the uniform mean on
the same minibatches and staleness draws. Both runs print their validation loss; the
script makes no claim about which wins (``naig simulate`` is the controlled comparison).
With ``--save DIR`` the last step's worker gradients are written with ``save_gradients``
(metadata ``lag``, ``step``, ``worker``) and can be audited:
``naig audit DIR/ref.safetensors DIR``.

Usage: python examples/router_loop.py [--steps 200] [--max-lag 8] [--seed 0] [--save DIR]
"""

from __future__ import annotations

import argparse
import copy
import sys
from collections import deque
from pathlib import Path

import torch

import naig
from naig.errors import run_main
from naig.io import save_gradients
from naig.threads import check_threads

WORKERS = 4


def make_data(gen: torch.Generator, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(n, 8) inputs and (n, 1) targets y = sin(x·w) + 0.05 noise."""
    x = torch.randn(n, 8, generator=gen)
    w = torch.linspace(-1, 1, 8)
    return x, torch.sin(x @ w).unsqueeze(1) + 0.05 * torch.randn(n, 1, generator=gen)


def make_model(seed: int) -> torch.nn.Module:
    """The same initialisation for a seed; the global torch RNG is left as it was."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))


def worker_gradient(model: torch.nn.Module, params: dict, x: torch.Tensor, y: torch.Tensor) -> dict:
    """The gradient a worker sends: computed at its (stale) copy ``params`` of the weights."""
    model.load_state_dict(params)
    model.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def train(rule: str, args: argparse.Namespace, save: Path | None = None) -> list[float]:
    """Run one training loop; returns the validation loss every 25 steps and at the end."""
    data_gen = torch.Generator().manual_seed(args.seed)
    x_val, y_val = make_data(torch.Generator().manual_seed(10_000 + args.seed), 512)
    tau_gen = torch.Generator().manual_seed(20_000 + args.seed)
    model, worker = make_model(args.seed), make_model(args.seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    router = naig.Router(lags=None, beta="auto", seed=args.seed)
    history = deque([copy.deepcopy(model.state_dict())], maxlen=args.max_lag + 1)  # θ_t, θ_{t−1}, ...
    losses = []
    for step in range(args.steps):
        taus = torch.randint(0, args.max_lag + 1, (WORKERS,), generator=tau_gen).tolist()
        taus = [min(t, len(history) - 1) for t in taus]  # no version older than θ_0
        batches = [make_data(data_gen, 32) for _ in range(WORKERS)]
        grads = [worker_gradient(worker, history[-1 - t], *b) for t, b in zip(taus, batches, strict=True)]
        pi = router.weights(grads, staleness=taus) if rule == "naig" else [1 / WORKERS] * WORKERS
        g_hat = router.combine(grads, pi)
        for name, p in model.named_parameters():
            p.grad = g_hat[name]
        optimizer.step()
        history.append(copy.deepcopy(model.state_dict()))
        if step % 25 == 0 or step == args.steps - 1:
            with torch.no_grad():
                losses.append(torch.nn.functional.mse_loss(model(x_val), y_val).item())
        if save is not None and step == args.steps - 1:
            _save(save, grads, taus, step)
    return losses


def _save(folder: Path, grads: list[dict], taus: list[int], step: int) -> None:
    ref = min(range(WORKERS), key=lambda k: (taus[k], k))  # the Router's reference: least stale
    save_gradients(folder / "ref.safetensors", grads[ref], lag=taus[ref], step=step, worker=ref)
    for k, (g, tau) in enumerate(zip(grads, taus, strict=True)):
        save_gradients(folder / f"worker{k}.safetensors", g, lag=tau, step=step, worker=k)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--max-lag", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--save", type=Path, default=None, help="write the last step's gradients here")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (default 1: a model this small only loses time to more)")
    args = parser.parse_args(argv)
    torch.set_num_threads(check_threads(args.threads, "--threads"))
    for rule in ("naig", "hogwild"):
        losses = train(rule, args, save=args.save if rule == "naig" else None)
        trace = " ".join(f"{v:.4f}" for v in losses)
        print(f"{rule:8s} validation MSE every 25 steps: {trace}")


if __name__ == "__main__":
    run_main(main, sys.argv[1:])
