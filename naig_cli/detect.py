"""``naig detect``: which per-rank score names a bad rank (issue 20), measured on real gradients.

The library side is ``naig.detect``; torch is imported inside the command only. The command
registers its own option names in the shared ``FLAGS`` table so library errors name its flags.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from rich import box
from rich.table import Table

from naig.choices import MODELS
from naig_cli._common import (
    FLAGS,
    JsonOpt,
    check_plot_path,
    choice_enum,
    fit_table,
    fmt_num,
    handle_errors,
    narrow_note,
    print_json,
    progress,
    save_figure,
    stdout,
)

if TYPE_CHECKING:
    from naig.detect import DetectResult

__all__ = ["detect", "EXAMPLES"]

for _field, _flag in (("ranks", "--ranks"), ("warmup", "--warmup"), ("calibration", "--calibration"),
                      ("validation", "--validation"), ("test", "--test"), ("false_alarm", "--false-alarm"),
                      ("context", "--context"), ("threads", "--threads"), ("protocol", "--protocol"),
                      ("cache", "--cache"), ("replays", "--replays")):
    FLAGS.setdefault(_field, _flag)

Model = choice_enum("Model", MODELS)
EXAMPLES = """**Examples**

```
# K=8, the whole catalogue; about 9 minutes on 2 cores (docs/detect.md)
naig detect
naig detect --faults scale,noise,bitflip32 --test 5
# every figure, one document; or the detection rate against magnitude
naig detect --json > detect.json
naig detect --plot detect.png
# persistent faults, delays, long clean runs (~1.5 h on one core)
naig detect --protocol persistent --cache runs/
```
"""


def _o(flag: str, text: str, default: str | None = None, **kwargs: Any) -> Any:
    import typer

    return typer.Option(flag, help=text, show_default=default or False, **kwargs)


@handle_errors
def detect(
    ranks: Annotated[int | None, _o("--ranks", "K, data-parallel ranks (>= 3; --protocol persistent: 3 to "
                                    "10, 4 unless given).", "8")] = None,
    steps: Annotated[int | None, _o("--steps", "Scored steps per seed, after the warm-up.", "40")] = None,
    warmup: Annotated[int | None, _o("--warmup", "Training steps before scoring (>= --window and the largest "
                                     "stale τ, 20).", "20")] = None,
    calibration: Annotated[int | None, _o("--calibration", "Calibration seeds (clean steps set the "
                                          "thresholds).", "6")] = None,
    validation: Annotated[int | None, _o("--validation", "Validation seeds (choose the default detector; 0: "
                                         "none; --protocol persistent: 3 unless given).", "2")] = None,
    test: Annotated[int | None, _o("--test", "Test seeds (the reported figures; --protocol persistent: 10 "
                                   "unless given).", "3")] = None,
    faults: Annotated[str | None, _o(
        "--faults", "Comma list of fault kinds (naig.faults' names): bitflip32, bitflip16, scale, coordflip "
        "(a fraction of signs), noise, nan, inf, layer, stale, data-random, data-text, replica (DiLoCo: a "
        "replica at another initialisation). --protocol persistent: its faults, e.g. scale:2,repeat.",
        "all but replica")] = None,
    false_alarm: Annotated[float, _o("--false-alarm", "False-alarm rate per rank-step every threshold is "
                                     "calibrated to.", "1e-3")] = 1e-3,
    window: Annotated[int | None, _o("--window", "Clean steps in the individual histories.", "16")] = None,
    batch_size: Annotated[int, _o("--batch-size", "Sequences per rank minibatch.", "8")] = 8,
    context: Annotated[int, _o("--context", "Bytes per sequence (<= the model's context).", "64")] = 64,
    lr: Annotated[float, _o("--lr", "Adam learning rate of the clean training.", "1e-3")] = 1e-3,
    model: Annotated[Model | None, _o("--model", "Model preset.", "gpt-nano")] = None,  # type: ignore
    data: Annotated[str | None, _o("--data", "Text file.", "the stdlib's .py files")] = None,
    data_bytes: Annotated[int, _o("--data-bytes", "Use the first N bytes of the text.",
                                  "1000000")] = 1_000_000,
    sketch_seed: Annotated[int | None, _o("--sketch-seed", "The monitor sketch's seed.", "0")] = None,
    threads: Annotated[int, _o("--threads", "torch CPU threads.", "1")] = 1,
    protocol: Annotated[str, _o("--protocol", "steps: each step scored on its own (issue 20); persistent: "
                                "a fault that persists while training continues on the faulty mean, delays "
                                "to detection, false alarms over long clean runs, the monitor as deployed "
                                "beside exact statistics and baselines (docs/results/monitor-detection.md).",
                                "steps")] = "steps",
    cache: Annotated[str | None, _o("--cache", "persistent: keep the recorded runs in DIR (.npz) and reuse "
                                    "them.")] = None,
    replays: Annotated[int | None, _o("--replays", "persistent: clean runs replayed per pool and rank count "
                                      "(fixed subsets of the pool's ranks).", "40")] = None,
    plot: Annotated[str | None, _o("--plot", "Write detection rate against magnitude per detector to PATH "
                                   "(.png, .pdf, .svg; needs matplotlib).")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Detection power of per-rank scores on real gradients: norm, cosine, distance, sketch, Fano–Fisher
    energy, NaN check and the monitor's combined rule, against a catalogue of faults with magnitudes.

    K ranks of the small GPT train synchronously on the clean mean; at each scored step every fault
    (kind × magnitude) is applied to one random rank on a copy of the clean gradients. Thresholds are
    calibrated to --false-alarm per rank-step on the clean steps of the calibration seeds; the default
    detector is the best on the validation seeds; the table is on the test seeds: detection rate,
    top-1 localisation and AUC, mean over seeds [95% t-interval], and the false-alarm rate observed on
    clean test steps. Exit 0, or 2 for a usage error, 1 for unusable data.
    """
    from naig.detect import DetectConfig

    check_plot_path(plot, "detect.png")
    if protocol not in ("steps", "persistent"):
        from naig.errors import UsageError

        raise UsageError("use steps or persistent", field="protocol", value=protocol)
    if protocol == "persistent":
        _persistent(locals(), plot, json_out)
        return
    if cache is not None or replays is not None:
        from naig.errors import UsageError

        field = "cache" if cache is not None else "replays"
        raise UsageError("applies to --protocol persistent only", field=field,
                         value=cache if field == "cache" else replays)
    given = {k: v for k, v in dict(ranks=ranks, steps=steps, warmup=warmup, calibration=calibration,
                                   validation=validation, test=test, window=window,
                                   sketch_seed=sketch_seed).items() if v is not None}
    cfg = DetectConfig(**given, faults=faults, false_alarm=false_alarm, batch_size=batch_size,
                       context=context, lr=lr, model="gpt-nano" if model is None else model.value, data=data,
                       data_bytes=data_bytes, threads=threads)
    result = _run(cfg)
    print_json(result.to_dict()) if json_out else _render(result)
    if plot is not None:
        _plot(result, plot)


