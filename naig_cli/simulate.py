"""``naig simulate``: asynchronous training with stale workers, strategies side by side.

The library side is ``naig.simulate`` (docs/design.md §8). torch is imported inside the
command only, so ``naig spectrum`` start-up stays fast.
"""

from __future__ import annotations

import importlib.util
import io
import sys
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from naig.errors import UsageError
from naig_cli._common import (
    BetaOpt,
    Device,
    DownlinkOpt,
    JsonOpt,
    Mode,
    Model,
    ModeOpt,
    Optimizer,
    UplinkOpt,
    WindowOpt,
    fail,
    fmt_num,
    handle_errors,
    opt,
    print_json,
    progress,
    stderr,
    stdout,
)

if TYPE_CHECKING:
    from naig.simulate import RunResult, SimulateConfig, SimulateResult, StepEvent, StrategySummary

__all__ = ["simulate"]

_DEFAULT_STRATEGIES = "naig,hogwild,staleness,sync"


class Reference(str, Enum):
    """``--reference`` choices (naig.simulate.config.REFERENCES)."""

    auto = "auto"
    batch = "batch"
    ema = "ema"


# --- distributed engine (naig.distributed) ---
class Engine(str, Enum):
    """``--engine`` choices."""

    simulated = "simulated"
    distributed = "distributed"
# --- end distributed engine ---


