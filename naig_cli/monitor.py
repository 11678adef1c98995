"""``naig monitor``: read the records the monitor wrote (``naig.monitor.records``).

``naig monitor report LOG`` reads a monitor JSONL or CSV file and prints one row per rank: steps
seen, steps flagged, the tests that fired, each signal's largest score (z/threshold: a test
fires above 1; ∞ for a non-finite gradient), the last flagged step and the host; below
the table, where the integration placed each rank's last flag (a bucket and its parameters). ``--plot``
draws each rank's scores over the steps with its flagged steps marked; ``--json`` prints the
same table as one document. The library is imported inside the command (torch comes with it).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich import box
from rich.markup import escape
from rich.table import Table

from naig_cli import _common
from naig_cli._common import JsonOpt, fmt_num, handle_errors, opt, print_json, printable, stdout

if TYPE_CHECKING:
    from naig.monitor.records import MonitorLog

__all__ = ["app", "report", "EXAMPLES", "FOOTER", "REPORT_SCHEMA"]

REPORT_SCHEMA = 1  # of the `naig monitor report --json` document
EXAMPLES = """**Examples**

```
naig monitor report monitor.jsonl                 # a row per rank
naig monitor report monitor.csv --plot ranks.png  # scores over steps
naig monitor report monitor.jsonl --json          # one JSON document
```
"""

app = typer.Typer(name="monitor", help="Read the records of naig.monitor (per-rank gradient signals).",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  rich_markup_mode="markdown")


@app.command("report", epilog=EXAMPLES)
@handle_errors
def report(
    log: Annotated[Path, typer.Argument(help="A monitor record: JSONL (JsonlRecords) or CSV (CsvRecords).",
                                        show_default=False, metavar="LOG")],
    plot: Annotated[str | None, opt("--plot", "Write each rank's scores over the steps, flags marked, to "
                                    "PATH (.png, .pdf, .svg).")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Per-rank table of a monitor log: steps, flags, max score per signal, last flagged step, host.

    A score is a test's statistic over its threshold (a test fires above 1; ∞: a non-finite
    gradient); the max is over the log's steps and the two tests (transient: the rank's value
    against the other ranks'; CUSUM: its change statistic). A log whose last line was cut (a full disk, a
    killed run) shows every complete step and says what was cut; a corrupt log is a one-line
    error naming the file and line. In --json, non-finite scores are the strings "Infinity" and "NaN",
    as in the log.
    """
    _common.check_plot_path(plot, "ranks.png", (("log", log),))  # before reading the log
    from naig.monitor.records import encode, read_log

    data = read_log(log)
    rows = data.rank_rows()
    if json_out:
        print_json({"schema_version": REPORT_SCHEMA, "log": printable(str(data.path)), "format": data.format,
                    "world": data.world, "steps": len(data.steps),
                    "first_step": int(data.steps[0]) if len(data.steps) else None,
                    "last_step": int(data.steps[-1]) if len(data.steps) else None,
                    "runs": [list(r) for r in data.runs()],
                    "signals": list(data.scores), "cut": printable(data.cut) or None,
                    "ranks": encode(printable(rows))})
    else:
        _table(data, rows)
    if plot is not None:
        _plot(data, plot)
        if not json_out:
            stdout.print(f"plot: {escape(printable(plot))}")


FOOTER = (
    "score = a test's statistic over its threshold, the larger of |u|/t (transient test: u the rank's "
    "normalised value against the other ranks', t its threshold) and |S|/h (change test: S the rank's "
    "CUSUM, h its threshold); a test fires above 1; ∞: a non-finite gradient; —: not scored. Signals: "
    "norm ‖g‖ against the ranks' median; cos, distance and energy (the Fano–Fisher energy E) of the "
    "rank's gradient against the mean; persistence: the cosine of its drift from the mean at two "
    "consecutive steps; drift: an EWMA of that drift (T²); turn: the angle between its own gradients at "
    "consecutive steps (small for a rank that reuses a batch). cos, distance, energy, persistence and "
    "drift are measured against the mean, which a bad rank pulls, so at its step the others' scores "
    "rise too; the flags name the rank whose exclusion explains them. flags: signal/test ×steps. "
    "Guide: docs/monitor.md")


def _score(v: float) -> str:
    return "∞" if v == math.inf else fmt_num(v, ".3g")


