"""naig.monitor.records: the JSONL, CSV, TensorBoard and logger writers, and reading a log back."""

import csv
import json
import math
import subprocess
import sys
import warnings

import numpy as np
import pytest

from naig.errors import DataError, UsageError
from naig.gibbs import naig_weights
from naig.monitor import SIGNALS, Detector, Monitor, rank_signals
from naig.monitor.records import (
    CSV_COLUMNS,
    PREFIX,
    SCHEMA_VERSION,
    CsvRecords,
    JsonlRecords,
    LoggerRecords,
    Records,
    RecordWriter,
    TensorBoardRecords,
    decode,
    encode,
    k_eff,
    read_log,
)

WORLD, WINDOW, BAD_RANK, SCALE_STEP, NAN_STEP, STEPS = 4, 6, 2, 10, 12, 12


def _stream(seed: int = 0):
    """(signals, gradients) per step for 4 ranks of a synthetic run: rank 2 ×1000 at step 10 and a NaN
    entry on rank 1 at step 12 (sketches are exact projections of the gradients, n = 200)."""
    rng = np.random.default_rng(seed)
    proj = rng.standard_normal((200, 14)) / math.sqrt(14)
    for step in range(1, STEPS + 1):
        g = 1.0 + rng.standard_normal((WORLD, 200))
        if step == SCALE_STEP:
            g[BAD_RANK] *= 1000.0
        if step == NAN_STEP:
            g[1, 3] = np.nan
        bad = (~np.isfinite(g)).sum(1)
        yield rank_signals(np.nan_to_num(g) @ proj, (g * g).sum(1), bad)


def _run(writer, seed: int = 0, monitor: Monitor | None = None) -> list:
    """Feed the stream through a monitor's detector with ``writer`` attached; the decisions."""
    mon = monitor or Monitor(window=WINDOW)
    writer.attach(mon)
    mon.detector = Detector(WORLD, window=WINDOW)  # what Monitor.observe builds at its first step
    out = []
    for sig in _stream(seed):
        d = mon.detector.update(sig)
        for w in mon.writers:
            w(sig, d)
        out.append(d)
    writer.close()
    return out


def _strict(line: str) -> dict:
    def refuse(token: str) -> None:
        raise ValueError(f"non-standard JSON token {token}")

    return json.loads(line, parse_constant=refuse)


def test_encode_decode_round_trip_non_finite() -> None:
    obj = {"a": [1.5, math.inf, -math.inf], "b": (math.nan, 2), "c": np.float64(3.0)}
    text = json.dumps(encode(obj), allow_nan=False)
    back = decode(json.loads(text))
    assert back["a"] == [1.5, math.inf, -math.inf] and math.isnan(back["b"][0]) and back["c"] == 3.0


def test_k_eff_of_the_gibbs_weights() -> None:
    assert k_eff(np.array([2.0, 2.0, 2.0]))[0] == pytest.approx(3.0, abs=1e-12)
    # β auto = 1/median of the positive energies (100): π ∝ (1, e⁻¹, e⁻¹, e⁻¹)
    w = np.array([1.0, math.exp(-1), math.exp(-1), math.exp(-1)])
    w /= w.sum()
    keff, pi = k_eff(np.array([0.0, 100.0, 100.0, 100.0]))
    assert pi == pytest.approx(w, abs=1e-12) and keff == pytest.approx(1 / (w * w).sum(), abs=1e-12)
    assert k_eff(np.array([np.nan, np.nan]))[0] == pytest.approx(2.0)  # no finite energy: uniform


def test_jsonl_records_every_step_with_header_and_strict_json(tmp_path) -> None:
    path = tmp_path / "m.jsonl"
    decisions = _run(JsonlRecords(path))
    lines = path.read_text().splitlines()
    assert len(lines) == 1 + STEPS
    header = _strict(lines[0])
    assert header["type"] == "header" and header["schema"] == SCHEMA_VERSION and header["world"] == WORLD
    assert header["monitor"]["window"] == WINDOW and header["monitor"]["false_alarm"] == 1e-3
    sigs = list(_stream())
    for line, d, sig in zip(lines[1:], decisions, sigs, strict=True):
        rec = decode(_strict(line))
        assert rec["step"] == d.step and rec["flagged"] == list(d.ranks)
        assert [(f["rank"], f["signal"], f["score"]) for f in rec["flags"]] == [
            (f.rank, f.signal, f.score) for f in d.flags]
        assert rec["signals"]["kinds"]["cos"] == "sketch" and rec["signals"]["kinds"]["rel_norm"] == "exact"
        np.testing.assert_allclose(rec["signals"]["energy"], sig.energy, rtol=0, atol=0, equal_nan=True)
        np.testing.assert_allclose(rec["weights"], naig_weights(sig.energy, "auto"), rtol=0, atol=1e-15)
        scores = np.array([rec["scores"][s] for s in rec["scores"]])
        # a test fires when its score exceeds 1: a step with a score > 1 has flags, one without none
        assert (np.nanmax(scores) > 1) == d.flagged
    nan_step = decode(_strict(lines[NAN_STEP]))
    assert nan_step["summary"]["max_score"] == math.inf and nan_step["summary"]["max_rank"] == 1
    assert nan_step["summary"]["max_signal"] == "nonfinite" and 1 in nan_step["flagged"]
    assert math.isnan(nan_step["signals"]["energy"][1])  # written as "NaN", read back as NaN


