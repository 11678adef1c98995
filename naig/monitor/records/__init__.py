"""The monitor's records: JSONL, CSV, TensorBoard or any logger, written by rank 0 only.

A writer is added to the ``Monitor`` (``attach`` calls ``Monitor.add_writer``) and reads the
monitor's settings for the header::

    records = Records(JsonlRecords("monitor.jsonl"), TensorBoardRecords("runs/monitor"))
    monitor = records.attach(Monitor(action="warn"))     # every rank; only rank 0 writes
    ...                                                  # train (observe, or a DDP/FSDP hook)
    records.close()

Every rank calls its writers with the same data (the decision is made from gathered data); rank
0 of the monitor's group writes, the other ranks do nothing.

**Scores.** The detectors score each signal of each rank with a transient test (its normalised
value u against the pooled clean ranks) and a CUSUM change statistic, each against its own
threshold (``naig.monitor.detectors``). A record's *score* of a signal is the larger of
value/threshold over the two (|u|/t for the two-sided ``norm``, |S|/h for the CUSUM): a test
fires when its score exceeds 1, so scores of different tests and ranks compare. The thresholds
are the decision's (``Decision.thresholds``). A non-finite rank scores +inf (signal
``nonfinite``); a signal the detector does not score, NaN. The values behind the scores are each
rank's from the pass that decided it (a named rank's from the pass that named it, the others'
after the named ranks are left out of the mean), as the flags' are.

**Write failures.** A writer is a passenger: a write that fails (a full disk, a read-only folder,
a logger that raises) never ends training unless ``attach(monitor, on_error="raise")`` asked for
it. The writer warns once, stops writing, counts each step record it loses in ``lost`` and says the
count at ``close``; ``Monitor.observe`` carries the count to every rank, which warns once too.
``read_log`` reads every complete record of a file whose last line was cut and says so in
``MonitorLog.cut``.

**Step summary** (every writer): ``max_score`` (over ranks and signals), ``max_rank``,
``max_signal``, ``flagged`` (the flagged ranks), ``k_eff`` = 1/Σ_k π_k², the effective number of
ranks of the Gibbs weights π of the Fano–Fisher energies E_k (``naig.gibbs.naig_weights``, β
``"auto"``: K when the ranks agree, towards 1 when one dominates; at K = 2 the two drifts from
the mean are opposite, E_0 = E_1, so K_eff is 2 whatever the ranks: it cannot tell them apart)
and ``b_simple`` (the step's gradient noise scale).

**JSONL** (``JsonlRecords``, schema ``SCHEMA_VERSION``): one JSON object per line, flushed per
step. The first line of a run is a header ``{"type": "header", "schema", "naig", "created",
"world", "hosts", "monitor", "step_offset"}`` (``monitor``: its settings: blocks, seed, line,
batch, action, false_alarm, window, signals, scores, timeout). Then one line per step: ``{"type":
"step", "step", "action", "flagged", "flags", "where", "summary", "scores", "weights", "transient",
"cusum", "signals"}`` with ``flags`` a list of ``{"rank", "signal", "score", "z",
"threshold", "since"}``, ``where`` rank → where the integration places a flagged rank's departure (a DDP
bucket and its parameters; ``{}`` when not placed), ``scores`` and ``transient``/``cusum``
signal → (K,) lists, ``weights`` the (K,) π, and ``signals`` ``RankSignals.to_dict()`` (per rank:
nonfinite, usable, reference, sq_norm, rel_norm, energy, cos, sq_dist; ``kinds``: which are exact
and which sketch estimates; the noise scale). Non-finite floats are written as the strings
``"NaN"``, ``"Infinity"``, ``"-Infinity"`` (Python's names; ``float()`` reads them back), so every
line is strict JSON. ``append=True`` continues an existing file: a new header line, steps numbered
after its last (a monitor resumed with ``load_state_dict`` writes its own steps from its
checkpoint's on, ``step_offset`` = file step − monitor step = 0; a file that holds steps past that
checkpoint gets them again after the header, with a warning, or for a CSV is refused);
``overwrite=True`` replaces it (the file a crashed run left); without either an existing file is
refused.

**CSV** (``CsvRecords``): one row per rank per step, columns ``CSV_COLUMNS``; non-finite values as
``nan``/``inf``. A CSV written before a signal existed (its header lacks that signal's columns,
``csv_columns``) reads back without them and ``append=True`` continues it with its own header (one
warning says which signals' scores it leaves out).

**TensorBoard** (``TensorBoardRecords``, the optional extra ``naig[tensorboard]``): scalars under
``naig_monitor/`` at global step = the step: ``max_score``, ``max_rank``, ``k_eff``,
``flagged_ranks`` (count), ``b_simple``; with ``per_rank=True`` also ``rank{k}/score_{signal}``,
``rank{k}/weight``, ``rank{k}/rel_norm``, ``rank{k}/cos``, ``rank{k}/energy``.

**Any logger** (``LoggerRecords(fn)``): ``fn(dict)`` once per step with flat keys
``naig_monitor/step``, the summary scalars and (``per_rank=True``) the per-rank ones as above,
e.g. ``LoggerRecords(wandb.log)``.
"""

from naig.monitor.records.reader import MAX_WORLD, MonitorLog, read_log
from naig.monitor.records.schema import (
    CSV_COLUMNS,
    PREFIX,
    SCHEMA_VERSION,
    csv_columns,
    csv_signals,
    decision_scalars,
    decode,
    encode,
    flat_scalars,
    k_eff,
    step_record,
)
from naig.monitor.records.writers import (
    ON_ERROR,
    CsvRecords,
    JsonlRecords,
    LoggerRecords,
    Records,
    RecordWriter,
    TensorBoardRecords,
)

__all__ = ["CSV_COLUMNS", "ON_ERROR", "PREFIX", "SCHEMA_VERSION", "CsvRecords", "JsonlRecords",
           "LoggerRecords", "MAX_WORLD", "MonitorLog", "Records", "RecordWriter", "TensorBoardRecords",
           "csv_columns", "csv_signals", "decision_scalars", "decode", "encode", "flat_scalars", "k_eff",
           "read_log", "step_record"]