_DROP = ("host", "cos", "persistence", "drift", "turn", "distance", "steps", "energy", "norm", "last flag")
"""The report's columns in the order they are left out to fit a narrow terminal (rank, flagged and
flags stay)."""


def _table(data: MonitorLog, rows: list[dict]) -> None:
    runs = data.runs()
    spans = ", then ".join(f"{a}..{b}" for a, b in runs)
    within = f" in {len(runs)} runs" if len(runs) > 1 else ""  # a resumed run appended to a crashed one
    ranks = "rank" if data.world == 1 else "ranks"
    title = (f"{escape(printable(str(data.path)))}: {data.format}, K = {data.world} {ranks}, "
             f"{len(data.steps)} step{'' if len(data.steps) == 1 else 's'}{within} ({spans}); "
             "max score per signal")
    cells = [{"rank": str(r["rank"]), "host": escape(printable(r["host"])) or "—", "steps": str(r["steps"]),
              "flagged": str(r["flagged_steps"]),
              "flags": escape("\n".join(f"{printable(k)} ×{n}" for k, n in sorted(r["flags"].items()))
                              or "—"),
              **{s: _score(r["max_score"][s]) for s in data.scores},
              "last flag": str(r["last_flagged"]) if r["last_flagged"] is not None else "—"} for r in rows]

    def build(columns: list[str]) -> Table:
        t = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left")
        for c in columns:
            t.add_column(c, justify="left" if c in ("host", "flags") else "right", no_wrap=True)
        for r, row in zip(rows, cells, strict=True):
            t.add_row(*(row[c] for c in columns), style="red" if r["flagged_steps"] else None)
        return t

    columns = ["rank", "host", "steps", "flagged", "flags", *data.scores, "last flag"]
    t, hidden = _common.fit_table(build, columns, [c for c in _DROP if c in columns], stdout.width)
    stdout.print(t)
    if hidden:
        stdout.print(_common.narrow_note(hidden), markup=False)
    for r in rows:
        if r["where"]:
            stdout.print(f"rank {r['rank']} at step {r['last_flagged']}: {escape(printable(r['where']))}")
    if data.cut:
        stdout.print(f"[yellow]the log ends cut short: {escape(printable(data.cut))}[/]")
    stdout.print(FOOTER)


def _plot(data: MonitorLog, path: str) -> None:
    """One panel per signal: each rank's score over the steps (symlog), × where that signal (or a
    non-finite gradient) flagged the rank."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    scored = [n for n in data.scores if not np.isnan(data.scores[n]).all()]
    names = scored or list(data.scores)[:1]  # a signal never scored (cos by default) gets no empty panel
    fig, axes = plt.subplots(len(names), 1, figsize=(8, 2.4 * len(names) + 0.9), sharex=True, squeeze=False)
    for ax, name in zip(axes[:, 0], names, strict=True):
        y = data.scores[name]
        finite = y[np.isfinite(y)]
        top = max(float(finite.max()) if len(finite) else 1.0, 1.0) * 2
        for k in range(data.world):
            col = f"C{k % 10}"
            shown = np.where(np.isinf(y[:, k]), top, y[:, k])  # a non-finite gradient at the top edge
            host = f" ({data.hosts[k]})" if k < len(data.hosts) and data.hosts[k] else ""
            ax.plot(data.steps, shown, color=col, lw=1, label=f"rank {k}{host}")
            hit = np.array([any(r == k and sig in (name, "nonfinite") for r, sig, _ in f)
                            for f in data.flags], dtype=bool)
            ax.plot(data.steps[hit], shown[hit], "x", color=col, ms=8, mew=2)
        ax.axhline(1.0, color="k", ls="--", lw=0.8)
        ax.set_yscale("symlog", linthresh=1.0, linscale=2.0)
        ax.set_ylim(0.0, top * 3)  # scores are >= 0; room above the largest (and the non-finite edge)
        ax.set_ylabel(f"{name} score")
    axes[0, 0].legend(fontsize=7, ncol=min(data.world, 4), loc="upper left")
    axes[-1, 0].set_xlabel("step")
    unscored = [n for n in data.scores if n not in names]
    title = (f"{data.path.name}: score = statistic/threshold, the larger of the transient test\nand the "
             "CUSUM (a test fires above the dashed line); × the rank named by that signal;\n"
             "non-finite at the top edge" + (f"; not scored: {', '.join(unscored)}" if unscored else ""))
    fig.suptitle(title, fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    _common.save_figure(fig, path)
    plt.close(fig)