def test_the_bad_rank_has_the_max_score_at_its_step(tmp_path) -> None:
    decisions = _run(JsonlRecords(tmp_path / "m.jsonl"))
    assert decisions[SCALE_STEP - 1].ranks == (BAD_RANK,)
    rec = decode(_strict((tmp_path / "m.jsonl").read_text().splitlines()[SCALE_STEP]))
    assert rec["summary"]["max_rank"] == BAD_RANK and rec["summary"]["max_score"] > 1


def test_csv_has_a_row_per_rank_per_step_and_reads_back_like_the_jsonl(tmp_path) -> None:
    _run(Records(JsonlRecords(tmp_path / "m.jsonl"), CsvRecords(tmp_path / "m.csv")))
    with (tmp_path / "m.csv").open(newline="") as fh:
        rows = list(csv.reader(fh))
    assert tuple(rows[0]) == CSV_COLUMNS and len(rows) == 1 + STEPS * WORLD
    a, b = read_log(tmp_path / "m.jsonl"), read_log(tmp_path / "m.csv")
    assert (a.format, b.format) == ("jsonl", "csv") and a.world == b.world == WORLD
    np.testing.assert_array_equal(a.steps, b.steps)
    np.testing.assert_array_equal(a.flagged, b.flagged)
    assert a.flags == b.flags
    for s in a.scores:
        np.testing.assert_array_equal(a.scores[s], b.scores[s])  # repr round-trips float64
    rows_a = a.rank_rows()
    assert rows_a == b.rank_rows()
    assert rows_a[BAD_RANK]["last_flagged"] == SCALE_STEP and rows_a[1]["flags"]["nonfinite"] == 1


def test_a_log_saved_with_a_byte_order_mark_reads_as_without_it(tmp_path) -> None:
    """An editor may save a log as "UTF-8 with BOM": both formats read as the file without the mark,
    and a run appends to it."""
    _run(Records(JsonlRecords(tmp_path / "m.jsonl"), CsvRecords(tmp_path / "m.csv")))
    for name in ("m.jsonl", "m.csv"):
        plain = tmp_path / name
        marked = tmp_path / f"bom-{name}"
        marked.write_bytes(b"\xef\xbb\xbf" + plain.read_bytes())
        a, b = read_log(plain), read_log(marked)
        assert (a.format, a.world) == (b.format, b.world)
        np.testing.assert_array_equal(a.steps, b.steps)
        assert a.flags == b.flags and a.rank_rows() == b.rank_rows()
        writer = JsonlRecords if name.endswith(".jsonl") else CsvRecords
        _run(writer(marked, append=True), seed=1)  # appending continues its steps, as without the mark
        np.testing.assert_array_equal(read_log(marked).steps, np.arange(1, 2 * STEPS + 1))
    joined = tmp_path / "joined.jsonl"  # two marked logs concatenated: a mark within, which read_log reads
    joined.write_bytes((b"\xef\xbb\xbf" + (tmp_path / "m.jsonl").read_bytes()) * 2)
    steps = len(read_log(joined).steps)
    _run(JsonlRecords(joined, append=True), seed=2)
    assert len(read_log(joined).steps) == steps + STEPS
    for name, writer in (("only.jsonl", JsonlRecords), ("only.csv", CsvRecords)):  # a mark alone: empty
        only = tmp_path / name
        only.write_bytes(b"\xef\xbb\xbf")
        _run(writer(only))  # as onto an empty file: nothing to refuse or continue
        np.testing.assert_array_equal(read_log(only).steps, np.arange(1, STEPS + 1))
    wide = tmp_path / "wide.jsonl"  # UTF-16: refused, naming its first line
    wide.write_text((tmp_path / "m.jsonl").read_text(), encoding="utf-16")
    with pytest.raises(UsageError, match=r"line 1: not UTF-8 text"):
        JsonlRecords(wide, append=True)


def test_existing_file_refused_unless_append_which_continues_the_steps(tmp_path) -> None:
    path = tmp_path / "m.jsonl"
    _run(JsonlRecords(path))
    with pytest.raises(UsageError, match="exists; pass append=True"):
        JsonlRecords(path)
    with pytest.raises(UsageError, match="exists"):
        CsvRecords(path)
    _run(JsonlRecords(path, append=True), seed=1)
    log = read_log(path)
    np.testing.assert_array_equal(log.steps, np.arange(1, 2 * STEPS + 1))
    headers = [_strict(x) for x in path.read_text().splitlines() if '"header"' in x]
    assert [h["step_offset"] for h in headers] == [0, STEPS]


def _wrapped(wrap: bool, writer: RecordWriter) -> RecordWriter:
    """The writer alone, or behind ``Records`` (which once numbered a resumed run's steps as fresh)."""
    return Records(writer) if wrap else writer


