"""``naig simulate``: asynchronous training with stale workers, strategies side by side.

The library side is ``naig.simulate`` (docs/design.md §8). torch is imported inside the
command only, so ``naig spectrum`` start-up stays fast.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from rich import box
from rich.markup import escape
from rich.table import Table

from naig.choices import (
    ARRIVAL_MODES,
    DEVICES,
    ENGINES,
    MODELS,
    OPTIMIZERS,
)
from naig.errors import UsageError
from naig.interrupts import deferred_interrupts
from naig.simulate.options import DOCS, OUTPUT, PANELS
from naig_cli._common import (
    check_plot_path,
    choice_enum,
    fail,
    fit_table,
    fmt_num,
    handle_errors,
    narrow_note,
    print_json,
    progress,
    save_figure,
    stderr,
    stdout,
    word_flags,
)

if TYPE_CHECKING:
    from naig.simulate import RunResult, SimulateConfig, SimulateResult, StepEvent, StrategySummary

__all__ = ["simulate", "EXAMPLES", "progress_reporter"]

Optimizer, Device, Model = choice_enum("Optimizer", OPTIMIZERS), choice_enum("Device", DEVICES), \
    choice_enum("Model", MODELS)
ArrivalMode, Engine = choice_enum("ArrivalMode", ARRIVAL_MODES), choice_enum("Engine", ENGINES)

COMMON, DISTRIBUTED = PANELS[""], PANELS["distributed"]
EXAMPLES = """**Examples**

```
# fixed lags 0,10,20,35; under a minute on 2 cores
naig simulate
# staleness from worker speeds; each rule's lr chosen on validation
naig simulate --arrivals exp:1,exp:1,exp:2,exp:4
naig simulate --lr 3e-4,1e-3,3e-3 --seeds 5
naig simulate --faults 1:signflip:10 --lags 3,3,3,3 \\
    --strategies naig,hogwild,median,krum
naig simulate --arrivals exp:1,exp:1,exp:2,exp:4 \\
    --strategies diloco,diloco-naig,hogwild
naig simulate --engine distributed --nproc 5 --steps 50 \\
    --strategies naig,hogwild,sync
# a saved experiment, or a --json result
naig simulate --config run.toml --seeds 10
```