@handle_errors
def simulate(
    lags: Annotated[str, opt("--lags", "Worker lags τ_k: comma list of ints >= 0.")] = "0,10,20,35",
    strategies: Annotated[str, opt(
        "--strategies", "Comma list of: sync, hogwild, naig, staleness, dc-asgd, naig-exact.")
    ] = _DEFAULT_STRATEGIES,
    steps: Annotated[int, opt("--steps", "Server steps per run.")] = 150,
    seeds: Annotated[int, opt("--seeds", "Number of seeds (0..N-1).")] = 2,
    lr: Annotated[str, opt(
        "--lr", "Learning rate, or a comma list: each strategy's is chosen on validation, "
        "reported on a test split (80/10/10).")] = "3e-3",
    optimizer: Annotated[Optimizer, opt("--optimizer", "Server optimizer.")] = Optimizer.adam,
    beta: BetaOpt = "auto",
    dc_lambda: Annotated[float, opt("--dc-lambda", "DC-ASGD λ.")] = 0.04,
    batch_size: Annotated[int, opt("--batch-size", "Sequences per worker minibatch.")] = 8,
    eval_every: Annotated[int, opt("--eval-every", "Validate every N steps (0: at the end).")] = 50,
    device: Annotated[Device, opt("--device", "Where to train.")] = Device.cpu,
    model: Annotated[Model, opt("--model", "Model preset.")] = Model.gpt_nano,
    data: Annotated[str | None, opt("--data", "Text file (default: the stdlib's .py files).")] = None,
    data_bytes: Annotated[int, opt("--data-bytes", "Use the first N bytes of the text.")] = 2_000_000,
    sketch_seed: Annotated[int, opt("--sketch-seed", "Sketch seed, 0..2^64-1.")] = 0,
    json_out: JsonOpt = False,
    plot: Annotated[str | None, opt("--plot", "Write validation curves to PATH.png.")] = None,
    save_grads: Annotated[str | None, opt(
        "--save-grads", "Directory for gradient files (needs --save-at).")] = None,
    save_at: Annotated[str | None, opt(
        "--save-at", "Steps to save at, e.g. 50 or 50,100 (needs --save-grads).")] = None,
    warmup_theta0: Annotated[bool, opt(
        "--warmup-theta0", "Old fixed-lag protocol: lagged workers start at step 0 with θ_0.")] = False,
    log_dir: Annotated[str | None, opt("--log-dir", "Write one per-step CSV per run into DIR.")] = None,
    arrivals: Annotated[str | None, opt(
        "--arrivals", "Arrival mode: worker compute times in seconds, one per worker (exp:MEAN, "
        "const:MEAN, shifted-exp:MEAN:SHIFT, gamma:MEAN:SHAPE, lognormal:MEAN:SIGMA), e.g. "
        "exp:1,exp:1,exp:2,exp:4. Excludes --lags.")] = None,
    uplink: UplinkOpt = None,
    downlink: DownlinkOpt = None,
    mode: ModeOpt = Mode.blocking,
    window: WindowOpt = 1,
    reference: Annotated[Reference, opt(
        "--reference", "naig's reference: auto (ema for --window 1, else the least stale of the "
        "batch), batch or ema.")] = Reference.auto,
    # --- distributed engine (naig.distributed) ---
    engine: Annotated[Engine, opt(
        "--engine", "simulated: one process; distributed: a parameter server and --nproc - 1 worker "
        "processes (torch.distributed; spawned here, or started by torchrun).")] = Engine.simulated,
    nproc: Annotated[int | None, opt(
        "--nproc", "Distributed: processes, the server plus K workers (default under torchrun: "
        "its world size).")] = None,
    slowdown: Annotated[str | None, opt(
        "--slowdown", "Distributed: compute-time factor >= 1 per worker, e.g. 1,1,2,4.")] = None,
    sketch_first: Annotated[bool, opt(
        "--sketch-first", "Distributed, naig: workers push the 14-float sketch; the server fetches "
        "the gradient only when w >= 0.01 (pi >= 0.01/B).")] = False,
    timeout: Annotated[float, opt(
        "--timeout", "Distributed: seconds any one message may take (<= 30); a worker silent "
        "longer is reported lost.")] = 30.0,
    worker_faults: Annotated[str | None, opt(
        "--worker-faults", "Distributed: W:KIND[@STEP] comma list, KIND kill, nan or hang, e.g. "
        "1:kill@20,2:nan.")] = None,
    # --- end distributed engine ---
) -> None:
    """Train a byte-level GPT with stale workers; compare NAIG routing with baselines.

    A run whose gradients or parameters become NaN/Inf stops and is reported as
    diverged (NaN loss in the table, null in JSON); the other runs go on. Exit 0 with
    a warning on stderr if some runs diverged, exit 1 if every run did. Ctrl-C prints
    the runs that finished (a valid JSON document with --json) and exits 130.
    """
    from naig.simulate import SimulateConfig, parse_float_list, parse_int_list, run_simulation

    _check_plot(plot, data)
    config = SimulateConfig(
        lags=parse_int_list(lags, "lags"), strategies=tuple(s.strip() for s in strategies.split(",")),
        steps=steps, seeds=seeds, lr=parse_float_list(lr, "lr"), optimizer=optimizer.value, beta=beta,
        dc_lambda=dc_lambda,
        batch_size=batch_size, eval_every=eval_every, device=device.value, model=model.value,
        data=data, data_bytes=data_bytes, sketch_seed=sketch_seed, save_grads=save_grads,
        save_at=parse_int_list(save_at, "save_at") if save_at else (), warmup_theta0=warmup_theta0,
        log_dir=log_dir, arrivals=arrivals, uplink=uplink, downlink=downlink, mode=mode.value,
        window=window, reference=reference.value,
        **_distributed_fields(engine, nproc, slowdown, sketch_first, timeout, worker_faults),
    )
    run = run_simulation if config.engine == "simulated" else _run_distributed
    with progress("simulate", config.total_steps) as advance:
        result = run(config, _reporter(advance, config.eval_every or config.steps))
    if result is None:  # a worker rank under torchrun: rank 0 reports
        return
    print_json(result.to_dict()) if json_out else _render(result)
    if plot is not None and result.runs:
        _plot(result, plot)
    if result.interrupted:
        fail(f"interrupted: {len(result.runs)} finished runs reported", 130)
    _report_divergence(result)