@pytest.mark.parametrize("wrap", [False, True], ids=["alone", "in-Records"])
@pytest.mark.parametrize("writer, name", [(JsonlRecords, "m.jsonl"), (CsvRecords, "m.csv")])
def test_a_resumed_monitor_appends_the_steps_of_the_uninterrupted_run(tmp_path, writer, name: str,
                                                                      wrap: bool) -> None:
    """A run checkpointed at step 8 and resumed (load_state_dict) goes on at 9 in the file it appends
    to, flags' since included; the file then reads as the uninterrupted run's (an earlier version
    added the file's last step to the resumed monitor's, numbering them 17..20)."""
    whole, cut = tmp_path / f"whole-{name}", tmp_path / name
    _run(writer(whole))
    first = Monitor(window=WINDOW)
    _wrapped(wrap, writer(cut)).attach(first)
    first.detector = Detector(WORLD, window=WINDOW)
    stream = list(_stream(0))
    for sig in stream[:8]:
        d = first.detector.update(sig)
        for w in first.writers:
            w(sig, d)
    first.writers[0].close()
    resumed = Monitor(window=WINDOW)
    resumed.load_state_dict(first.state_dict())
    _wrapped(wrap, writer(cut, append=True)).attach(resumed)
    for sig in stream[8:]:
        d = resumed.detector.update(sig)
        for w in resumed.writers:
            w(sig, d)
    resumed.writers[0].close()
    a, b = read_log(whole), read_log(cut)
    np.testing.assert_array_equal(b.steps, np.arange(1, STEPS + 1))
    np.testing.assert_array_equal(a.flagged, b.flagged)
    assert a.flags == b.flags and any(b.flags[8:])  # flags in the resumed part
    if name.endswith(".jsonl"):  # the flags' since too
        def since(path):
            return [[f["since"] for f in rec["flags"]] for rec in map(_strict, path.read_text().splitlines())
                    if rec["type"] == "step"]
        assert since(cut) == since(whole) and max(max(x, default=0) for x in since(cut)) > 8


@pytest.mark.parametrize("wrap", [False, True], ids=["alone", "in-Records"])
@pytest.mark.parametrize("writer, name", [(JsonlRecords, "m.jsonl"), (CsvRecords, "m.csv")])
def test_a_run_resumed_from_a_checkpoint_before_the_files_last_step_writes_its_own_steps(
        tmp_path, writer, name: str, wrap: bool) -> None:
    """The run went on to step 12 after its checkpoint at step 8, then crashed; resumed from step 8 it
    wrote its steps 9..12 as 13..16 (a flag at training step 10 logged as step 14, while the warning
    said step 10). Now: JSONL gets them as 9..12 after a new header, said in one warning; a CSV, whose
    steps never go back, is refused (the writer warns and writes nothing; training goes on)."""
    path = tmp_path / name
    first = Monitor(window=WINDOW)
    writer(path).attach(first)
    first.detector = Detector(WORLD, window=WINDOW)
    stream = list(_stream(0))
    state = None
    for step, sig in enumerate(stream, start=1):
        d = first.detector.update(sig)
        for w in first.writers:
            w(sig, d)
        if step == 8:
            state = first.state_dict()
    first.writers[0].close()
    before = path.read_bytes()
    resumed = Monitor(window=WINDOW)
    resumed.load_state_dict(state)
    again = _wrapped(wrap, writer(path, append=True))
    again.attach(resumed)
    kind = UserWarning if name.endswith(".jsonl") else RuntimeWarning
    with pytest.warns(kind, match=r"holds steps up to 12|two runs' steps 9..12") as seen:
        for sig in stream[8:]:
            d = resumed.detector.update(sig)
            for w in resumed.writers:
                w(sig, d)
    again.close()
    log = read_log(path)
    if name.endswith(".jsonl"):
        np.testing.assert_array_equal(log.steps, [*range(1, 13), *range(9, 13)])
        assert log.flags[11] == log.flags[15]  # step 12's flags, in both runs
    else:
        assert path.read_bytes() == before and again.lost == 4
        said = [str(w.message) for w in seen if "CSV cannot hold two runs' steps 9..12" in str(w.message)]
        assert said and all("pass overwrite=True, another path, or a JSONL" in m for m in said)  # not cut


@pytest.mark.parametrize("writer, name", [(JsonlRecords, "m.jsonl"), (CsvRecords, "m.csv")])
def test_overwrite_replaces_the_file_a_crashed_run_left(tmp_path, writer, name: str) -> None:
    path = tmp_path / name
    path.write_text('{"type": "step", "step": 3, "trunc')  # a crashed run's last, cut line
    with pytest.raises(UsageError, match="overwrite=True to replace it"):
        writer(path)
    _run(writer(path, overwrite=True))
    log = read_log(path)
    np.testing.assert_array_equal(log.steps, np.arange(1, STEPS + 1))  # only the new run's steps
    with pytest.raises(UsageError, match="both given") as err:
        writer(path, append=True, overwrite=True)
    assert err.value.field == "overwrite"
    with pytest.raises(UsageError) as err:
        writer(path, overwrite="yes")
    assert err.value.field == "overwrite"


