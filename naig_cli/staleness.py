"""``naig staleness``: staleness that emerges from worker speeds, measured against its laws.

The library side is ``naig.arrivals`` (docs/design.md §10); it is imported inside the
command so that ``naig spectrum`` start-up does not pay for it (nor for scipy).

Option design for compute time that scales with the minibatch (X = x0 + b·x1):
``--compute`` is x0, the per-job time (the whole compute time when ``--per-sample`` is
absent), ``--per-sample`` is x1, the seconds per sample, and ``--batch-size`` is b.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated, Any

import numpy as np
from rich import box
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from naig.errors import UsageError
from naig_cli._common import (
    ArrivalMode,
    DownlinkOpt,
    JsonOpt,
    ModeOpt,
    UplinkOpt,
    WindowOpt,
    fit_table,
    fmt_num,
    handle_errors,
    natural_width,
    opt,
    print_json,
    printable,
    progress,
    stdout,
    word_flags,
)

if TYPE_CHECKING:
    from naig.arrivals import ArrivalModel, Estimate, StalenessReport

__all__ = ["staleness", "parse_sweep", "SYMBOLS"]

SYMBOLS = """**Rows**: τ, staleness: server updates between a gradient's parameter read and its application
(τ + 1 versions old); λ, arrivals per second at the master (λ̂ measured); E[A], the age: seconds
from a gradient's parameter read to its arrival; E[max C], a synchronous round: the slowest of the
K compute times C_i; Little: Little's law, λ̂·E[A] − 1 = mean τ (exact in blocking mode with
B = 1); B, arrivals per server update (--window). Intervals: 95% batch means, after a start-up of
the first arrivals (until every worker has delivered once), left out. More: docs/staleness.md.
"""

_MAX_SWEEP = 256
_HIST_ROWS = 24
_BAR = 40
_BIG = 1e6  # cells at or past this magnitude are written 1.235e+30 (a row keeps its label)
_WORKER_ROWS = 32  # the per-worker table shows the first and last 16 workers past this
_DEFAULT_WORKERS = 4
_MAX_PARAMS = 10**15


_SPEC_HELP = "one for all workers or one per worker, e.g. exp:1 or exp:0.5,exp:1,exp:2,exp:4"


@handle_errors
def staleness(
    workers: Annotated[int | None, opt("--workers", "K workers (default: the lists' length, or 4).")] = None,
    compute: Annotated[str, opt("--compute", "Compute time x0, seconds: const:MEAN, exp:MEAN, "
                                "shifted-exp:MEAN:SHIFT, gamma:MEAN:SHAPE, lognormal:MEAN:SIGMA; "
                                f"{_SPEC_HELP}.")] = "exp:1",
    per_sample: Annotated[str | None, opt("--per-sample", "Compute seconds per sample x1: "
                                          "X = x0 + b·x1 with b = --batch-size.")] = None,
    batch_size: Annotated[int, opt("--batch-size", "b, samples per minibatch (needs --per-sample).")] = 1,
    uplink: UplinkOpt = None,
    downlink: DownlinkOpt = None,
    bandwidth: Annotated[str | None, opt("--bandwidth", "Link bytes/s, one or one per worker: a "
                                         "message costs latency + 4·params / bandwidth.")] = None,
    params: Annotated[int, opt("--params", "n float32 parameters of the model (message sizes); "
                               "default: GPT-2 small.")] = 124_439_808,
    mode: ModeOpt = ArrivalMode.blocking,
    window: WindowOpt = 1,
    updates: Annotated[int, opt("--updates", "N gradient arrivals to simulate.")] = 100_000,
    seed: Annotated[int, opt("--seed", "Seed of the simulation, 0..2^64-1.")] = 0,
    sweep: Annotated[str | None, opt("--sweep", "Vary one setting: workers=1..64 or "
                                     "batch-size=1,8,32,128 (ranges A..B and lists).")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Simulate gradient arrivals at a master; print staleness, rate and bandwidth beside their laws.

    Each measured value carries a 95% batch-means interval; a prediction outside it is
    shown in red. Predictions that do not apply (e.g. the K − 1 law in non-blocking
    mode) are shown as — (null in JSON). A run that would not fit in memory is refused
    before it starts (the message gives the memory it would take); too few updates for an
    interval, or a round time the quadrature cannot predict, give a one-line warning.
    """
    from naig.arrivals.engine import check_count

    check_count(params, "params")  # before it sizes the messages
    if params > _MAX_PARAMS:
        raise UsageError(f"use at most {_MAX_PARAMS:.0e} parameters", field="params", value=params)
    base = dict(workers=workers, compute=compute, per_sample=per_sample, batch_size=batch_size,
                uplink=uplink, downlink=downlink, mode=mode.value, bytes_up=4.0 * params,
                bytes_down=4.0 * params, bandwidth=_parse_bandwidth(bandwidth))
    run = dict(updates=updates, seed=seed, window=window, params=params)
    with _one_line_warnings() as said:
        if sweep is None:
            _run_one(base, run, json_out, said)
        else:
            _run_sweep(base, run, *parse_sweep(sweep), json_out, said)