**Columns**: loss ± 95% CI over seeds; Δ, the mean paired per-seed difference ± half its 95% CI and
the paired t-test p; τ̄, mean staleness; t→sync loss, the median simulated seconds to reach sync's
final loss; mean π, each worker's Gibbs weight (! marks a worker --faults corrupts); K_eff = 1/Σπ²;
frozen, the share of weights < 0.01/K; H first→last, the entropy of π / ln K over the first and
last 10% of updates. More: README, Words and symbols; docs/simulate.md.
"""


def _o(flag: str, text: str, panel: str, default: str | None = None, **kwargs: Any) -> Any:
    """``typer.Option`` in a help panel, showing the default the library applies when not given."""
    import typer

    return typer.Option(flag, help=text, rich_help_panel=panel, show_default=default or False, **kwargs)


_DOC_OF: dict[str, Any] = {}  # option name → its Doc; of two fields of one name (``window``), the first
for _d in DOCS:
    _DOC_OF.setdefault(_d.name, _d)


def _opt(name: str) -> Any:
    """The ``typer.Option`` of library option ``name`` from its ``Doc`` (``naig.simulate.options``: flag,
    help, panel, the default shown)."""
    d = _DOC_OF[name]
    return _o(d.flag, d.help, d.where, d.shown_default)


def _set_words() -> dict[str, str]:
    """Library option name → how this command sets it: its flag, or ``--set KEY`` for a field of the
    tree without one (``dc_lambda`` → ``--set rules.dc_lambda``); errors and warnings use these."""
    return {"set": "--set", "config": "--config", "engine": "--engine",
            **{d.name: d.flag or f"--set {d.key}" for d in reversed(DOCS)}}


@handle_errors(words=_set_words)
def simulate(
    config: Annotated[Path | None, _o(
        "--config", "Read the experiment from a TOML or JSON file (a --json result works too); the "
        "options given here override it.", COMMON)] = None,
    set_keys: Annotated[list[str] | None, _o(
        "--set", "Set any key of the config file, KEY=VALUE, once per key (after --config and the flags): "
        "e.g. rules.dc_lambda=5, arrivals.uplink=const:0.1, arrivals.local.topology=ring, "
        "distributed.timeout=10, sketch_seed=7. Every key: docs/simulate.md, Config keys.", COMMON)] = None,
    strategies: Annotated[str | None, _opt("strategies")] = None,
    steps: Annotated[int | None, _opt("steps")] = None,
    seeds: Annotated[int | None, _opt("seeds")] = None,
    lr: Annotated[str | None, _opt("lr")] = None,
    optimizer: Annotated[Optimizer | None, _opt("optimizer")] = None,
    batch_size: Annotated[int | None, _opt("batch_size")] = None,
    eval_every: Annotated[int | None, _opt("eval_every")] = None,
    device: Annotated[Device | None, _opt("device")] = None,
    threads: Annotated[int | None, _opt("threads")] = None,
    jobs: Annotated[int | None, _opt("jobs")] = None,
    model: Annotated[Model | None, _opt("model")] = None,
    data: Annotated[str | None, _opt("data")] = None,
    data_bytes: Annotated[int | None, _opt("data_bytes")] = None,
    faults: Annotated[list[str] | None, _opt("faults")] = None,
    beta: Annotated[str | None, _opt("beta")] = None,
    lags: Annotated[str | None, _opt("lags")] = None,
    save_grads: Annotated[str | None, _opt("save_grads")] = None,
    save_at: Annotated[str | None, _opt("save_at")] = None,
    arrivals: Annotated[str | None, _opt("arrivals")] = None,
    mode: Annotated[ArrivalMode | None, _opt("mode")] = None,
    window: Annotated[int | None, _opt("window")] = None,
    local_steps: Annotated[str | None, _opt("local_steps")] = None,
    engine: Annotated[Engine | None, _o(
        "--engine", "simulated: one process; distributed: a parameter server and --nproc - 1 worker "
        "processes (torch.distributed; spawned here, or started by torchrun).", DISTRIBUTED,
        "simulated")] = None,
    nproc: Annotated[int | None, _opt("nproc")] = None,
    json_out: Annotated[bool, _o("--json", "Print one JSON document on stdout.", OUTPUT)] = False,
    plot: Annotated[str | None, _o("--plot", "Write validation curves to PATH (.png, .pdf, .svg).",
                                   OUTPUT)] = None,
    log_dir: Annotated[str | None, _opt("log_dir")] = None,
) -> None:
    """Train a byte-level GPT with stale workers; compare NAIG routing with baselines.

    One setting per run: fixed lags (default), --arrivals, or --engine distributed; each
    option belongs to one (its panel below). A run whose parameters become NaN/Inf stops and
    is reported as diverged; the others go on. Exit 0 (a warning on stderr if some runs
    diverged), 1 if every run diverged or a run could not finish, 2 for a usage error, 130
    after Ctrl-C or SIGTERM (the runs that finished are printed, a valid JSON document with --json;
    before training began, one line).
    """
    from naig.simulate import SimulateConfig

    check_plot_path(plot, "curves.png", (("`data` file", data), ("`config` file", config)))
    given = {k: v for k, v in _options(**locals()).items() if v is not None}  # what the command line says
    base = SimulateConfig.load(config) if config else SimulateConfig()  # then the flags, then --set
    cfg = base.with_set(set_keys or (), **given)
    dropped = base.dropped_by(cfg) if config else None
    notes = () if dropped is None else (f"{dropped} (the `config` file's, overridden here)",)
    _run(cfg, json_out, plot, notes)


def _options(**given: Any) -> dict[str, Any]:
    """The library's options (``naig.simulate.config.OPTIONS``) from the flags; None: not given."""
    from naig.simulate import parse_float_list, parse_int_list

    g = given
    nproc = g["nproc"]
    if g["engine"] is Engine.distributed and nproc is None and "WORLD_SIZE" in os.environ:
        nproc = int(os.environ["WORLD_SIZE"])

    def floats(name: str) -> tuple[float, ...] | None:  # an empty value is given (and refused), not absent
        return None if g[name] is None else parse_float_list(g[name], name)

    def ints(name: str) -> tuple[int, ...] | None:
        return None if g[name] is None else parse_int_list(g[name], name)

    return dict(
        strategies=None if g["strategies"] is None else _split(g["strategies"]) or ("",), steps=g["steps"],
        seeds=g["seeds"], lr=floats("lr"), optimizer=_value(g["optimizer"]),
        batch_size=g["batch_size"], eval_every=g["eval_every"], device=_value(g["device"]),
        threads=g["threads"], jobs=g["jobs"], model=_value(g["model"]), data=g["data"],
        data_bytes=g["data_bytes"], faults=g["faults"] or None, log_dir=g["log_dir"], beta=g["beta"],
        lags=ints("lags"), save_grads=g["save_grads"], save_at=ints("save_at"), arrivals=g["arrivals"],
        mode=_value(g["mode"]), window=g["window"], local_steps=_positive_ints(g["local_steps"]),
        engine=_value(g["engine"]), nproc=nproc,
    )