def test_append_to_a_file_that_is_not_a_monitor_log_is_refused(tmp_path) -> None:
    (tmp_path / "x.jsonl").write_text('{"type": "other"}\n')
    with pytest.raises(UsageError, match="no naig monitor header"):
        _run(JsonlRecords(tmp_path / "x.jsonl", append=True))
    (tmp_path / "x.csv").write_text("a,b\n1,2\n")
    with pytest.raises(UsageError, match="not a naig monitor CSV"):
        _run(CsvRecords(tmp_path / "x.csv", append=True))


def test_paths_checked_before_training(tmp_path) -> None:
    with pytest.raises(UsageError, match="does not exist"):
        JsonlRecords(tmp_path / "nope" / "m.jsonl")
    with pytest.raises(UsageError, match="is a directory"):
        CsvRecords(tmp_path)
    with pytest.raises(UsageError, match="function"):
        LoggerRecords("wandb")
    with pytest.raises(UsageError, match="record writers"):
        Records(print)


def test_tensorboard_paths_checked_before_training(tmp_path) -> None:
    pytest.importorskip("tensorboard", reason="the tensorboard extra is not installed (pip install -e "
                        "'.[tensorboard]')")
    (tmp_path / "f").write_text("x")
    with pytest.raises(UsageError, match="is a file"):
        TensorBoardRecords(tmp_path / "f")
    with pytest.raises(UsageError, match="does not exist"):
        TensorBoardRecords(tmp_path / "nope" / "tb")


def test_a_writer_not_attached_says_how(tmp_path) -> None:
    sig = next(_stream())
    d = Detector(WORLD).update(sig)
    with pytest.raises(UsageError, match=r"records\.attach\(monitor\)"):
        JsonlRecords(tmp_path / "m.jsonl")(sig, d)


def test_attach_adds_a_writer_after_the_callback_and_leaves_the_callback_alone(tmp_path) -> None:
    """``observe`` calls the callback, then each writer in the order added; attach rebinds nothing."""
    import torch

    order = []

    def callback(s, d):
        order.append(("callback", d.step))

    mon = Monitor(window=4, callback=callback)
    jsonl, logged = JsonlRecords(tmp_path / "m.jsonl"), LoggerRecords(lambda row: order.append(("logger",)))
    jsonl.attach(mon)
    logged.attach(mon)
    assert mon.callback is callback and mon.writers == [jsonl, logged]
    for step in range(3):
        g = torch.Generator().manual_seed(step)
        mon.observe({"w": torch.randn(10, generator=g), "b": torch.randn(3, generator=g)})
    jsonl.close()
    assert order == [x for step in (1, 2, 3) for x in (("callback", step), ("logger",))]
    assert len(read_log(tmp_path / "m.jsonl").steps) == 3
    with pytest.raises(UsageError, match="already"):
        mon.add_writer(logged)
    with pytest.raises(UsageError, match="writer"):
        mon.add_writer("not a writer")


def test_logger_gets_flat_scalars_summary_by_default_per_rank_on_request() -> None:
    got, per = [], []
    _run(Records(LoggerRecords(got.append), LoggerRecords(per.append, per_rank=True)))
    assert len(got) == STEPS and all(isinstance(v, float) for d in got for v in d.values())
    assert set(got[0]) == {f"{PREFIX}{k}" for k in ("step", "max_score", "max_rank", "k_eff", "flagged_ranks",
                                                    "b_simple")}
    assert f"{PREFIX}rank3/score_energy" in per[0] and f"{PREFIX}rank0/weight" in per[0]
    assert got[SCALE_STEP - 1][f"{PREFIX}max_rank"] == BAD_RANK
    assert sum(per[0][f"{PREFIX}rank{k}/weight"] for k in range(WORLD)) == pytest.approx(1.0, abs=1e-12)