# --- distributed engine (naig.distributed) ---
def _distributed_fields(engine: Engine, nproc: int | None, slowdown: str | None, sketch_first: bool,
                        timeout: float, worker_faults: str | None) -> dict:
    """The config fields of the distributed engine; ``nproc`` defaults to torchrun's world size."""
    import os

    from naig.simulate import parse_float_list

    if engine is Engine.distributed and nproc is None and "WORLD_SIZE" in os.environ:
        nproc = int(os.environ["WORLD_SIZE"])
    return dict(engine=engine.value, nproc=nproc, sketch_first=sketch_first, timeout=timeout,
                slowdown=parse_float_list(slowdown, "slowdown") if slowdown else (),
                worker_faults=tuple(f.strip() for f in worker_faults.split(",")) if worker_faults else ())


def _run_distributed(config: SimulateConfig, progress: Callable[..., None]) -> SimulateResult | None:
    from naig.distributed import run_distributed

    return run_distributed(config, progress)


def _distributed_header(r: SimulateResult) -> None:
    d = r.distributed or {}
    stdout.print(f"model {r.config.model} (n = {r.n_params:,} parameters) on {r.device}; {d.get('nproc')} "
                 f"processes ({d.get('launcher')}, {d.get('backend')}): a parameter server and K = "
                 f"{d.get('workers')} workers, window {d.get('window')}"
                 + (", sketch-first" if d.get("sketch_first") else "")
                 + (f", slowdown {','.join(f'{v:g}' for v in d['slowdown'])}" if d.get("slowdown") else ""))


def _render_distributed(r: SimulateResult) -> None:
    """What real processes add to the table: staleness vs prediction, bytes, server time, faults."""
    d, out = r.distributed or {}, stdout
    for run in r.runs:
        _render_run(run)
    for lost in d.get("lost", []):
        code = lost.get("exit_code")
        how = "" if code is None else f" (killed by signal {-code})" if code < 0 else f" (exit status {code})"
        out.print(f"[red]worker {lost['worker']} (rank {lost['rank']}) lost[/] in {lost['strategy']} seed "
                  f"{lost['seed']} after {lost['update']} updates, {fmt_num(lost['seconds'], '.2f')} s into "
                  f"the run{how}: {escape(lost['error'])}")
    out.print("results are [bold]not reproducible[/] across processes (arrival order follows OS "
              "scheduling): compare the spread over seeds or repeated runs")


def _render_run(run: RunResult) -> None:
    """One line per run: measured τ (95% CI) vs predicted, bytes per arrival, server ms per update."""
    st, d = run.staleness or {}, run.distributed or {}
    ci = (st.get("ci95") or {}).get("mean")
    pred = st.get("predicted") or {}
    ok = (st.get("within_ci95") or {}).get("mean")
    colour = "" if ok is None else "green" if ok else "red"
    shown = fmt_num(pred.get("mean"), ".2f") if pred else "—"
    pred_cell = f"[{colour}]{shown}[/]" if colour else shown
    per = " ".join(fmt_num(v, ".2f") for v in st.get("per_worker", []))
    pper = " ".join(fmt_num(v, ".2f") for v in (pred.get("per_worker") or []))
    b, ms = d.get("bytes", {}), d.get("server_ms", {})
    ci_cell = "—" if not ci else f"[{ci[0]:.2f}, {ci[1]:.2f}]"
    up, down = fmt_num(b.get("up_per_arrival"), ",.0f"), fmt_num(b.get("down_per_arrival"), ",.0f")
    stdout.print(f"{run.strategy} seed {run.seed}: τ {fmt_num(st.get('mean'), '.2f')} {ci_cell} (predicted "
                 f"{pred_cell}); per worker {per or '—'} (predicted {pper or '—'})")
    stdout.print(f"  per arrival {up} B up, {down} B down; {b.get('not_fetched', 0)} gradients not fetched "
                 f"({b.get('saved_up', 0):,} B saved); server {fmt_num(ms.get('per_update'), '.2f')} "
                 f"ms/update (receive {fmt_num(ms.get('receive'), '.2f')}, route + apply "
                 f"{fmt_num(ms.get('route_apply'), '.2f')})")
    nf = d.get("non_finite", {})
    if nf.get("count"):
        workers = sorted({a["worker"] for a in nf.get("arrivals", [])})
        weights = sorted(set(nf.get("weights", [])))
        stdout.print(f"  {nf['count']} non-finite pushes from worker(s) {','.join(map(str, workers))}, "
                     f"weights {','.join(f'{w:g}' for w in weights)}")