def _value(choice: Any) -> str | None:
    """An enum choice's value (None: not given)."""
    return None if choice is None else choice.value


def _run(config: SimulateConfig, json_out: bool, plot: str | None, notes: tuple[str, ...] = ()) -> None:
    """Run the experiment, print it (after ``notes``: warnings of the caller's), and exit with what
    happened."""
    from naig.simulate import run_experiment

    notes = (*notes, *config.earlier_logs())  # read before the runs write their own logs there
    for warning in (*notes, *config.warnings()):
        _warn(warning)
    result = None
    try:
        with progress("simulate", config.total_steps) as advance:
            runs = config.seeds * len(config.strategies) * len(config.lr)
            result = run_experiment(config, progress_reporter(advance, runs))
    except KeyboardInterrupt:  # as the progress bar closed: the result is kept
        if result is None:
            raise
        result = dataclasses.replace(result, interrupted=True)
    if result is None:  # a worker rank under torchrun: rank 0 reports
        return
    with deferred_interrupts() as late:  # the result is printed whole, then the stop is said
        print_json(_document(result, notes)) if json_out else _render(result)
    if plot is not None and result.finished:
        _plot(result, plot)
    for warning in _run_warnings(result):
        _warn(warning)
    if result.interrupted or late:
        fail(f"interrupted: {len(result.finished)} finished run(s) reported"
             + (f", {len(result.incomplete)} cut short" if result.incomplete else ""), 130)
    _report_incomplete(result)
    if _every_run_diverged(result):
        fix = "the injected --faults reach θ; try a robust rule" if result.config.faults else \
            "try a smaller --lr"
        fail(f"{result.run_warnings[-1]}; {fix}", 1)


def _warn(text: str) -> None:
    """``warning: TEXT`` on stderr, fields named as the flags that set them."""
    stderr.print(f"warning: {word_flags(text)}", markup=False, highlight=False, soft_wrap=True)


def _document(result: SimulateResult, notes: tuple[str, ...]) -> dict:
    """The JSON document: the result, with every warning stderr shows (``notes`` first) as its flags say
    (not the divergence of every run, which is the command's error)."""
    config = result.config
    said = (*notes, *config.warnings(), *_run_warnings(result))
    return {**result.to_dict(), "warnings": [word_flags(w) for w in said]}


def _every_run_diverged(r: SimulateResult) -> bool:
    """Every run diverged and the experiment was not stopped: exit 1 with that line as the error."""
    return bool(r.diverged) and len(r.diverged) == len(r.runs) and not r.interrupted


def _run_warnings(r: SimulateResult) -> tuple[str, ...]:
    """The runs' warnings stderr shows: none when every run diverged (that line is the error)."""
    return () if _every_run_diverged(r) else r.run_warnings


