"""Print the tables of docs/results/monitor-detection.md from ``naig detect --protocol persistent --json``.

Usage: python scripts/monitor_detection_tables.py docs/results/monitor-detection.json

The detection table (test seeds): P(named at the onset) / P(named within the horizon) in % /
median delay / wrong ranks per run, per fault kind and method, and the false alarms per 1000
clean steps (K = ``ranks``, batch ``batch_size``, α = ``false_alarm``) as its last row; then the
false-alarm table over every (batch, K, α) and method measured; then the chosen default's false alarms
on the validation pools (every batch size), when the document has them; then the candidates the
validation seeds chose among.
"""

from __future__ import annotations

import json
import sys

__all__ = ["candidate_table", "detection_table", "false_alarm_table", "main", "validation_false_alarm_table"]


def _num(v: float | None, digits: int = 3) -> str:
    return "–" if v is None else f"{v:.{digits}g}"


def detection_table(doc: dict) -> str:
    """The fault kind × method table (markdown)."""
    cfg, test = doc["config"], doc["test"]
    h = cfg["horizon"]
    methods = list(test)
    lines = ["| fault | " + " | ".join(methods) + " |", "|---|" + "--:|" * len(methods)]
    for kind in cfg["faults"]:
        cells = []
        for m in methods:
            s = test[m][kind]
            cells.append(f"{100 * s['p0']:.0f} / {100 * s[f'p{h}']:.0f} / {_num(s['median_delay'])} / "
                         f"{s['wrong']:.1f}")
        lines.append(f"| {kind} | " + " | ".join(cells) + " |")
    main = {r["method"]: r for r in doc["false_alarms"] if r["batch"] == cfg["batch_size"]
            and r["ranks"] == cfg["ranks"] and r["alpha"] == cfg["false_alarm"]}
    cells = [f"{main[m]['per_1000']:.2g} [{main[m]['per_1000_low']:.2g}–{main[m]['per_1000_high']:.2g}]"
             if m in main else "–" for m in methods]
    lines.append("| *false alarms / 1000 clean steps* | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def false_alarm_table(doc: dict) -> str:
    """The (batch, K, α, method) false-alarm table (markdown)."""
    lines = ["| batch | K | α | method | flagged / clean steps | per 1000 | 95% interval | mean run length "
             "| in [α/2, 2α] | interval decides |", "|--:|--:|--:|---|--:|--:|--:|--:|---|---|"]
    for r in doc["false_alarms"]:
        decides = "met" if r["established"] else ("not met" if not r["consistent"] else "undecided")
        run = "–" if r["run_length"] is None else f"{r['run_length']:.0f}"
        lines.append(f"| {r['batch']} | {r['ranks']} | {r['alpha']:g} | {r['method']} | {r['flagged']}/"
                     f"{r['steps']:,} ({r['recorded_steps']} recorded) | {r['per_1000']:.3g} | "
                     f"{r['per_1000_low']:.2g}–{r['per_1000_high']:.2g} | {run} | "
                     f"{'yes' if r['in_range'] else 'no'} | {decides} |")
    return "\n".join(lines)


def validation_false_alarm_table(doc: dict) -> str:
    """The default's false alarms on the validation pools, per (batch, K) at α (markdown; empty when
    the document predates them)."""
    rows = doc.get("validation_false_alarms") or []
    lines = ["| batch | K | α | flagged / clean steps | per 1000 | 95% interval |",
             "|--:|--:|--:|--:|--:|--:|"]
    lines += [f"| {r['batch']} | {r['ranks']} | {r['alpha']:g} | {r['flagged']}/{r['steps']:,} "
              f"({r['recorded_steps']} recorded) | {r['per_1000']:.3g} | "
              f"{r['per_1000_low']:.2g}–{r['per_1000_high']:.2g} |" for r in rows]
    return "\n".join(lines) if rows else ""


def candidate_table(doc: dict) -> str:
    """The candidates on validation (markdown): false alarms per 1000 at K = ``ranks``, batch
    ``batch_size``; mean P(named within the horizon); mean median delay; and, for the candidates tied
    on detection, the mean false alarms per 1000 over every validation pool and K (the tie-break)."""
    lines = ["| candidate | false alarms / 1000 | mean P(within) | mean delay | every pool, mean / 1000 |"
             " chosen |", "|---|--:|--:|--:|--:|---|"]
    for name, v in doc["validation"].items():
        delays = [d for d in v["median_delays"] if d is not None]
        every = v.get("false_alarms_everywhere")
        mean_every = _num(sum(r["per_1000"] for r in every) / len(every)) if every else "–"
        lines.append(f"| `{name}` | {v['false_alarm']['per_1000']:.3g} | {v['mean_p']:.3f} | "
                     f"{_num(sum(delays) / len(delays) if delays else None)} | {mean_every} | "
                     f"{'yes' if name == doc['default'] else ''} |")
    return "\n".join(lines)


def main(path: str) -> None:
    """Print both tables of the JSON document at ``path``."""
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    print(detection_table(doc), "", false_alarm_table(doc), "", validation_false_alarm_table(doc), "",
          candidate_table(doc), sep="\n")


if __name__ == "__main__":
    main(sys.argv[1])