def test_tensorboard_writes_event_files_that_read_back(tmp_path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    got = []
    _run(Records(TensorBoardRecords(tmp_path / "tb", per_rank=True), LoggerRecords(got.append)))
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    tags = acc.Tags()["scalars"]
    assert f"{PREFIX}k_eff" in tags and f"{PREFIX}rank{BAD_RANK}/score_norm" in tags
    events = acc.Scalars(f"{PREFIX}k_eff")
    assert [e.step for e in events] == list(range(1, STEPS + 1))
    np.testing.assert_allclose([e.value for e in events], [d[f"{PREFIX}k_eff"] for d in got], rtol=1e-6)
    ranks = acc.Scalars(f"{PREFIX}max_rank")
    assert ranks[SCALE_STEP - 1].value == BAD_RANK


def test_tensorboard_missing_is_one_line_naming_the_extra(monkeypatch, tmp_path) -> None:
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails as if not installed
    with pytest.raises(UsageError, match=r"pip install naig\[tensorboard\]") as err:
        TensorBoardRecords(tmp_path / "tb")
    assert "\n" not in str(err.value)


def _lines(path) -> list[str]:
    return path.read_text().splitlines(keepends=True)


def test_read_log_names_file_and_line_of_a_truncated_or_corrupt_log(tmp_path) -> None:
    path = tmp_path / "m.jsonl"
    _run(JsonlRecords(path))
    lines = _lines(path)
    cut = tmp_path / "cut.jsonl"
    cut.write_text("".join(lines[:5]) + lines[5][:40])  # a header, 4 steps, the 5th cut (a full disk)
    log = read_log(cut)
    np.testing.assert_array_equal(log.steps, [1, 2, 3, 4])
    assert log.cut.startswith("line 6 was cut (40 bytes without an end") and "4 complete steps" in log.cut
    assert read_log(path).cut == ""
    inner = tmp_path / "inner.jsonl"  # a cut line with lines after it is corruption, not a cut end
    inner.write_text("".join(lines[:5]) + lines[5][:40] + "\n" + "".join(lines[6:]))
    with pytest.raises(DataError, match=r"inner\.jsonl, line 6: not JSON"):
        read_log(inner)
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(lines[:3]) + '{"type": "step", "step": 3}\n' + "".join(lines[4:]))
    with pytest.raises(DataError, match=r"bad\.jsonl, line 4: a step record without"):
        read_log(bad)
    old = tmp_path / "old.jsonl"
    old.write_text(lines[0].replace(f'"schema": {SCHEMA_VERSION}', '"schema": 99') + "".join(lines[1:]))
    with pytest.raises(DataError, match="line 1: schema 99"):
        read_log(old)
    headless = tmp_path / "headless.jsonl"
    headless.write_text("".join(lines[1:]))
    with pytest.raises(DataError, match="line 1: expected a naig monitor header"):
        read_log(headless)


def test_read_log_csv_errors_and_missing_files(tmp_path) -> None:
    path = tmp_path / "m.csv"
    _run(CsvRecords(path))
    lines = _lines(path)
    cut = tmp_path / "cut.csv"
    cut.write_text("".join(lines[:7]) + lines[7][:30])  # 4 ranks: step 1 whole, step 2's rank 2 cut
    log = read_log(cut)
    np.testing.assert_array_equal(log.steps, [1])
    assert log.cut.startswith("line 8 was cut") and "step 2 is incomplete" in log.cut
    within = tmp_path / "within.csv"  # cut inside the last field: every field there, one shortened
    within.write_text("".join(lines[:-1]) + lines[-1].rstrip("\r\n")[:-1])
    log = read_log(within)
    assert log.cut.startswith(f"line {len(lines)} was cut") and "no line break" in log.cut
    assert len(log.steps) == len(read_log(path).steps) - 1  # the cut step is not read as whole
    inner = tmp_path / "inner.csv"
    inner.write_text("".join(lines[:7]) + lines[7][:30] + "\n" + "".join(lines[8:]))
    with pytest.raises(DataError, match=r"inner\.csv, line 8: .* fields, expected"):
        read_log(inner)
    with pytest.raises(DataError, match="no such file"):
        read_log(tmp_path / "none.jsonl")
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(DataError, match="the file is empty"):
        read_log(tmp_path / "empty.jsonl")
    (tmp_path / "other.csv").write_text("x,y\n")
    with pytest.raises(DataError, match="line 1: not a naig monitor CSV"):
        read_log(tmp_path / "other.csv")


def test_a_rank_known_not_to_be_zero_checks_no_path(monkeypatch, tmp_path) -> None:
    """Under a launcher (RANK set) only rank 0 checks paths: another node may lack the directory."""
    (tmp_path / "m.jsonl").write_text("{}\n")
    monkeypatch.setenv("RANK", "1")
    JsonlRecords(tmp_path / "m.jsonl")
    CsvRecords(tmp_path / "nope" / "m.csv")
    TensorBoardRecords(tmp_path / "nope" / "tb")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(UsageError, match="exists"):
        JsonlRecords(tmp_path / "m.jsonl")


def test_a_writer_attaches_once(tmp_path) -> None:
    w = JsonlRecords(tmp_path / "m.jsonl")
    w.attach(Monitor())
    with pytest.raises(UsageError, match="already attached"):
        w.attach(Monitor())
    with pytest.raises(UsageError, match="already attached"):
        Records(w).attach(Monitor())


def _step_line(lines: list[str], **change) -> str:
    obj = json.loads(lines[1])
    obj.update(change)
    return json.dumps(obj) + "\n"