@contextmanager
def _one_line_warnings() -> Iterator[Callable[[], list[str]]]:
    """Python warnings raised by the library (scipy's included) as ``warning: …`` lines, once each;
    yields what they say so far (for the JSON document's ``warnings``)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")

        def said() -> list[str]:
            return list(dict.fromkeys(printable(word_flags(" ".join(str(w.message).split())))
                                      for w in caught))

        try:
            yield said
        finally:
            for text in said():
                sys.stderr.write(f"warning: {text}\n")


def _too_few(report: StalenessReport, label: str = "") -> None:
    """Warn (one line) when the measured mean has no interval: too few arrivals after the start-up."""
    if report.measured.mean.interval is None:
        warnings.warn(f"{label}`updates` {report.updates}: too few arrivals for 95% intervals (batch "
                      f"means need 20 after the start-up of {report.measured.warmup}); the measured "
                      "values have none; use e.g. `updates` 10000", UserWarning, stacklevel=2)


def _run_one(base: dict, run: dict, json_out: bool, said: Callable[[], list[str]]) -> None:
    from naig.arrivals import staleness_report

    model = _model(base)
    t0 = time.perf_counter()
    report = staleness_report(model, **run)  # its memory is checked before the first draw
    _too_few(report)
    if json_out:
        print_json({**report.to_dict(), "warnings": said()})
    else:
        _emit(_render(report, time.perf_counter() - t0))


def _run_sweep(base: dict, run: dict, field: str, values: list[int], json_out: bool,
               said: Callable[[], list[str]]) -> None:
    """One report per value of the swept setting; every model (and its memory) is checked before
    the first run."""
    from naig.arrivals import SCHEMA_VERSION, staleness_report
    from naig.arrivals.engine import check_memory

    models = [_swept_model(base, field, v) for v in values]
    if isinstance(run["updates"], int) and run["updates"] >= 1:
        for v, m in zip(values, models, strict=True):
            _at_point(field, v, check_memory, m, run["updates"])
    reports = []
    with progress("staleness sweep", len(models)) as advance:
        for m in models:
            reports.append(staleness_report(m, **run))
            advance()
    for v, r in zip(values, reports, strict=True):
        _too_few(r, f"at {field.replace('_', '-')}={v}, ")
    if json_out:
        print_json({"schema_version": SCHEMA_VERSION, "sweep": {"field": field, "values": values},
                    "runs": [r.to_dict() for r in reports], "warnings": said()})
    else:
        _emit(_render_sweep(field, values, reports))


def _at_point(field: str, value: int, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``; a UsageError about the swept field names the sweep point instead."""
    try:
        return fn(*args)
    except UsageError as exc:
        if exc.field != field:
            raise
        raise UsageError(f"at {field.replace('_', '-')}={value}, {exc.message}", field="sweep") from None


@dataclasses.dataclass
class _Fitting:
    """A table's title, columns and rows, rendered (``render``) without the columns of ``drop``, in that
    order, that a narrow terminal cannot hold with every cell whole (as audit and simulate do)."""

    title: str
    columns: tuple[str, ...]
    drop: tuple[str, ...] = ()
    left: tuple[str, ...] = ()  # left-aligned besides the first column
    collapse_padding: bool = False
    caption: str | None = None  # under the table, wrapped (not a cell: it would widen a column)
    rows: list[tuple[Any, ...]] = dataclasses.field(default_factory=list)

    def add_row(self, *cells: Any) -> None:
        self.rows.append(cells)

    def render(self, keep: Sequence[str]) -> Table:
        t = Table(title=self.title, box=box.SIMPLE_HEAD, title_justify="left", pad_edge=False,
                  show_edge=False, collapse_padding=self.collapse_padding, caption=self.caption,
                  caption_justify="left")
        for i, col in enumerate(self.columns):
            if col in keep:
                t.add_column(col, justify="left" if i == 0 or col in self.left else "right", no_wrap=True)
        for row in self.rows:
            t.add_row(*(cell for col, cell in zip(self.columns, row, strict=True) if col in keep))
        return t


