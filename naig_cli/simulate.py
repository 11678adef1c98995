"""``naig simulate``: asynchronous training with stale workers, strategies side by side (SPEC §3.3).

torch is imported inside the command only, so ``naig spectrum`` start-up stays fast.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.table import Table

from naig.errors import UsageError
from naig.gibbs import parse_beta
from naig_cli._common import handle_errors, print_json, stderr, stdout

if TYPE_CHECKING:
    from naig.simulate import SimulateResult, StrategySummary

__all__ = ["simulate"]

_DEFAULT_STRATEGIES = "naig,hogwild,staleness,sync"
_PIPE_WIDTH = 140  # table width when stdout is not a terminal (logs, files)


@handle_errors
def simulate(
    lags: str = typer.Option("0,10,20,35", "--lags", help="Worker lags τ_k: ints ≥ 0."),
    strategies: str = typer.Option(
        _DEFAULT_STRATEGIES, "--strategies",
        help="Comma list of: sync, hogwild, naig, staleness, dc-asgd, naig-exact."),
    steps: int = typer.Option(150, "--steps", help="Server steps per run."),
    seeds: int = typer.Option(2, "--seeds", help="Number of seeds (0..N-1)."),
    lr: float = typer.Option(3e-3, "--lr", help="Learning rate."),
    optimizer: str = typer.Option("adam", "--optimizer", help="sgd or adam."),
    beta: str = typer.Option("auto", "--beta", help="Gibbs β: auto or a float ≥ 0."),
    dc_lambda: float = typer.Option(0.04, "--dc-lambda", help="DC-ASGD λ."),
    batch_size: int = typer.Option(8, "--batch-size", help="Sequences per worker minibatch."),
    eval_every: int = typer.Option(50, "--eval-every", help="Validate every N steps (0: at end)."),
    device: str = typer.Option("cpu", "--device", help="cpu, cuda or auto."),
    model: str = typer.Option("gpt-nano", "--model", help="gpt-nano, gpt-micro or gpt2-124m."),
    data: str = typer.Option(None, "--data", help="Text file (default: the stdlib's .py files)."),
    data_bytes: int = typer.Option(2_000_000, "--data-bytes", help="Use the first N bytes."),
    sketch_seed: int = typer.Option(0, "--seed", help="Sketch seed."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON document on stdout."),
    plot: str = typer.Option(None, "--plot", help="Write validation curves to PATH.png."),
    save_grads: str = typer.Option(None, "--save-grads", help="Directory for gradient files."),
    save_at: str = typer.Option(None, "--save-at", help="Steps to save at, e.g. 50 or 50,100."),
) -> None:
    """Train a byte-level GPT with stale workers; compare NAIG routing with baselines."""
    from naig.simulate import SimulateConfig, parse_int_list, parse_lags, run_simulation

    if plot is not None and importlib.util.find_spec("matplotlib") is None:
        raise UsageError("--plot needs matplotlib; install it with pip install 'naig[plot]'")
    config = SimulateConfig(
        lags=parse_lags(lags), strategies=tuple(s.strip() for s in strategies.split(",")),
        steps=steps, seeds=seeds, lr=lr, optimizer=optimizer, beta=parse_beta(beta),
        dc_lambda=dc_lambda, batch_size=batch_size, eval_every=eval_every, device=device,
        model=model, data=data, data_bytes=data_bytes, sketch_seed=sketch_seed,
        save_grads=save_grads, save_at=parse_int_list(save_at, "--save-at") if save_at else (),
    )
    config.validate()
    with _progress(config.total_steps) as tick:
        result = run_simulation(config, tick)
    if plot is not None:
        _plot(result, plot)
    print_json(result.to_dict()) if json_out else _render(result)


@contextlib.contextmanager
def _progress(total: int) -> Iterator[Callable[[], None]]:
    """A rich progress bar on stderr when it is a TTY; a no-op callback otherwise."""
    if not sys.stderr.isatty():
        yield lambda: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    with Progress("simulate", BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                  console=stderr, transient=True) as bar:
        task = bar.add_task("steps", total=total)
        yield lambda: bar.advance(task)


def _pi_cell(s: StrategySummary) -> str:
    return " ".join(f"{p:.3f}" for p in s.mean_pi)


def _change(s: StrategySummary) -> str:
    if s.change_vs_hogwild_pct is None or s.strategy == "hogwild":
        return "—"
    c = s.change_vs_hogwild_pct
    return f"[{'green' if c < 0 else 'red'}]{c:+.2f}%[/]"


def _render(r: SimulateResult) -> None:
    c = r.config
    out = stdout if stdout.is_terminal else Console(highlight=False, width=_PIPE_WIDTH)
    out.print(
        f"model {c.model} (n = {r.n_params:,} parameters) on {r.device}; K = {len(c.lags)} "
        f"workers, lags {','.join(map(str, c.lags))}; {c.steps} steps × {c.seeds} seed(s); "
        f"{c.optimizer} lr {c.lr:g}, batch {c.batch_size}/worker; β {c.beta}"
    )
    out.print(f"untrained validation loss {r.untrained_val_loss:.4f} nats/byte (ln 256 = 5.5452)")
    t = Table(title="naig simulate: final validation loss (nats/byte), lower is better")
    pi_head = f"mean π per worker (lags {' '.join(map(str, c.lags))})"
    for col in ("strategy", "val loss (mean ± std)", "vs hogwild", pi_head,
                "frozen", "K_eff", "annealing H first→last", "ms/step"):
        t.add_column(col, justify="left" if col.startswith(("strategy", "mean")) else "right")
    for s in r.summaries:
        t.add_row(s.strategy, f"{s.val_loss_mean:.4f} ± {s.val_loss_std:.4f}", _change(s),
                  _pi_cell(s), f"{s.frozen_fraction:.1%}", f"{s.k_eff:.2f}",
                  f"{s.entropy_first:.3f} → {s.entropy_last:.3f}", f"{s.ms_per_step:.1f}")
    out.print(t)
    out.print(
        f"routing signal {r.routing_bytes} B per worker per step vs full gradient "
        f"{r.gradient_bytes:,} B (compression n/14 = {r.n_params / 14:,.0f}×)"
    )
    for path in r.saved_files[:1]:
        out.print(f"gradients saved ({len(r.saved_files)} files), e.g. {path}")


def _plot(r: SimulateResult, path: str) -> None:
    """Validation curves (mean over seeds) per strategy, written to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for s in r.summaries:
        ax.plot(*zip(*s.curve, strict=True), label=s.strategy, marker="o", ms=3)
    ax.set(xlabel="server step", ylabel="validation loss (nats/byte)",
           title=f"lags {','.join(map(str, r.config.lags))}, {r.config.seeds} seed(s)")
    ax.legend()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