@pytest.mark.parametrize("change, field", [
    ({"where": "x"}, "where"), ({"where": [1]}, "where"), ({"where": None}, "where"),
    ({"where": {"9": "a"}}, "where"),
    ({"step": "x"}, "step"), ({"step": 0}, "step"), ({"step": 1.5}, "step"), ({"flagged": [7]}, "flagged"),
    ({"flagged": "0"}, "flagged"), ({"flags": [{"rank": 5, "signal": "norm", "score": "relative"}]}, "flags"),
    ({"flags": [{}]}, "flags"), ({"scores": {"norm": [1.0]}}, "scores"), ({"summary": {}}, "summary"),
])
def test_a_malformed_step_field_is_one_line_naming_file_line_and_field(tmp_path, change: dict,
                                                                     field: str) -> None:
    path = tmp_path / "m.jsonl"
    _run(JsonlRecords(path))
    lines = _lines(path)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(lines[0] + _step_line(lines, **change) + "".join(lines[2:]))
    with pytest.raises(DataError) as err:
        read_log(bad)
    msg = str(err.value)
    assert f"bad.jsonl, line 2: a step record whose '{field}' is not valid" in msg and "\n" not in msg, msg
    assert "invalid literal" not in msg and "without a valid" not in msg


def test_steps_must_increase_within_a_run(tmp_path) -> None:
    path = tmp_path / "m.jsonl"
    _run(JsonlRecords(path))
    lines = _lines(path)
    dup = tmp_path / "dup.jsonl"
    dup.write_text("".join(lines[:3]) + lines[2] + "".join(lines[3:]))
    with pytest.raises(DataError, match=r"dup\.jsonl, line 4: step 2 after step 2: steps must increase"):
        read_log(dup)
    two = tmp_path / "two.jsonl"
    two.write_text("".join(lines) + "".join(lines[1:]))  # a second run without its header
    with pytest.raises(DataError, match=rf"two\.jsonl, line {len(lines) + 1}: step 1 after step"):
        read_log(two)
    ok = tmp_path / "ok.jsonl"
    ok.write_text("".join(lines) + "\n" + "".join(lines))  # two runs, each with its header; a blank line
    assert len(read_log(ok).steps) == 2 * (len(lines) - 1)


def test_a_header_without_steps_is_the_same_error_for_jsonl_and_csv(tmp_path) -> None:
    for name, writer in (("m.jsonl", JsonlRecords), ("m.csv", CsvRecords)):
        _run(writer(tmp_path / name))
        head = tmp_path / f"head-{name}"
        head.write_text(_lines(tmp_path / name)[0])
        with pytest.raises(DataError, match=r"head-m\.(jsonl|csv): a monitor header but no step recorded"):
            read_log(head)


def test_csv_field_errors_name_the_column(tmp_path) -> None:
    path = tmp_path / "m.csv"
    _run(CsvRecords(path))
    lines = _lines(path)
    cols = lines[0].rstrip("\n").split(",")
    for name, value in (("step", "x"), ("step", "0"), ("rank", "-1"), ("k_eff", "y")):
        row = lines[1].rstrip("\n").split(",")
        row[cols.index(name)] = value
        bad = tmp_path / "bad.csv"
        bad.write_text(lines[0] + ",".join(row) + "\n" + "".join(lines[2:]))
        with pytest.raises(DataError, match=rf"bad\.csv, line 2: a row whose '{name}' is not valid"):
            read_log(bad)
    short = tmp_path / "short.csv"
    short.write_text(",".join(c for c in cols if c != "k_eff") + "\n")
    with pytest.raises(DataError, match="line 1: a monitor CSV header without the column 'k_eff'"):
        read_log(short)
    back = tmp_path / "back.csv"
    back.write_text("".join(lines) + "".join(lines[1:]))
    with pytest.raises(DataError, match="step 1 after step"):
        read_log(back)