# --- end distributed engine ---


def _reporter(advance: Callable[..., None], every: int) -> Callable[[StepEvent], None]:
    """Advance the bar on a terminal; without one, a plain line on stderr every ``every`` steps."""
    if sys.stderr.isatty():
        return lambda event: advance()

    def line(e: StepEvent) -> None:
        if e.step % every == 0 or e.step == e.steps:
            loss = "" if e.val_loss is None else f" val {e.val_loss:.4f}"
            rate = e.step / e.seconds if e.seconds > 0 else float("inf")
            sys.stderr.write(f"{e.strategy} seed {e.seed} lr {e.lr:g} step {e.step}/{e.steps}{loss} "
                             f"{rate:.1f} steps/s\n")

    return line


_PLOT_SUFFIXES = (".png", ".pdf", ".svg")


def _check_plot(plot: str | None, data: str | None) -> None:
    """Refuse a --plot target before any training (wrong type, missing folder, an input)."""
    if plot is None:
        return
    if importlib.util.find_spec("matplotlib") is None:
        raise UsageError("needs matplotlib; install it with pip install 'naig[plot]'", field="plot")
    p = Path(plot)
    if p.suffix.lower() not in _PLOT_SUFFIXES:
        raise UsageError("use a .png, .pdf or .svg file name, e.g. curves.png", field="plot", value=plot)
    if not p.absolute().parent.is_dir() or p.is_dir():
        raise UsageError("its folder must exist and it must not be a directory", field="plot", value=plot)
    if data is not None and p.exists() and Path(data).exists() and p.samefile(data):
        raise UsageError("would overwrite the `data` file; choose another path", field="plot", value=plot)


def _report_divergence(r: SimulateResult) -> None:
    """Warn (exit 0) when some runs diverged; fail with exit 1 when every run did."""
    if not r.diverged:
        return
    which = "; ".join(f"{d.strategy} seed {d.seed} at step {d.diverged_at}" for d in r.diverged)
    what = (f"{len(r.diverged)} of {len(r.runs)} runs diverged (non-finite gradients or "
            f"parameters): {which}; their loss is NaN (null in JSON)")
    if len(r.diverged) == len(r.runs):
        fail(f"{what}; try a smaller --lr", 1)
    stderr.print(f"warning: {what}", markup=False, highlight=False, soft_wrap=True)


def _pi_cell(s: StrategySummary) -> str:
    return " ".join("—" if p != p else f"{p:.3f}" for p in s.mean_pi)


def _loss_cell(s: StrategySummary) -> str:
    """Mean ± sample std; ``—`` for the std of one seed; the divergence when any seed diverged."""
    steps = [t for t in s.diverged_at if t is not None]
    if not steps:
        if s.test_loss_mean is not None:
            return f"{s.test_loss_mean:.4f} ± {fmt_num(s.test_loss_std, '.4f')} (lr {s.lr:g})"
        return f"{s.val_loss_mean:.4f} ± {fmt_num(s.val_loss_std, '.4f')}"
    at = ",".join(map(str, steps))
    if len(s.diverged_at) == 1:
        return f"[red]diverged at step {at}[/]"
    return f"[red]NaN: {len(steps)}/{len(s.diverged_at)} seeds diverged (step {at})[/]"