def _emit(renderables: list) -> None:
    """Print what was fully computed (nothing is printed if computing a row fails; a table's columns
    are chosen for the terminal here)."""
    for item in renderables:
        if isinstance(item, str):
            stdout.print(item, markup=False)
        elif isinstance(item, _Fitting):
            _print_fitted(item)
        else:
            stdout.print(item)


def _print_fitted(table: _Fitting) -> None:
    """Leave out ``table.drop``'s columns, in order, until every cell fits whole (``fit_table``), and say
    which; where even the rest does not fit, print it whole and let the terminal wrap."""
    width = stdout.width
    t, dropped = fit_table(table.render, table.columns, table.drop, width)
    stdout.width = max(width, natural_width(t))
    try:
        stdout.print(t)
    finally:
        stdout.width = width
    if dropped:
        said = ", ".join(name or "the bars" for name in dropped)
        stdout.print(f"left out to fit {width} columns: {said} (--json has them all)", markup=False)


def _model(kwargs: dict) -> ArrivalModel:
    """The model of the options; one spec everywhere means the documented default of 4 workers."""
    from naig.arrivals import ArrivalModel

    lists = [kwargs[f] for f in ("compute", "per_sample", "uplink", "downlink") if kwargs[f]]
    single = not any("," in text for text in lists) and len(kwargs["bandwidth"]) <= 1
    if kwargs["workers"] is None and single:
        kwargs = kwargs | {"workers": _DEFAULT_WORKERS}
    return ArrivalModel.from_specs(**kwargs)


def _parse_bandwidth(text: str | None) -> tuple[float, ...]:
    if text is None:
        return ()
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        raise UsageError("use bytes per second, one or one per worker, e.g. 1.25e9",
                         field="bandwidth", value=text) from None
    if any(not (math.isfinite(v) and v > 0) for v in values):
        raise UsageError("use bytes per second > 0, e.g. 1.25e9", field="bandwidth", value=text)
    return values


def _int_items(text: str) -> list[int]:
    out: list[int] = []
    for item in text.split(","):
        lo, _, hi = item.strip().partition("..")
        a, b = int(lo), int(hi) if hi else int(lo)
        if a < 1 or b < a:
            raise ValueError(item)
        out.extend(range(a, b + 1))
        if len(out) > _MAX_SWEEP:
            raise OverflowError
    return out


def parse_sweep(text: str) -> tuple[str, list[int]]:
    """``workers=1..64`` or ``batch-size=1,8,32`` → (field, values).

    Example:
        >>> parse_sweep("workers=1..3,8")
        ('workers', [1, 2, 3, 8])
    """
    name, eq, spec = text.partition("=")
    field = name.strip().replace("-", "_")
    if not eq or field not in ("workers", "batch_size"):
        raise UsageError("write workers=VALUES or batch-size=VALUES, e.g. workers=1..64",
                         field="sweep", value=text)
    try:
        values = _int_items(spec)
    except OverflowError:
        raise UsageError(f"at most {_MAX_SWEEP} values", field="sweep", value=text) from None
    except ValueError:
        raise UsageError("values are integers >= 1 and ranges A..B, e.g. 1..8,16,32",
                         field="sweep", value=text) from None
    twice = sorted({v for v in values if values.count(v) > 1})
    if twice:  # each point once: a repeated one printed the same row again
        raise UsageError(f"{', '.join(map(str, twice))} listed more than once; list each value once",
                         field="sweep", value=text)
    return field, values


def _swept_model(base: dict, field: str, value: int) -> ArrivalModel:
    """The model of one sweep point; its errors name the sweep value, not an option not given."""
    return _at_point(field, value, lambda: _model(base | _swept(base, field, value)))


def _swept(base: dict, field: str, value: int) -> dict:
    """The settings of one sweep point; refuses a sweep that contradicts an option."""
    if field == "workers":
        given = [f for f in ("compute", "per_sample", "uplink", "downlink") if base[f] and "," in base[f]]
        if base["workers"] is not None or given or len(base["bandwidth"]) > 1:
            what = f"`{given[0]}` lists one value per worker" if given else "`workers` is given"
            raise UsageError(f"varies K: {what}; give one spec for all workers", field="sweep")
        return {"workers": value}
    if base["batch_size"] != 1:
        raise UsageError("varies b: drop `batch_size`", field="sweep")
    return {"batch_size": value}


# ----------------------------------------------------------------------------- rendering


def _si(v: float | None, unit: str) -> str:
    """1.23 GB/s style; ``—`` for undefined."""
    if v is None or not math.isfinite(v):
        return "—"
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= scale:
            return f"{v / scale:.3g} {prefix}{unit}"
    return f"{v:.3g} {unit}"