def _run(cfg: Any) -> DetectResult:
    from naig.detect import evaluate, run_protocol

    seeds = cfg.calibration + cfg.validation + cfg.test
    start = time.perf_counter()
    with progress("detect", seeds * (cfg.warmup + cfg.steps)) as advance:
        runs = run_protocol(cfg, advance)
    n = sum(p.numel() for p in _model(cfg.model).parameters())
    return evaluate(cfg, runs, n, time.perf_counter() - start)


def _model(name: str) -> Any:
    import torch

    from naig.simulate.model import GPT, get_preset

    return GPT(get_preset(name), generator=torch.Generator().manual_seed(0))


def _pct(v: float) -> str:
    return fmt_num(100 * v if v is not None and math.isfinite(v) else None, ".0f")


def _cell(m: list[float], auc: bool = False) -> str:
    mean, low, high = m
    if auc:
        return f"{fmt_num(mean, '.2f')} [{fmt_num(low, '.2f')}–{fmt_num(high, '.2f')}]"
    return f"{_pct(mean)} [{_pct(low)}–{_pct(high)}]"


def _render(r: DetectResult) -> None:
    """Header, the false-alarm table, the per-kind summary and one table per metric."""
    from naig.detect import DETECTORS, KINDS

    c = r.config
    stdout.print(f"naig detect: {c.model} ({r.n_params:,} parameters), K={c.ranks} ranks, batch "
                 f"{c.batch_size}×{c.context} bytes/rank, {c.steps} scored steps/seed after {c.warmup}; "
                 f"seeds: {c.calibration} calibration, {c.validation} validation, {c.test} test; "
                 f"false-alarm rate {c.false_alarm:g} per rank-step; {r.seconds:.0f} s",
                 markup=False, soft_wrap=True)
    t = Table(title="Thresholds (calibration seeds) and false alarms on clean test rank-steps",
              box=box.SIMPLE)
    for col in ("detector", "kind", "threshold", "flagged", "rate", "95% interval"):
        t.add_column(col, justify="left" if col in ("detector", "kind") else "right")
    for d in DETECTORS:
        fa = r.false_alarms[d]
        t.add_row(d, KINDS[d], fmt_num(r.thresholds[d], ".3g"), f"{fa['flagged']}/{fa['total']}",
                  fmt_num(fa["rate"], ".2g"), f"{fmt_num(fa['low'], '.2g')}–{fmt_num(fa['high'], '.2g')}")
    stdout.print(t)
    drop = [d for d in reversed(DETECTORS) if d != r.default]  # the default detector stays longest

    def kinds(cols: list[str]) -> Table:
        k = Table(title="Mean detection rate (%) over each kind's magnitudes, test seeds", box=box.SIMPLE)
        k.add_column("fault", no_wrap=True)
        for d in cols:
            k.add_column(d, justify="right", no_wrap=True)
        for kind, row in r.kinds.items():
            k.add_row(kind, *(_pct(row[d]) for d in cols))
        if r.validation is not None:
            k.add_row("validation", *(_pct(r.validation[d]) for d in cols), style="bold")
        return k

    _print_fitted(kinds, drop)
    titles = {"detection": "Detection rate (%) at the calibrated threshold", "top1": "Top-1 localisation (%)",
              "auc": "AUC"}
    for metric, title in titles.items():
        def metric_table(cols: list[str], metric: str = metric, title: str = title) -> Table:
            m = Table(title=f"{title}, test seeds: mean [95% t-interval over {c.test} seeds]", box=box.SIMPLE)
            for col in ("fault", "mag.", "‖Δ‖/‖g‖", *cols):
                m.add_column(col, justify="left" if col == "fault" else "right", no_wrap=True)
            for row in r.rows:
                m.add_row(row["fault"], f"{row['magnitude']:g}", fmt_num(row["rel_change"], ".2g"),
                          *(_cell(row["detectors"][d][metric], metric == "auc") for d in cols))
            return m

        _print_fitted(metric_table, drop)
    if r.default is not None:
        stdout.print(f"default detector (best mean detection rate over the fault kinds on the validation "
                     f"seeds): {r.default}", markup=False)


