"""Experiment A, made reproducible: four workers with identical cosine similarity, told apart by E.

An oracle gradient g* and four workers x_k = g* + δ_k (metadata lags 0, 10, 20, 35) are
built so that every drift δ_k is orthogonal to g* and has the same norm c. Hence every
worker has the same cosine similarity to the oracle, cos = ‖g*‖ / sqrt(‖g*‖² + c²):
cosine cannot tell them apart. Their sketched drifts d_k = S δ_k (docs/design.md §5, seed 0)
are placed by construction:

    lag  0: ρ = 0.05          E =  2.88   (mostly in the null space of Ψ)
    lag 10: ρ = 9.23 / 57.68  E =  9.23   (partly in the ridge: contradictory)
    lag 20: ρ = 1             E = 57.68 = E_max (wholly in the ridge: contradictory)
    lag 35: ρ = 0             E =  0      (null space: "topological rescue")

with the same ‖d_k‖² = 57.68 / (8/3) for all four. How: S is a 14 × n matrix with one
±1 per column, so u = Sᵀ diag(1/n_a) d is the minimum-norm preimage of d (S u = d,
u ⟂ ker S). The rest of δ_k lives in ker S (invisible to the sketch): a multiple of
the kernel part of g* cancels ⟨u, g*⟩, and a Gram–Schmidt direction orthogonal to it
pads the norm to c. The script writes the five files as safetensors and runs
`naig audit` on them; the audit measures cos, E, ρ and π independently.

Usage: python examples/gram_schmidt_audit.py [--out runs/experiment_a] [--beta 1]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

from naig.io import save_gradients
from naig.metric import E_MAX_FACTOR, fano_fisher_metric
from naig.sketch import SKETCH_DIM, TensorHash

SHAPES = {
    "embed.weight": (256, 32),
    "block.0.weight": (64, 32),
    "block.0.bias": (64,),
    "head.weight": (10, 64),
}
E_MAX = 57.68  # the paper's E_max for these drifts
FRICTION = {0: 0.05, 10: 9.23 / E_MAX, 20: 1.0, 35: 0.0}  # lag → ρ, by construction


def hash_layout(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Bucket a_i and sign s_i of every flat parameter (state-dict order): two (n,) arrays."""
    hs = [TensorHash.build(seed, k, 0, int(np.prod(s))) for k, s in SHAPES.items()]
    return np.concatenate([h.buckets for h in hs]), np.concatenate([h.signs for h in hs])


def target_drift(friction: float, ridge: np.ndarray, null: np.ndarray) -> np.ndarray:
    """d ∈ R^14 with ‖d‖² = E_max/(8/3) and E(d) = friction · E_max."""
    norm = np.sqrt(E_MAX / E_MAX_FACTOR)
    return norm * (np.sqrt(friction) * ridge + np.sqrt(1 - friction) * null)


def build_drifts(g: np.ndarray, rng: np.random.Generator) -> dict[int, np.ndarray]:
    """δ_k for each lag: S δ_k = d_k, ⟨δ_k, g⟩ = 0, ‖δ_k‖ = c for all k."""
    a, s = hash_layout()
    count = np.bincount(a, minlength=SKETCH_DIM)
    kernel = lambda x: x - s * np.bincount(a, s * x, SKETCH_DIM)[a] / count[a]  # noqa: E731
    psi = fano_fisher_metric()
    ridge, null = psi[:, 4] / np.linalg.norm(psi[:, 4]), np.eye(14)[0]  # range(Ψ), ker(Ψ)
    g_hat = kernel(g) / np.linalg.norm(kernel(g))
    c = np.sqrt(E_MAX / E_MAX_FACTOR)  # drift norm = sketched norm: sketch ratio 1
    drifts = {}
    for lag, rho in FRICTION.items():
        u = s * target_drift(rho, ridge, null)[a] / count[a]  # minimum-norm preimage of d
        alpha = -(u @ g) / np.linalg.norm(kernel(g))  # cancels ⟨u, g⟩ inside ker S
        w = kernel(rng.normal(size=g.size))
        w -= (w @ g_hat) * g_hat  # Gram–Schmidt against the oracle's kernel part
        pad = np.sqrt(c**2 - u @ u - alpha**2)
        drifts[lag] = u + alpha * g_hat + pad * w / np.linalg.norm(w)
    return drifts


def unflatten(x: np.ndarray) -> dict[str, torch.Tensor]:
    """Flat float64 vector → float32 state dict of ``SHAPES``."""
    out, i = {}, 0
    for name, shape in SHAPES.items():
        n = int(np.prod(shape))
        out[name] = torch.from_numpy(x[i : i + n].reshape(shape).astype(np.float32))
        i += n
    return out


def write_experiment(out: Path, seed: int = 0) -> list[Path]:
    """Write oracle.safetensors and worker_lag{τ}.safetensors into ``out``; return the paths."""
    rng = np.random.default_rng(seed)
    n = sum(int(np.prod(s)) for s in SHAPES.values())
    g = rng.normal(size=n)
    g *= (4 / 3) * np.sqrt(E_MAX / E_MAX_FACTOR) / np.linalg.norm(g)  # cos = 0.8 for all
    paths = [save_gradients(out / "oracle.safetensors", unflatten(g), step=0, worker="oracle")]
    for k, (lag, delta) in enumerate(build_drifts(g, rng).items()):
        paths.append(
            save_gradients(
                out / f"worker_lag{lag:02d}.safetensors",
                unflatten(g + delta),
                lag=lag,
                step=0,
                worker=k,
            )
        )
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description="Experiment A: cosine ties, E tells apart.")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("runs/experiment_a"),
        help="where to write the five files (default: runs/experiment_a)",
    )
    parser.add_argument("--beta", default="1", help="passed to naig audit (default 1)")
    args = parser.parse_args()
    oracle, *workers = write_experiment(args.out)
    cmd = [
        sys.executable,
        "-m",
        "naig_cli",
        "audit",
        str(oracle),
        *map(str, workers),
        "--beta",
        args.beta,
    ]
    print("$ naig audit " + " ".join(cmd[4:]), flush=True)
    raise SystemExit(subprocess.run(cmd).returncode)


if __name__ == "__main__":
    main()