def _num(v: float | None, spec: str) -> str:
    """A table number: ``spec``, or ``1.235e+30`` from ``_BIG`` on (cells stay narrow)."""
    return fmt_num(v, spec, big=_BIG)


def _interval(e: Estimate, spec: str) -> str:
    return "—" if e.interval is None else escape(f"[{_num(e.low, spec)}, {_num(e.high, spec)}]")


def _pred(value: float | None, inside: bool | None, spec: str) -> str:
    """A predicted cell: red when outside the measured interval, — when there is no prediction."""
    cell = _num(value, spec)
    return f"[red]{cell} (outside)[/]" if inside is False else cell


def _table(title: str, *columns: str, drop: tuple[str, ...] = (), left: tuple[str, ...] = ()) -> _Fitting:
    """A table of ``columns`` (the first and ``left`` left-aligned) that leaves out ``drop``'s, in order,
    where the terminal is too narrow for every cell whole."""
    return _Fitting(title, columns, drop, left)


def _main_rows(r: StalenessReport) -> list[tuple[str, Estimate, float | None, bool | None, str]]:
    m, p, w = r.measured, r.predicted, r.within()
    return [
        ("mean staleness τ", m.mean, p.mean, w["mean"], ".4f"),
        ("mean τ + 1 (versions old)", m.mean.shifted(1), p.mean_plus_one, w["mean_plus_one"], ".4f"),
        ("P(τ = 0)", m.p_zero, p.p_zero, w["p_zero"], ".4f"),
        ("Var τ", m.variance, p.variance, w["variance"], ".3f"),
        ("arrivals per second λ", m.rate, p.rate, w["rate"], ".4f"),
        ("age E[A], seconds", m.age, p.age, w["age"], ".4f"),
        ("sync round E[max C], seconds", r.round_time, p.round_time, w["round_time"], ".4f"),
    ]


_WORDS = ("τ staleness (updates between a gradient's read and its use); λ arrivals/s; E[A] seconds from "
          "read to arrival; E[max C] (round) the slowest worker's compute per synchronous round; Little: "
          "λ̂·E[A] − 1 = τ; B arrivals per update (more: --help, docs/staleness.md)")


def _render(r: StalenessReport, wall: float) -> list:
    """Every table of one report, rendered before anything is printed."""
    t = _table("measured (95% batch-means interval) vs predicted", "quantity", "measured", "95% interval",
               "predicted", drop=("95% interval", "predicted"))
    for name, e, pred, inside, spec in _main_rows(r):
        t.add_row(escape(name), _num(e.value, spec), _interval(e, spec), _pred(pred, inside, spec))
    t.add_row("Little: λ̂·E[A] − 1 vs τ", _num(r.measured.mean.value, ".4f"), "",
              _pred(r.little, r.within()["little"], ".4f"))
    speed = r.updates / r.simulate_seconds if r.simulate_seconds > 0 else math.inf
    footer = (f"{r.updates:,} arrivals simulated in {r.simulate_seconds:.3f} s "
              f"({_num(speed, ',.0f')} arrivals/s), {r.rounds:,} synchronous rounds; "
              f"{wall:.2f} s in all; statistics after a start-up of {r.measured.warmup} arrivals\n{_WORDS}")
    return [_header(r), t, _worker_table(r), _bandwidth_table(r), _histogram(r), footer]


def _header(r: StalenessReport) -> str:
    d = r.model.describe()
    k = r.model.workers
    parts = [f"K = {k} worker{'s' * (k != 1)}, {r.model.mode}", f"compute {_specs(d['compute'])}"]
    if d["per_sample"]:
        parts.append(f"+ b·{_specs(d['per_sample'])}, b = {r.model.batch_size}")
    for name in ("uplink", "downlink"):
        if d[name]:
            parts.append(f"{name} {_specs(d[name])}")
    if d["bandwidth"]:
        parts.append(f"bandwidth {_specs([_si(b, 'B/s') for b in d['bandwidth']])}")
    win = f", window B = {r.window}" if r.window != 1 else ""
    return "; ".join(parts) + f"; {r.updates:,} arrivals{win}, seed {r.seed}"


def _specs(items: list[str]) -> str:
    return items[0] if len(set(items)) == 1 else ",".join(items)