def _split(text: str | None) -> tuple[str, ...]:
    """A comma list as stripped items (none for None)."""
    return tuple(f.strip() for f in text.split(",")) if text else ()


def _report_incomplete(r: SimulateResult) -> None:
    """Exit 1 when a run stopped before its budget or could not start (workers lost)."""
    if not r.incomplete and not r.not_run:
        return
    cut = [f"{x.strategy} seed {x.seed} after {x.updates} updates" for x in r.incomplete]
    parts = [f"{len(cut)} run(s) stopped before the end of their budget ({'; '.join(cut)})"] if cut else []
    parts += [f"{len(r.not_run)} could not run ({'; '.join(r.not_run)})"] if r.not_run else []
    fail(f"{' and '.join(parts)}: no worker was left; their rows are not summarised", 1)


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
    ci_cell = "" if not ci else f" [{ci[0]:.2f}, {ci[1]:.2f}]"  # none from too few arrivals
    up, down = fmt_num(b.get("up_per_arrival"), ",.0f"), fmt_num(b.get("down_per_arrival"), ",.0f")
    stdout.print(f"{run.strategy} seed {run.seed}: τ {fmt_num(st.get('mean'), '.2f')}{ci_cell} (predicted "
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


HEARTBEAT_SECONDS = 10.0  # without a terminal: the longest silence at evaluations within a run
FIRST_HEARTBEAT_SECONDS = 2.0  # ... but for the first line, which shows the rate early


def progress_reporter(advance: Callable[..., None], runs: int,
                      clock: Callable[[], float] = time.monotonic) -> Callable[[StepEvent], None]:
    """The progress callback of ``naig simulate`` (``run_experiment``'s ``progress``).

    On a terminal (stderr a TTY) it advances the bar; without one it writes a plain line on stderr as
    each of ``runs`` ends and, within a run, at an evaluation: the command's first line once
    ``FIRST_HEARTBEAT_SECONDS`` have passed since the reporter was made (the rate, early), then at
    most every ``HEARTBEAT_SECONDS`` after the last line.

    Args:
        advance: moves the bar by a number of steps (called on a terminal only).
        runs: how many runs the experiment holds (the lines say "run i of runs").
        clock: seconds, monotonic (``time.monotonic``; a test's own clock).

    Returns:
        The callback, called with each ``StepEvent``.
    """
    done = {"runs": 0, "said": clock() - HEARTBEAT_SECONDS + FIRST_HEARTBEAT_SECONDS}
    if sys.stderr.isatty():  # a run's progress may jump (a diloco round is H steps): advance by the jump
        last: dict[tuple[str, int, float], int] = {}  # runs side by side (--jobs) interleave their events

        def bar(e: StepEvent) -> None:
            run = (e.strategy, e.seed, e.lr)
            end = e.steps if e.diverged else e.step  # a diverged run's steps are spent: the bar moves on
            advance(end - last.get(run, 0))
            last[run] = end

        return bar

    def line(e: StepEvent) -> None:
        finished = e.step == e.steps or e.diverged
        now = clock()
        if not finished and (e.val_loss is None or now - done["said"] < HEARTBEAT_SECONDS):
            return
        done["runs"] += finished
        done["said"] = now
        loss = f" diverged at step {e.diverged_at}" if e.diverged else "" if e.val_loss is None \
            else f" val {e.val_loss:.4f}"  # the step the table and --json name
        rate = e.step / e.seconds if e.seconds > 0 else float("inf")
        end = f" (run {done['runs']} of {runs})" if finished else ""
        sys.stderr.write(f"{e.strategy} seed {e.seed} lr {e.lr:g} step {e.step}/{e.steps}{loss} "
                         f"{rate:.1f} steps/s{end}\n")
        sys.stderr.flush()

    return line


def _pi_cell(s: StrategySummary, faulty: tuple[int, ...]) -> str:
    """Mean π per worker; a faulty worker's π is marked with ``!``."""
    cells = ["—" if p != p else f"{p:.3f}" for p in s.mean_pi]
    return " ".join(f"[yellow]{c}![/]" if w in faulty else c for w, c in enumerate(cells))


def _loss_cell(s: StrategySummary) -> str:
    """Mean ± half the 95% interval; with diverged seeds their count and the median instead."""
    loss = s.loss
    if loss.get("diverged"):
        steps = ",".join(str(t) for t in s.diverged_at if t is not None)
        if loss["n"] == 1:
            return f"[red]diverged at step {steps}[/]"
        median = "∞" if loss["median"] == float("inf") else f"{loss['median']:.4f}"
        return f"[red]median {median}; {loss['diverged']}/{loss['n']} diverged at step {steps}[/]"
    lo, hi = s.ci95
    half = "—" if lo != lo else f"{(hi - lo) / 2:.4f}"
    return f"{loss['mean']:.4f} ± {half}"


def _paired_cell(p: dict | None, name: str) -> str:
    """``−0.123±0.075 p=0.003``: mean paired difference ± half its 95% interval, and the p-value.

    Green when the interval lies below 0 (lower loss than the baseline), red above 0.
    """
    if p is None or p.get("baseline") == name or p["n"] == 0:
        return "—"
    lo, hi = p["ci95"]
    half = "" if lo != lo else f"±{(hi - lo) / 2:.3f}"
    pv = "" if p["p_value"] != p["p_value"] else f" p={p['p_value']:.2g}"
    colour = "green" if hi < 0 else "red" if lo > 0 else "default"
    dropped = f" ({p['dropped']} dropped)" if p["dropped"] else ""
    return f"[{colour}]{p['diff']:+.3f}{half}{pv}[/]{dropped}"


def _time_cell(s: StrategySummary, seeds: int) -> str:
    if s.time_to_loss is None:
        return "—" if s.reached is None else f"not reached (0/{seeds})"
    return f"{s.time_to_loss:,.1f} s" + ("" if s.reached == seeds else f" ({s.reached}/{seeds})")


# the strategies that use naig's reference (gradient rules), and those that use β and the 56 B routing signal
_REFERENCE_USERS = {"naig", "naig-exact", "naig-blind"}
_GIBBS_USERS = {*_REFERENCE_USERS, "diloco-naig", "diloco-naig-exact"}


def _render(r: SimulateResult) -> None:
    c = r.config
    out = stdout  # terminal width; COLUMNS when set; 160 columns when piped
    gibbs = bool(_GIBBS_USERS & set(c.strategies))  # β and the routing signal mean nothing to the others
    if r.distributed is not None:  # distributed engine
        _distributed_header(r)
    else:
        uses_reference = c.asynchronous and _REFERENCE_USERS & set(c.strategies)
        reference = f", reference {c.resolved_reference}" if uses_reference else ""
        workers = c.setting.describe() + reference
        out.print(f"model {c.model} (n = {r.n_params:,} parameters) on {r.device}; "
                  f"K = {c.workers} workers, {workers}")
    lrs = ",".join(f"{v:g}" for v in c.lr)
    tuned = " (each strategy's chosen on validation, loss on the test split)" if c.tuning else ""
    faults = f"; faults {' '.join(c.faults)}" if c.faults else ""
    out.print(f"{c.steps} steps × {c.seeds} seed(s); {c.optimizer} lr {lrs}{tuned}, "
              f"batch {c.batch_size}/worker{f'; β {c.beta}' if gibbs else ''}{faults}")
    out.print(f"untrained validation loss {r.untrained_val_loss:.4f} nats/byte (ln 256 = 5.5452)")
    table, hidden = _table(r, out.width)
    out.print(table)
    if hidden:
        out.print(narrow_note(hidden))
    shown = [col for col in _columns(r) if col not in hidden]
    out.print(_legend(shown, bool(c.faults), r.distributed is not None), markup=False, highlight=False,
              style="dim")
    if gibbs:
        out.print(f"routing signal {r.routing_bytes} B/worker/update vs full gradient "
                  f"{r.gradient_bytes:,} B (n/14 = {r.n_params / 14:,.0f}×)")
    for path in r.saved_files[:1]:
        out.print(f"gradients saved ({len(r.saved_files)} files), e.g. {path}", markup=False)
    if c.asynchronous and r.summaries:  # no summary when no run finished (every worker lost)
        _render_curves(r)
    _render_communication(r)
    if r.distributed is not None:  # distributed engine
        _render_distributed(r)


# Local updates and gossip (docs/design.md §13)
def _positive_ints(text: str | None) -> tuple[int, ...] | None:
    """``--local-steps`` as ints (range checks are the config's); None when not given."""
    if text is None:
        return None
    try:
        return tuple(int(v) for v in text.split(","))
    except ValueError:
        raise UsageError("use one int >= 1, or one per worker, e.g. 10 or 10,10,5,2", field="local_steps",
                         value=text) from None


def _render_communication(r: SimulateResult) -> None:
    """Arrival mode: per strategy, bytes sent per worker, simulated seconds and samples at the end."""
    if not r.config.asynchronous or not any(s.bytes_per_worker for s in r.summaries):
        return
    stdout.print("bytes sent per worker (mean, then each worker), simulated seconds and samples "
                 "at the end, mean over seeds:")
    for s in r.summaries:
        if not s.bytes_per_worker:
            continue
        each = " ".join(f"{b / 1e6:.2f}" for b in s.bytes_per_worker)
        secs = fmt_num(s.curve_seconds[-1] if s.curve_seconds else None, ",.1f")
        samples = f"{s.curve_samples[-1]:,.0f}" if s.curve_samples else "—"
        stdout.print(f"  {s.strategy}{_method(r, s.strategy)}: "
                     f"{sum(s.bytes_per_worker) / len(s.bytes_per_worker) / 1e6:.2f} MB ({each}); {secs} s; "
                     f"{samples} samples", markup=False, highlight=False)


def _method(r: SimulateResult, name: str) -> str:
    """`` (inner → outer lr, momentum; H; reference)`` of a local-update strategy, else ``''``."""
    m = next((run.local for run in r.runs if run.strategy == name and run.local), None)
    if m is None:
        return ""
    h = ",".join(map(str, m["local_steps"]))
    ref = f"; vs {m['reference']}" if m["reference"] else ""
    outer = f"{m['form']} gossip on {m['topology']}" if m["outer"] == "gossip" else m["outer"]
    return f" ({m['inner']} → {outer} lr {m['outer_lr']:g} m {m['outer_momentum']:g}; H {h}{ref})"


def _columns(r: SimulateResult) -> list[str]:
    """The table's columns: only those some row has a value for."""
    c, cols = r.config, ["strategy", "loss ± 95% CI"]
    if c.tuning:
        cols.append("lr")
    if any(s.paired_vs_hogwild for s in r.summaries):
        cols.append("Δ vs hogwild")
    if r.best_baseline not in (None, "hogwild"):
        cols.append(f"Δ vs {r.best_baseline}")
    if any(s.staleness_mean is not None for s in r.summaries):
        cols.append("τ̄")
    if any(s.reached is not None for s in r.summaries):
        cols.append("t→sync loss")
    if any(s.correction is not None for s in r.summaries):
        cols.append("‖g̃−g‖/‖g‖")
    return cols + ["mean π", "K_eff", "frozen", "H first→last", "ms/update"]


def _cells(r: SimulateResult, s: StrategySummary) -> dict[str, str]:
    from naig.simulate.faults import faulty_workers

    faulty = faulty_workers(r.config.fault_list)
    return {
        "strategy": s.strategy, "loss ± 95% CI": _loss_cell(s), "lr": f"{s.lr:g}",
        "Δ vs hogwild": _paired_cell(s.paired_vs_hogwild, s.strategy),
        f"Δ vs {r.best_baseline or 'best'}": _paired_cell(s.paired_vs_best, s.strategy),
        "τ̄": fmt_num(s.staleness_mean, ".2f"), "t→sync loss": _time_cell(s, r.config.seeds),
        "‖g̃−g‖/‖g‖": fmt_num(s.correction, ".2%"), "mean π": _pi_cell(s, faulty),
        "K_eff": fmt_num(s.k_eff, ".2f"), "frozen": fmt_num(s.frozen_fraction, ".1%"),
        "H first→last": f"{fmt_num(s.entropy_first, '.3f')}→{fmt_num(s.entropy_last, '.3f')}",
        "ms/update": fmt_num(s.ms_per_step, ".1f"),
    }


LEGEND = {  # what each column's symbol means, printed under the table for the columns shown
    "τ̄": "τ̄ mean staleness (updates)",
    "t→sync loss": "t→sync loss: median simulated s to reach sync's final loss",
    "‖g̃−g‖/‖g‖": "‖g̃−g‖/‖g‖ size of the rule's correction",
    "mean π": "π each worker's mean weight in the update over the steps it sent (workers in order; "
              "naig's are Gibbs weights)",
    "K_eff": "K_eff = 1/Σπ² workers used",
    "frozen": "frozen: share of weights < 0.01/K",
    "H first→last": "H entropy of π / ln K, first→last 10% of updates",
}


_DISTRIBUTED_PI = "π each worker's mean weight × lr scale in the server's updates (workers in order)"


def _legend(shown: list[str], faults: bool, distributed: bool = False) -> str:
    """One line naming the symbols of the columns shown (and ``!`` when faults are marked; on the
    distributed engine π is the weight times the rule's lr scale, as the table's title says)."""
    legend = {**LEGEND, "mean π": _DISTRIBUTED_PI} if distributed else LEGEND
    parts = [legend[col] for col in shown if col in legend]
    if faults and "mean π" in shown:
        parts.append("! a worker --faults corrupts")
    return "; ".join(parts) + " (README: Words and symbols)"


_DROP_ORDER = ("H first→last", "frozen", "ms/update", "K_eff", "‖g̃−g‖/‖g‖", "τ̄", "mean π",
               "lr")  # the first is dropped first; then "Δ vs <best baseline>"


def _table(r: SimulateResult, width: int) -> tuple[Table, list[str]]:
    """The per-strategy table and the columns hidden so that it fits ``width``.

    Cells never wrap (``no_wrap``); when the terminal is too narrow for every column,
    columns are dropped in ``_DROP_ORDER`` (the ``--json`` document always has them).
    """
    what = "test" if r.config.tuning else "validation"
    title = (f"final {what} loss, nats/byte (lower is better), over {r.config.seeds} seed(s); Δ: mean "
             f"paired per-seed difference ± half its 95% CI, paired t-test p")
    if r.distributed is not None:  # distributed engine: π is weight × lr scale, τ is measured
        title += "; τ measured, seconds real"
    rows = [_cells(r, s) for s in r.summaries]
    all_columns = _columns(r)
    late = [c for c in all_columns[2:] if c.startswith("Δ vs") and c != "Δ vs hogwild"]
    order = [*_DROP_ORDER, *reversed(late)]
    if r.config.faults:  # then the weights on the faulty workers matter most: keep them longest
        order.remove("mean π")
        order.append("mean π")

    def build(columns: list[str]) -> Table:
        t = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True,
                  show_edge=False, title_justify="left")
        for col in columns:
            t.add_column(col, justify="left" if col in ("strategy", "mean π") else "right", no_wrap=True)
        for row in rows:
            t.add_row(*(row[col] for col in columns))
        return t

    return fit_table(build, all_columns, order, width)