def test_reading_a_log_loads_no_torch() -> None:
    """``naig monitor report`` reads a log in 0.3 s: naig.monitor's names load on first use, and the
    records module needs no torch (it was 1.2 s, most of it importing torch)."""
    code = ("import sys, naig.monitor, naig.monitor.records as r; assert callable(r.read_log); "
            "print(sorted(m for m in ('torch', 'scipy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"
    code = "import sys, naig.monitor as m; m.MonitorHook; print('torch' in sys.modules, m.Monitor.__module__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["True", "naig.monitor.observe"]


def test_a_csv_written_before_a_signal_existed_reads_and_appends_with_its_own_header(tmp_path) -> None:
    """A log whose header lacks persistence's columns (as naig wrote before that signal) reads back, and
    ``append=True`` continues it with the file's header, the steps numbered after its last, and says
    (one warning) that the missing signal's scores are not recorded."""
    import csv

    from naig.monitor.records import csv_columns

    full = tmp_path / "full.csv"
    _run(CsvRecords(full))
    older = tuple(s for s in SIGNALS if s != "persistence")
    head = csv_columns(older)
    rows = list(csv.reader(full.open(newline="")))
    keep = [rows[0].index(c) for c in head]
    old = tmp_path / "old.csv"
    with old.open("w", newline="") as fh:
        csv.writer(fh).writerows([[r[j] for j in keep] for r in rows])
    log = read_log(old)
    assert "persistence" not in log.scores and set(older) <= set(log.scores)
    np.testing.assert_array_equal(log.scores["norm"], read_log(full).scores["norm"])
    with pytest.warns(UserWarning, match=r"old\.csv was written before the signal\(s\) persistence existed"):
        _run(CsvRecords(old, append=True), seed=1)
    again = list(csv.reader(old.open(newline="")))
    assert tuple(again[0]) == head and all(len(r) == len(head) for r in again if r)
    np.testing.assert_array_equal(read_log(old).steps, np.arange(1, 2 * STEPS + 1))
    with warnings.catch_warnings(record=True) as caught:  # a current file: no such warning
        warnings.simplefilter("always")
        _run(CsvRecords(full, append=True), seed=1)
    assert not [w for w in caught if "was written before" in str(w.message)]


@pytest.mark.parametrize("rank", ["99", "0", "-1", str(10 ** 30)])
def test_append_to_a_csv_whose_step_rows_are_not_its_ranks_in_order_is_refused(tmp_path, rank: str) -> None:
    """read_log refuses a step whose rows are not ranks 0..K-1: append refuses it, naming the line."""
    import csv

    path = tmp_path / "m.csv"
    _run(CsvRecords(path))
    rows = list(csv.reader(path.open(newline="")))
    rows[-1][1] = rank
    with path.open("w", newline="") as fh:
        csv.writer(fh).writerows(rows)
    data = path.read_bytes()
    with pytest.raises(UsageError, match=rf"line {len(rows)}: step {STEPS}, rank {rank}"):
        CsvRecords(path, append=True)
    assert path.read_bytes() == data


@pytest.mark.parametrize("cut", ["mid-line", "line break"])
def test_append_to_a_jsonl_cut_by_a_crash_is_refused_naming_the_line(tmp_path, cut: str) -> None:
    """A JSONL log whose last line has no line break (a crash mid-line, or a complete line cut just
    before its line break): appending would glue the new header to it, so it is refused."""
    path = tmp_path / "m.jsonl"
    _run(JsonlRecords(path))
    data = path.read_bytes()
    data = data[:-40] if cut == "mid-line" else data.rstrip(b"\n")
    path.write_bytes(data)
    lines = data.count(b"\n") + 1
    with pytest.raises(UsageError, match=rf"line {lines}: no line break at its end"):
        JsonlRecords(path, append=True)
    assert path.read_bytes() == data


@pytest.mark.parametrize("damage", ["repeated line", "step text", "step fraction", "step infinity", "flags"])
def test_append_to_a_jsonl_that_read_log_refuses_is_refused_and_a_blank_line_is_not(tmp_path, damage: str
                                                                                     ) -> None:
    """Append checked less than read_log: a repeated last line, a step of "3" or 3.5 or a malformed
    flags field were appended to (the file stayed unreadable) and a step of Infinity was an
    OverflowError; a trailing blank line, which read_log skips, was refused."""
    path = tmp_path / "m.jsonl"
    _run(JsonlRecords(path))
    lines = path.read_text().splitlines(keepends=True)
    last = json.loads(lines[-1])
    if damage == "repeated line":
        lines.append(lines[-1])
    else:
        last.update({"step text": {"step": str(last["step"])}, "step fraction": {"step": 12.5},
                     "step infinity": {"step": math.inf}, "flags": {"flags": "none"}}[damage])
        lines[-1] = json.dumps(last) + "\n"
    path.write_text("".join(lines))
    before = path.read_bytes()
    with pytest.raises(UsageError, match="append|read_log") as err:
        JsonlRecords(path, append=True)
    assert "\n" not in str(err.value) and path.read_bytes() == before
    _run(JsonlRecords(tmp_path / "ok.jsonl"))
    with (tmp_path / "ok.jsonl").open("a") as fh:
        fh.write("\n")
    _run(JsonlRecords(tmp_path / "ok.jsonl", append=True))
    assert len(read_log(tmp_path / "ok.jsonl").steps) == 2 * STEPS


@pytest.mark.parametrize("cut", ["mid-row", "line break"])
def test_append_to_a_csv_cut_by_a_crash_is_refused_and_leaves_it_as_it_was(tmp_path, cut: str) -> None:
    """A run killed mid-row leaves a last line without its line break; appending would glue the next
    row to it and make the whole file unreadable, so it is refused (one line, the line named)."""
    path = tmp_path / "m.csv"
    _run(CsvRecords(path))
    data = path.read_bytes()
    data = data[:-40] if cut == "mid-row" else data.rstrip(b"\r\n")
    path.write_bytes(data)
    refused = r"line \d+: (\d+ fields, expected \d+|no line break at its end)"
    with pytest.raises(UsageError, match=refused) as err:
        CsvRecords(path, append=True)
    assert err.value.field == "path" and "\n" not in str(err.value)
    assert path.read_bytes() == data


def test_append_of_a_run_with_another_rank_count_to_a_csv_writes_nothing(tmp_path) -> None:
    """read_log refuses a CSV whose steps have different rank counts, so the writer does not write one:
    its warning names the file and both counts, and the file stays as it was (and readable)."""
    import csv

    full = tmp_path / "full.csv"
    _run(CsvRecords(full))
    rows = list(csv.reader(full.open(newline="")))
    three = tmp_path / "three.csv"
    with three.open("w", newline="") as fh:
        csv.writer(fh).writerows([rows[0], *(r for r in rows[1:] if r and r[1] != str(WORLD - 1))])
    before = three.read_bytes()
    assert read_log(three).world == WORLD - 1
    counts = r"three\.csv.*rows for 3 ranks \(a run of 3 ranks, or a step cut short by a crash\)"
    counts += ", this run has 4"
    with pytest.warns(RuntimeWarning, match=counts):
        _run(CsvRecords(three, append=True))
    assert three.read_bytes() == before


def test_integers_beyond_float64_in_a_log_are_one_line_data_errors(tmp_path) -> None:
    """A JSON integer of 400 digits where a number goes (a score, k_eff, the header's world) raised
    OverflowError (int too large to convert to float) with a traceback from read_log and the report."""
    path = tmp_path / "m.jsonl"
    _run(JsonlRecords(path))
    lines = path.read_text().splitlines()
    header, step = json.loads(lines[0]), json.loads(lines[1])
    big = 10 ** 400
    cases = {"world": ({**header, "world": big}, step),
             "scores": (header, {**step, "scores": {"norm": [big]}})}
    for name, (h, s) in cases.items():
        path.write_text("\n".join([json.dumps(h), json.dumps(s), *lines[2:]]) + "\n")
        with pytest.raises(DataError) as err:
            read_log(path)
        assert "line" in str(err.value) and "\n" not in str(err.value), name


def test_a_closed_writer_leaves_the_monitor_which_goes_on_deciding(tmp_path) -> None:
    """Closing a writer once made every later step raise 'is closed' (after the detector had moved),
    hiding a BadRankError, with no way to remove the writer. It now leaves; another may be attached."""
    import torch

    from naig.monitor.detectors import BadRankError

    mon = Monitor(action="raise")
    first = Records(JsonlRecords(tmp_path / "a.jsonl"))
    first.attach(mon)
    mon.observe({"w": torch.ones(3)})
    first.close()
    assert mon.writers == []
    mon.observe({"w": torch.ones(3)})  # no writer: nothing raised
    JsonlRecords(tmp_path / "b.jsonl").attach(mon)
    mon.observe({"w": torch.ones(3)})
    with pytest.raises(BadRankError):
        mon.observe({"w": torch.tensor([1.0, float("nan")])})
    mon.writers[0].close()
    assert read_log(tmp_path / "a.jsonl").steps.tolist() == [1]
    assert read_log(tmp_path / "b.jsonl").steps.tolist() == [3, 4]


def test_two_writers_of_one_file_are_refused_until_the_first_is_closed(tmp_path) -> None:
    """A CSV and a JSONL writer (or two of one kind) on one path would interleave their lines into a
    file neither can read: the second is refused when made, naming the first; once the first is closed
    (or collected) the path is free. Until 2026-12-06 both wrote it."""
    path = tmp_path / "k.log"
    first = CsvRecords(path)
    for make in (lambda: JsonlRecords(path), lambda: CsvRecords(tmp_path / "." / "k.log")):
        with pytest.raises(UsageError) as err:
            make()
        assert err.value.field == "path" and "CsvRecords" in str(err.value)
    first.close()
    JsonlRecords(path).close()
    assert not path.exists()  # refused writers wrote nothing


def test_attach_to_something_that_is_not_a_monitor_is_one_usage_error(tmp_path) -> None:
    """``attach(5)`` raised an AttributeError from inside the writer."""
    with pytest.raises(UsageError) as err:
        JsonlRecords(tmp_path / "m.jsonl").attach(5)
    assert err.value.field == "monitor"


@pytest.mark.parametrize("where", ["schema", "score"])
def test_a_boolean_where_a_number_belongs_is_refused_not_read_as_1(tmp_path, where: str) -> None:
    """JSON's true equals 1 in Python: a header with "schema": true, or a score of true, was read as 1."""
    path = tmp_path / "m.jsonl"
    _run(JsonlRecords(path))
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    if where == "schema":
        lines[0]["schema"] = True
    else:
        lines[2]["scores"]["norm"][0] = True
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(json.dumps(x) + "\n" for x in lines))
    with pytest.raises(DataError) as err:
        read_log(bad)
    assert "bad.jsonl" in str(err.value) and "\n" not in str(err.value)


def test_a_log_whose_tables_would_not_fit_is_refused_before_they_are_built(tmp_path, monkeypatch) -> None:
    """The report's tables hold a float64 per step, rank and signal; a log of many ranks with few
    signals per step is small on disk and was 50–70× its size in memory. With less memory available
    than the tables need, ``read_log`` refuses in one line naming the file (here: the 12 steps of 4
    ranks of ``_run``, and 100 bytes said to be available)."""
    import naig.arrivals.engine

    path = tmp_path / "m.jsonl"
    _run(JsonlRecords(path))
    assert read_log(path).world == WORLD
    monkeypatch.setattr(naig.arrivals.engine, "available_bytes", lambda: 100)
    with pytest.raises(DataError) as err:
        read_log(path)
    assert f"m.jsonl: its {STEPS} steps × {WORLD} ranks" in str(err.value) and "\n" not in str(err.value)