def _worker_table(r: StalenessReport) -> Table:
    t = _table("per worker: E[τ_i] = E[C_i]·Σ_{j≠i} 1/E[C_j] (blocking, B = 1)", "worker",
               "E[X_i] s" if r.model.mode == "non-blocking" else "E[C_i] s", "updates", "mean τ_i",
               "95% interval", "predicted",
               drop=("95% interval", "updates", "E[X_i] s", "E[C_i] s", "predicted"))
    pred = r.predicted.per_worker or (None,) * r.model.workers
    inside = r.within()["per_worker"] or [None] * r.model.workers
    cycle = r.model.mean_compute() if r.model.mode == "non-blocking" else r.model.mean_cycle()
    k = r.model.workers
    shown = range(k) if k <= _WORKER_ROWS else [*range(_WORKER_ROWS // 2), *range(k - _WORKER_ROWS // 2, k)]
    for i in shown:
        if k > _WORKER_ROWS and i == k - _WORKER_ROWS // 2:
            t.add_row("…", "", "", "", "", "")
            t.caption = f"… {k - _WORKER_ROWS:,} more workers (--json lists every worker)"
        e = r.measured.per_worker[i]
        t.add_row(str(i), f"{cycle[i]:.4g}", f"{int(r.measured.counts[i]):,}", _num(e.value, ".4f"),
                  _interval(e, ".4f"), _pred(pred[i], inside[i], ".4f"))
    return t


def _bandwidth_table(r: StalenessReport) -> Table:
    b = r.bandwidth()
    t = _table(f"bandwidth at the master, n = {r.params:,} float32 parameters", "flow", "per message",
               "measured", "predicted", drop=("per message", "predicted"))
    for key, name, size in (("up_gradient", "up: full gradient", b["gradient_bytes"]),
                            ("up_sketch", "up: sketch only (14 float32)", b["sketch_bytes"]),
                            ("down_parameters", "down: parameters", b["gradient_bytes"])):
        t.add_row(name, _si(size, "B"), _si(b["measured"][key], "B/s"), _si(b["predicted"][key], "B/s"))
    ring = b["sync_allreduce_per_worker"] * r.round_time.value
    t.add_row("sync ring all-reduce, per worker", _si(ring, "B"),
              _si(b["sync_allreduce_per_worker"], "B/s"), "")
    return t


def _hist_bins(counts: list[int]) -> list[tuple[str, int, int]]:
    """(label, first τ, last τ) rows: one per τ, or ranges when there are many; the values past
    the 99.9th percentile share the last row."""
    cum = np.cumsum(counts)
    top = int(np.searchsorted(cum, 0.999 * cum[-1]))
    width = max(1, math.ceil((top + 1) / _HIST_ROWS))
    rows = []
    for a in range(0, top + 1, width):
        b = min(a + width, top + 1) - 1
        rows.append((str(a) if a == b else f"{a}–{b}", a, b))
    if top < len(counts) - 1:
        rows.append((f"≥ {top + 1}", top + 1, len(counts) - 1))
    return rows


def _histogram(r: StalenessReport) -> Table:
    counts = r.measured.histogram
    pmf = r.predicted.pmf(np.arange(len(counts)))
    total = counts.sum()
    rows = [(label, counts[a:b + 1].sum() / total, a, b) for label, a, b in _hist_bins(counts.tolist())]
    peak = max(share for _, share, _, _ in rows)
    t = _table("staleness histogram (share of updates)", "τ", "measured", "predicted", "",
               drop=("", "predicted"), left=("",))
    for label, share, a, b in rows:
        pred = "—" if pmf is None else f"{float(pmf[a:b + 1].sum()):.4f}"
        t.add_row(label, f"{share:.4f}", pred, Text("█" * round(_BAR * share / peak), style="cyan"))
    return t


def _render_sweep(field: str, values: list[int], reports: list[StalenessReport]) -> list:
    name = "K" if field == "workers" else "b"
    t = _table(f"sweep over {name}: staleness, age, bandwidth (n = {reports[0].params:,})", name, "λ /s",
               "mean τ ± 95%", "predicted", "P(τ=0)", "E[A] s", "gradients ↑", "round s",
               drop=("round s", "gradients ↑", "E[A] s", "P(τ=0)", "predicted", "λ /s"))
    t.collapse_padding = True
    for v, r in zip(values, reports, strict=True):
        m = r.measured
        half = "" if m.mean.interval is None else f" ± {_num((m.mean.high - m.mean.low) / 2, '.3f')}"
        t.add_row(str(v), _num(m.rate.value, ".4g"), f"{_num(m.mean.value, '.3f')}{half}",
                  _pred(r.predicted.mean, r.within()["mean"], ".3f"), _num(m.p_zero.value, ".4f"),
                  _num(m.age.value, ".4g"), _si(r.bandwidth()["measured"]["up_gradient"], "B/s"),
                  _num(r.round_time.value, ".4g"))
    return [f"first point: {_header(reports[0])}", t,
            f"gradients ↑: bytes/s of gradients into the master; {_WORDS}"]