def _render_curves(r: SimulateResult) -> None:
    """Validation loss (mean over seeds) at each evaluation point: updates and simulated seconds."""
    timed = any(sec == sec for s in r.summaries for sec in s.curve_seconds)  # the distributed engine: none
    clock = "wall-clock" if r.distributed is not None else "simulated wall-clock"
    what = f"server updates and {clock}" if timed else "server updates"
    t = Table(title=f"validation loss vs {what} (mean over seeds)",
              box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True, show_edge=False,
              title_justify="left")
    t.add_column("strategy", no_wrap=True)
    points = max(len(s.curve) for s in r.summaries)
    for i in range(points):
        t.add_column(f"#{i}", justify="right", no_wrap=True)
    for s in r.summaries:
        secs = list(s.curve_seconds) + [math.nan] * (len(s.curve) - len(s.curve_seconds))
        cells = [(f"{loss:.3f} @{updates}u/{fmt_num(sec, ',.0f')}s" if timed else f"{loss:.3f} @{updates}u")
                 if loss == loss else "—" for (updates, loss), sec in zip(s.curve, secs, strict=True)]
        t.add_row(s.strategy, *cells, *["—"] * (points - len(cells)))  # a diverged run stopped early
    stdout.print(t)


def _plot(r: SimulateResult, path: str) -> None:
    """Validation curves per strategy (mean over seeds, band: min to max over seeds) at print
    resolution, against every axis the mode has: server steps; arrival mode also simulated
    seconds; local updates samples, seconds and MB sent per worker."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    axes_spec = _plot_axes(r)
    fig, axes = plt.subplots(1, len(axes_spec), figsize=(5.5 * len(axes_spec), 4), sharey=True, squeeze=False)
    for s in r.summaries:
        runs = [x for x in r.runs if x.strategy == s.strategy and x.lr == s.lr]
        for ax, (_, get) in zip(axes[0], axes_spec, strict=True):
            _band(ax, [get(x) for x in runs], [[loss for _, loss in x.curve] for x in runs], s.strategy)
    for ax, (label, _) in zip(axes[0], axes_spec, strict=True):
        ax.set(xlabel=label)
        ax.grid(alpha=0.3)
    axes[0][0].set(ylabel="validation loss (nats/byte)")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(_plot_title(r), fontsize=9)
    save_figure(fig, path, dpi=300, bbox_inches="tight")
    plt.close(fig)


def _plot_axes(r: SimulateResult) -> list[tuple[str, Callable]]:
    """(label, run → x values) of each panel."""
    if not r.config.asynchronous:
        return [("server step", lambda run: [x for x, _ in run.curve])]
    axes = [("server updates", lambda run: [x for x, _ in run.curve]),
            ("simulated seconds", lambda run: list(run.curve_seconds))]
    if any(run.curve_bytes for run in r.runs if run.local):
        axes = [("samples (sequences)", lambda run: list(run.curve_samples)), axes[1],
                ("MB sent per worker", lambda run: [b / 1e6 for b in run.curve_bytes])]
    return axes


def _band(ax: object, xs: list[list[float]], losses: list[list[float]], label: str) -> None:
    """Mean curve over seeds with a min–max band; x is the mean over seeds of each point's x."""
    import numpy as np

    n = min(len(x) for x in xs + losses)
    if n == 0:
        return
    with warnings.catch_warnings():  # a point NaN in every seed (diverged runs): NaN, not drawn, no warning
        warnings.simplefilter("ignore", RuntimeWarning)
        x = np.nanmean([v[:n] for v in xs], axis=0)
        y = np.array([v[:n] for v in losses], dtype=float)
        mean, low, high = np.nanmean(y, axis=0), np.nanmin(y, axis=0), np.nanmax(y, axis=0)
    (line,) = ax.plot(x, mean, label=label, marker="o", ms=2.5, lw=1.2)
    if len(losses) > 1:
        ax.fill_between(x, low, high, color=line.get_color(), alpha=0.15, lw=0)


def _plot_title(r: SimulateResult) -> str:
    c = r.config
    where = c.setting.describe()
    lrs = "lr chosen per strategy on validation from " if c.tuning else "lr "
    return (f"{c.model} ({r.n_params:,} parameters), {c.optimizer}, {lrs}{','.join(f'{v:g}' for v in c.lr)}, "
            f"batch {c.batch_size}/worker; {where}; {c.seeds} seed(s): mean, band min–max")