def _change(s: StrategySummary) -> str:
    if s.change_vs_hogwild_pct is None or s.strategy == "hogwild" or s.val_loss_mean != s.val_loss_mean:
        return "—"
    c = s.change_vs_hogwild_pct
    return f"[{'green' if c < 0 else 'red'}]{c:+.2f}%[/]"


def _render(r: SimulateResult) -> None:
    c = r.config
    out = stdout  # terminal width; COLUMNS when set; 160 columns when piped
    if r.distributed is not None:  # distributed engine
        _distributed_header(r)
    else:
        out.print(f"model {c.model} (n = {r.n_params:,} parameters) on {r.device}; "
                  f"K = {len(c.lags)} workers, lags {','.join(map(str, c.lags))}")
    lrs = ",".join(f"{v:g}" for v in c.lr)
    tuned = " (each strategy's chosen on validation, loss on the test split)" if c.tuning else ""
    out.print(f"{c.steps} steps × {c.seeds} seed(s); {c.optimizer} lr {lrs}{tuned}, "
              f"batch {c.batch_size}/worker; β {c.beta}")
    out.print(f"untrained validation loss {r.untrained_val_loss:.4f} nats/byte "
              "(ln 256 = 5.5452)")
    table, hidden = _table(r, out.width)
    out.print(table)
    if hidden:
        out.print(f"(too narrow for {', '.join(hidden)}: widen the terminal or use --json)")
    out.print(f"routing signal {r.routing_bytes} B/worker/step vs full gradient "
              f"{r.gradient_bytes:,} B (n/14 = {r.n_params / 14:,.0f}×)")
    for path in r.saved_files[:1]:
        out.print(f"gradients saved ({len(r.saved_files)} files), e.g. {path}", markup=False)
    if r.distributed is not None:  # distributed engine
        _render_distributed(r)


_COLUMNS = ("strategy", "val loss ± std", "vs hog", "mean π", "frozen", "K_eff", "H first→last",
            "ms/step")  # README's simulate section explains each
_DROP_ORDER = ("H first→last", "frozen", "ms/step")  # dropped in this order when too narrow


def _table(r: SimulateResult, width: int) -> tuple[Table, list[str]]:
    """The per-strategy table and the columns hidden so that it fits ``width``.

    Cells never wrap (``no_wrap``); when the terminal is too narrow for every column,
    annealing entropy, frozen fraction and ms/step are dropped in that order (the
    ``--json`` document always has them).
    """
    title = (f"final val loss, nats/byte (lower is better); π per worker, "
             f"lags {' '.join(map(str, r.config.lags))}")
    if r.distributed is not None:  # distributed engine
        title = "final val loss, nats/byte (lower is better); π per worker (weight × lr scale), measured τ"
    cells = {
        s.strategy: dict(zip(_COLUMNS, (
            s.strategy, _loss_cell(s), _change(s), _pi_cell(s), fmt_num(s.frozen_fraction, ".1%"),
            fmt_num(s.k_eff, ".2f"),
            f"{fmt_num(s.entropy_first, '.3f')}→{fmt_num(s.entropy_last, '.3f')}",
            fmt_num(s.ms_per_step, ".1f")), strict=True))
        for s in r.summaries
    }
    columns = list(_COLUMNS)
    for drop in (None, *_DROP_ORDER):
        if drop is not None:
            columns.remove(drop)
        t = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True,
                  show_edge=False, title_justify="left")
        for col in columns:
            t.add_column(col, justify="left" if col in ("strategy", "mean π") else "right",
                         no_wrap=True)
        for row in cells.values():
            t.add_row(*(row[col] for col in columns))
        if _natural_width(t) <= width:
            break
    return t, [col for col in _COLUMNS if col not in columns]


def _natural_width(t: Table) -> int:
    """Width the table needs without wrapping any cell."""
    probe = Console(width=10_000, file=io.StringIO())
    return t.__rich_measure__(probe, probe.options).maximum


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