def _print_fitted(build: Callable[[list[str]], Table], drop: list[str]) -> None:
    """Print a table of detector columns, leaving detectors out (and saying so) to fit the terminal."""
    from naig.detect import DETECTORS

    table, hidden = fit_table(build, list(DETECTORS), drop, stdout.width)
    stdout.print(table)
    if hidden:
        stdout.print(narrow_note(hidden), markup=False)


def _plot(r: DetectResult, path: str) -> None:
    """Detection rate against magnitude, one panel per fault kind with several magnitudes, a line per detector
    (mean over test seeds, bars: 95% t-interval)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from naig.detect import DETECTORS

    kinds = [k for k in r.kinds if sum(row["fault"] == k for row in r.rows) > 1]
    if not kinds:
        kinds = list(r.kinds)
    cols = min(4, len(kinds))
    rows = math.ceil(len(kinds) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3.2 * rows), squeeze=False, sharey=True,
                             layout="constrained")
    for ax, kind in zip(axes.ravel(), kinds, strict=False):
        mine = [row for row in r.rows if row["fault"] == kind]
        x = list(range(len(mine)))
        for d in DETECTORS:
            y = [row["detectors"][d]["detection"] for row in mine]
            mean = [v[0] for v in y]
            err = [[max(0.0, v[0] - v[1]) if math.isfinite(v[1]) else 0.0 for v in y],
                   [max(0.0, v[2] - v[0]) if math.isfinite(v[2]) else 0.0 for v in y]]
            ax.errorbar(x, mean, yerr=err, label=d, marker="o", ms=3, lw=1, capsize=2)
        ax.set_xticks(x, [f"{row['magnitude']:g}" for row in mine])
        ax.set(title=kind, xlabel=mine[0]["unit"], ylim=(-0.05, 1.05))
        ax.grid(alpha=0.3)
    for ax in axes.ravel()[len(kinds):]:
        ax.axis("off")
    axes[0][0].set(ylabel="detection rate")
    axes[0][0].legend(fontsize=6)
    c = r.config
    fig.suptitle(f"naig detect: {c.model}, K={c.ranks}, false-alarm rate {c.false_alarm:g} per rank-step "
                 f"(calibrated on {c.calibration} seeds), {c.test} test seeds: mean, bars 95% t-interval",
                 fontsize=9)
    save_figure(fig, path, dpi=200, bbox_inches="tight")
    plt.close(fig)


_STEP_ONLY = ("steps", "warmup", "calibration", "window", "sketch_seed")
"""Options of the per-step protocol (refused with ``--protocol persistent`` when given, any value)."""


def _persistent(opts: dict, plot: str | None, json_out: bool) -> None:
    """``--protocol persistent``: record (or reuse), measure, print or write JSON, plot."""
    from naig.detect.measure import run_all
    from naig.detect.sequential import SequentialConfig, record_all, total_steps
    from naig.errors import UsageError

    for name in _STEP_ONLY:
        if opts[name] is not None:
            raise UsageError("applies to --protocol steps only", field=name, value=opts[name])
    _check_cache(opts["cache"])
    given = {k: opts[k] for k in ("ranks", "validation", "test", "replays") if opts[k] is not None}
    defaults = SequentialConfig()
    cfg = SequentialConfig(**given, batch_size=opts["batch_size"], context=opts["context"],
                           lr=opts["lr"], model="gpt-nano" if opts["model"] is None else opts["model"].value,
                           data=opts["data"], data_bytes=opts["data_bytes"],
                           faults=defaults.faults if opts["faults"] is None else tuple(
                               f.strip() for f in opts["faults"].split(",")),
                           false_alarm=opts["false_alarm"], threads=opts["threads"])
    start = time.perf_counter()
    with progress("detect", total_steps(cfg)) as advance:
        faults, pools = record_all(cfg, advance, cache=opts["cache"])
    res = run_all(cfg, faults, pools)
    res["seconds"] = time.perf_counter() - start
    print_json(res) if json_out else _render_persistent(res)
    if plot is not None:
        plot_persistent(res, plot)


def _fmt_p(v: float | None) -> str:
    return "–" if v is None else f"{100 * v:.0f}"


def _check_cache(cache: str | None) -> None:
    """``--cache``: a folder (created if missing), checked before any recording."""
    from naig.errors import UsageError

    if cache is None:
        return
    if not cache.strip():
        raise UsageError("an empty path; give a folder (created if missing), e.g. --cache runs/",
                         field="cache", value=cache)
    if Path(cache).exists() and not Path(cache).is_dir():
        raise UsageError("is a file; give a folder (created if missing) or remove the file", field="cache",
                         value=cache)


def _render_persistent(res: dict) -> None:
    c = res["config"]
    h = c["horizon"]
    stdout.print(f"naig detect --protocol persistent: K={c['ranks']} ranks, batch "
                 f"{c['batch_size']}×{c['context']} bytes/rank, fault from step {c['onset']} on, "
                 f"{c['test']} test seeds; α={c['false_alarm']:g} "
                 f"per step (family-wise); default chosen on {c['validation']} validation seeds: "
                 f"{res['default']}; {res.get('seconds', 0):.0f} s", markup=False, soft_wrap=True)
    methods = list(res["test"])
    t = Table(title=f"P(right rank named by onset+{h}) % / median delay / wrong ranks per run, test seeds",
              box=box.SIMPLE)
    t.add_column("fault")
    for m in methods:
        t.add_column(m, justify="right")
    for kind in c["faults"]:
        cells = []
        for m in methods:
            v = res["test"][m][kind]
            d = "–" if v["median_delay"] is None else f"{v['median_delay']:g}"
            cells.append(f"{_fmt_p(v[f'p{h}'])} / {d} / {v['wrong']:.1f}")
        t.add_row(kind, *cells)
    stdout.print(t)
    f = Table(title="False alarms per 1000 clean steps (test pools) [Clopper–Pearson 95%]", box=box.SIMPLE)
    for col in ("batch", "K", "α", "method", "flagged/steps", "per 1000", "interval", "in [α/2, 2α]"):
        f.add_column(col, justify="right")
    for r in res["false_alarms"]:
        f.add_row(str(r["batch"]), str(r["ranks"]), f"{r['alpha']:g}", r["method"],
                  f"{r['flagged']}/{r['steps']}", f"{r['per_1000']:.2g}",
                  f"{r['per_1000_low']:.2g}–{r['per_1000_high']:.2g}",
                  "yes" if r["in_range"] else "no")
    stdout.print(f)


def plot_persistent(res: dict, path: str) -> None:
    """P(named by onset + N) against N, one panel per fault kind, a line per method (test seeds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = res["config"]["faults"]
    cols = min(5, len(kinds))
    rows = math.ceil(len(kinds) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.6 * rows), squeeze=False, sharey=True,
                             sharex=True, layout="constrained")
    for ax, kind in zip(axes.ravel(), kinds, strict=False):
        for m, by_kind in res["test"].items():
            curve = by_kind[kind]["curve"]
            ax.step(range(len(curve)), curve, where="post", label=m, lw=1.2)
        ax.set(title=kind, ylim=(-0.05, 1.05))
        ax.grid(alpha=0.3)
    for ax in axes.ravel()[len(kinds):]:
        ax.axis("off")
    for ax in axes[-1]:
        ax.set_xlabel("steps after onset")
    for row in axes:
        row[0].set_ylabel("P(named)")
    axes[0][0].legend(fontsize=6)
    c = res["config"]
    fig.suptitle(f"naig detect --protocol persistent: K={c['ranks']}, batch {c['batch_size']}, "
                 f"α={c['false_alarm']:g} per step, {c['test']} test seeds: P(right rank named by onset + N)",
                 fontsize=9)
    save_figure(fig, path, dpi=150, bbox_inches="tight")
    plt.close(fig)
