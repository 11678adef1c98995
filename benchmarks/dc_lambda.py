"""How much DC-ASGD's correction changes the gradients on the default workload, per λ.

Trains the default workload (gpt-nano, lags 0,10,20,35, Adam) with ``hogwild`` and,
every ``--every`` server steps, takes each stale worker's minibatch and computes its
gradient twice: at the stale parameters θ_bak (what the worker sends, g) and at the
current θ_t (what a fresh worker would have sent, g_now). With c = g ⊙ g ⊙ (θ_t − θ_bak),
DC-ASGD sends g + λc (Zheng et al. 2017). Printed per learning rate:

- ``correction(λ)`` = ‖λ C‖_F / ‖G‖_F over the stale rows of a step (what ``dc-asgd``
  reports as ``Update.correction``, there over all rows), averaged over steps; it is
  linear in λ, so one pass gives every λ;
- λ* = Σ⟨c, g_now − g⟩ / Σ‖c‖², the λ whose correction best predicts the fresh
  gradient (least squares over all measured rows), and the residual ratio
  ‖g + λc − g_now‖ / ‖g − g_now‖ at λ* and at each λ listed (1 = no better than
  sending g; < 1: the correction moves g towards g_now).

This chose ``dc-asgd``'s default λ (docs/design.md §12).

Usage: python benchmarks/dc_lambda.py [--steps 150] [--every 5] [--lrs 1e-3,3e-3] [--seed 0]
"""

from __future__ import annotations

import argparse
import math

import torch

from naig.simulate import SimulateConfig, Workload
from naig.simulate.engines import start

__all__ = ["main"]

LAMBDAS = (0.04, 0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0)


def _grad(sim: Workload, theta: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    flat = theta.detach().clone().requires_grad_(True)
    (g,) = torch.autograd.grad(sim.loss(flat, x, y), flat)
    return g


def _measure(cfg: SimulateConfig, every: int, seed: int) -> dict[str, object]:
    """Accumulate ⟨c, r⟩, ‖c‖², ‖r‖² (r = g_now − g) and the per-step correction factor."""
    sim = Workload(cfg)
    run = start(cfg, sim, "hogwild", seed)
    gen = sim.generator(12345 + seed)
    sums = {"cr": 0.0, "cc": 0.0, "rr": 0.0}
    per_step: list[float] = []
    rows: list[tuple[torch.Tensor, torch.Tensor]] = []  # (c, r) per measured row, for residuals
    while run.t < cfg.steps:
        if run.t % every == 0 and run.t > 0:
            stale, theta = run.stale_params(), run.theta.detach()
            num = den = 0.0
            for k, lag in enumerate(run.lags.tolist()):
                if lag == 0:
                    continue
                x, y = sim.data.batch("train", cfg.batch_size, sim.model.config.context, gen)
                g, g_now = _grad(sim, stale[k], x, y), _grad(sim, theta, x, y)
                c, r = g * g * (theta - stale[k]), g_now - g
                sums["cr"] += float(torch.dot(c.double(), r.double()))
                sums["cc"] += float(torch.dot(c.double(), c.double()))
                sums["rr"] += float(torch.dot(r.double(), r.double()))
                num += float(torch.dot(c.double(), c.double()))
                den += float(torch.dot(g.double(), g.double()))
                rows.append((c, r))
            per_step.append(math.sqrt(num / den))
        run.step()
    return dict(sums=sums, per_step=per_step, rows=rows)


def _residual(rows: list[tuple[torch.Tensor, torch.Tensor]], lam: float) -> float:
    """‖λc − r‖ / ‖r‖ pooled over the rows: ‖g + λc − g_now‖ / ‖g − g_now‖."""
    num = sum(float(torch.sum((lam * c - r).double() ** 2)) for c, r in rows)
    den = sum(float(torch.sum(r.double() ** 2)) for _, r in rows)
    return math.sqrt(num / den)


def main() -> None:
    """Print correction(λ) and the residual ratio per λ, and λ*, for each learning rate."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--every", type=int, default=5)
    ap.add_argument("--lrs", default="1e-3,3e-3")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    for lr in [float(v) for v in args.lrs.split(",")]:
        cfg = SimulateConfig.from_options(lr=lr, steps=args.steps, strategies=("hogwild",))
        m = _measure(cfg, args.every, args.seed)
        s, steps = m["sums"], m["per_step"]
        lam_star = s["cr"] / s["cc"]
        factor = sum(steps) / len(steps)
        print(f"lr {lr:g}: {len(m['rows'])} stale rows at {len(steps)} steps; "
              f"‖C‖/‖G‖ per unit λ: mean {factor:.3e} (min {min(steps):.3e}, max {max(steps):.3e})")
        print(f"  λ* (least squares fit of g_now − g) = {lam_star:.3f}; residual ratio at λ*: "
              f"{_residual(m['rows'], lam_star):.4f}")
        print("  λ        correction ‖λC‖/‖G‖   residual ‖g+λc−g_now‖/‖g−g_now‖")
        for lam in LAMBDAS:
            print(f"  {lam:<8g} {100 * lam * factor:>10.3f}%          {_residual(m['rows'], lam):.4f}")


if __name__ == "__main__":
    main()
