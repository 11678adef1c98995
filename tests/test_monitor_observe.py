"""naig.monitor.observe: one process, and 3 real gloo processes (tests/monitor_ranks.py).

The 3-rank run trains a tiny MLP per corruption; rank 2 corrupts its gradient at step 40 (the
detectors' window is 32). Measured there: NaN and ×1000 are named alone at step 40 on every rank;
a sign flip is named alone (cos individual z ≈ 61 > 5.8) when each rank's batch is 1024 examples
(pairwise cosines ≈ 0.97) and not at all with 16 examples (pairwise cosines 0.2-0.4: one flipped
step is inside the sketch's noise); no rank is flagged at any earlier step.
"""

from __future__ import annotations

import copy
import json
import math
import os
import re
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch

from naig.distributed.launch import MAX_TIMEOUT
from naig.errors import UsageError
from naig.monitor import BadRankError, Monitor, rank_signals
from naig.sketch import sketch_state_dict
from tests.conftest import run_python, run_ranks


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> dict:
    return run_ranks("tests.monitor_ranks", tmp_path_factory.mktemp("monitor"), timeout=180)


def _flagged_steps(run: dict) -> dict[int, list[list[float]]]:
    return {i + 1: views for i, views in enumerate(run["flagged"]) if any(any(v) for v in views)}


@pytest.mark.parametrize("kind", ["nan", "scale", "flip_large_batch"])
def test_every_rank_names_the_bad_rank_at_its_step_and_none_before(ranks: dict, kind: str) -> None:
    run, bad, step, world = ranks["runs"][kind], ranks["bad_rank"], ranks["bad_step"], ranks["world"]
    expected = [1.0 if r == bad else 0.0 for r in range(world)]
    assert _flagged_steps(run) == {step: [expected] * world}, run["describe"]
    assert f"rank {bad} on {run['hosts'][bad]}" in run["describe"]


def test_a_sign_flip_among_noise_dominated_ranks_names_no_wrong_rank(ranks: dict) -> None:
    """Measured: not flagged (see the module docstring); whatever fires may name only the bad rank."""
    run, bad = ranks["runs"]["flip"], ranks["bad_rank"]
    for step, views in _flagged_steps(run).items():
        assert step == ranks["bad_step"] and all(v == views[0] for v in views)
        assert [r for r, f in enumerate(views[0]) if f] == [bad]


@pytest.mark.parametrize("kind", ["nan", "scale", "flip", "flip_large_batch"])
def test_gathered_signals_equal_a_single_process_float64_computation(ranks: dict, kind: str) -> None:
    run = ranks["runs"][kind]
    shapes = run["shapes"]
    for grads, payload, recorded in zip(run["grads"], run["payloads"], run["signals"], strict=True):
        g = np.array(grads, dtype=np.float64)  # (K, n): every rank's float32 gradient, exactly
        states = [_split(row, shapes) for row in g]
        sketches = np.stack([sketch_state_dict(s, 0, impl="numpy") for s in states])
        with np.errstate(invalid="ignore", over="ignore"):
            sq = (g * g).sum(1)
        bad = (~np.isfinite(g)).sum(1)
        p = np.array(payload)
        np.testing.assert_allclose(p[:, :14], sketches, rtol=1e-12, atol=1e-12 * np.nanmax(np.abs(sketches)))
        np.testing.assert_allclose(p[:, 14], sq, rtol=1e-12)
        np.testing.assert_array_equal(p[:, 15], bad)
        mine = rank_signals(sketches, sq, bad).to_dict()
        for key in ("sq_norm", "rel_norm", "energy", "cos", "sq_dist"):
            np.testing.assert_allclose(recorded[key], mine[key], rtol=1e-9, atol=1e-12, err_msg=key)
        ok = np.isfinite(g).all(1)
        norms = np.sqrt(sq[ok])
        np.testing.assert_allclose(np.array(recorded["rel_norm"])[ok], norms / np.median(norms), rtol=1e-12)


def _split(flat: np.ndarray, shapes: dict) -> dict[str, np.ndarray]:
    out, i = {}, 0
    for name, shape in shapes.items():
        n = math.prod(shape)
        out[name] = flat[i:i + n].reshape(shape)
        i += n
    return out


def test_one_process_without_a_group() -> None:
    mon = Monitor(window=3)
    for step in range(5):
        d = mon.observe({"w": torch.full((4, 3), 1.0 + 0.01 * step), "b": None, "c": torch.ones(2)})
        assert d.world == 1 and not d.flagged and d.step == step + 1
    assert mon.signals.cos[0] == pytest.approx(1.0) and mon.gathered.shape == (1, 16)
    d = mon.observe(torch.tensor([1.0, float("inf")]))
    assert d.ranks == (0,) and d.flags[0].signal == "nonfinite" and d.hosts


def test_raise_and_warn_actions() -> None:
    with pytest.raises(BadRankError, match="rank 0"):
        Monitor(action="raise").observe({"w": torch.tensor([float("nan"), 1.0])})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Monitor(action="warn").observe({"w": torch.tensor([float("nan"), 1.0])})
    lines = [str(w.message) for w in caught if "warm-up" not in str(w.message)]
    assert len(lines) == 1 and "non-finite" in lines[0]


def test_the_signals_handed_on_hold_what_the_detectors_measured_with_their_state(tmp_path) -> None:
    """``drift_cos`` (persistence) and ``drift_t2`` (drift) need the detector's previous sketches
    and EWMA: ``Monitor.signals``, the callback and the records get them as the detectors scored
    them (they were NaN there before 2026-12-05), the same values the decision used."""
    import json

    from naig.monitor.records import JsonlRecords, Records

    rng = np.random.default_rng(5)
    seen = []
    mon = Monitor(callback=lambda sig, decision: seen.append(sig))
    records = Records(JsonlRecords(tmp_path / "monitor.jsonl"))
    records.attach(mon)
    common = rng.standard_normal(14) * 3
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the warm-up notice
        for _ in range(80):
            rows = np.zeros((4, 16))
            rows[:, :14] = common + rng.standard_normal((4, 14))
            rows[:, 14] = 126 + rng.standard_normal(4)
            mon.decide(rows)
    for name in ("drift_cos", "drift_t2"):
        values = getattr(mon.signals, name)
        assert values.shape == (4,) and np.isfinite(values).all(), (name, values)
        np.testing.assert_array_equal(getattr(seen[-1], name), values)
    assert mon.detector is not None and mon.detector.scored is mon.signals
    records.close()
    last = json.loads((tmp_path / "monitor.jsonl").read_text().splitlines()[-1])
    assert last["signals"]["drift_t2"] == pytest.approx(mon.signals.drift_t2.tolist(), rel=1e-12)



@pytest.mark.parametrize("grads, kwargs, field", [
    ({}, {}, "grads"), ({"w": None}, {}, "grads"), ({"w": torch.ones(2, dtype=torch.int64)}, {}, "grads"),
    ([torch.ones(2)], {}, "grads"), ({"w": torch.ones(2)}, {"action": "stop"}, "action"),
    ({"w": torch.ones(2)}, {"timeout": 60}, "timeout"), ({"w": torch.ones(2)}, {"blocks": 0}, "blocks"),
    ({"w": torch.ones(2)}, {"timeout": 0.0009}, "timeout"),  # gloo reads < 1 ms as its group's own timeout
    ({"w": torch.ones(2)}, {"batch": -1}, "batch"), ({"w": torch.ones(2)}, {"window": 1}, "window"),
    ({"w": torch.ones(2)}, {"window": 10**12}, "window"),
    # not sequences, not callables, not groups: raw TypeError / AttributeError at the first use before
    ({"w": torch.ones(2)}, {"signals": None}, "signals"), ({"w": torch.ones(2)}, {"scores": 5}, "scores"),
    ({"w": torch.ones(2)}, {"callback": "print"}, "callback"),
    ({"w": torch.ones(2)}, {"process_group": 5}, "process_group"),
    ({"w": torch.ones(2)}, {"line": (1.9, 2.2, 4.0)}, "line"),  # was truncated to (1, 2, 4)
    ({1: torch.ones(2), "1": -torch.ones(2)}, {}, "grads"),  # one name as str: summed to a zero sketch
    ({"w": torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])}, {}, "grads"),  # torch's raw error
])
def test_bad_arguments_are_usage_errors(grads: object, kwargs: dict, field: str) -> None:
    with pytest.raises(UsageError) as err:
        Monitor(**kwargs).observe(grads)
    assert err.value.field == field


def test_a_rank_outside_the_group_is_told_so() -> None:
    """What dist.new_group returns on a rank outside the group (an int) is refused saying so (until
    2026-12-08: "must be a torch.distributed ProcessGroup ... got 'int'")."""
    with pytest.raises(UsageError) as err:
        Monitor(process_group=torch.distributed.GroupMember.NON_GROUP_MEMBER)
    assert err.value.field == "process_group" and "not a member of the group" in str(err.value)


def test_signals_and_scores_are_read_once_at_construction() -> None:
    """An iterator (or a list the caller changes afterwards) is read when the monitor is built: until
    2026-12-06 the first ``observe`` re-read the exhausted iterator and refused it there."""
    signals = ["norm", "distance"]
    mon = Monitor(signals=iter(signals), scores=(s for s in ["transient"]))
    signals.append("bogus")
    decision = mon.observe({"w": torch.ones(3)})
    assert set(decision.transient) == {"norm", "distance"} and set(decision.thresholds) == {"transient"}


def test_importing_the_monitor_loads_no_scipy_and_no_simulator() -> None:
    code = ("import sys, naig.monitor; "
            "print([m for m in sys.modules if m.split('.')[0] == 'scipy' or m.startswith('naig.simulate')])")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_a_state_loaded_on_one_rank_only_is_the_same_error_on_every_rank(ranks: dict) -> None:
    """Each rank's payload carries a fingerprint of its monitor's settings and step: a resume that
    loads the state on rank 0 alone is refused at the next step, on every rank, naming the ranks
    (until 2026-12-06 rank 0 decided from its state and the others from none: their decisions, and
    ``skip``'s updates, parted silently)."""
    errors = ranks["one_state"]["errors"]
    assert all(e is not None and e == errors[0] for e in errors), errors
    assert "ranks 0 have another monitor state than ranks 1, 2" in errors[0], errors[0]
    assert "load the same state on every rank" in errors[0]


def test_another_payload_width_on_one_rank_is_the_same_error_on_every_rank(ranks: dict) -> None:
    """Monitors of another ``blocks`` send payloads of another width: the first gather, of a fixed size,
    compares every rank's setup and stops every rank with one DataError naming the ranks and both
    setups (until 2026-12-08 the all-gather of mismatched sizes aborted the process in gloo)."""
    errors = ranks["blocks"]["errors"]
    assert all(e is not None and e == errors[0] for e in errors), errors
    wide, narrow = re.fullmatch(r"ranks 1 send the monitor payloads set up as '\((\d+),\) float64', ranks "
                                r"0, 2 as '\((\d+),\) float64' \(blocks sets a payload's width; .*\); "
                                r"build every rank's monitor and hook alike", errors[0]).groups()
    assert int(wide) > int(narrow), errors[0]


def test_a_rank_that_never_observes_gives_an_error_not_a_hang(ranks: dict) -> None:
    missing = ranks["missing"]
    assert missing["error"] is not None and "within 1 s" in missing["error"]
    # it waited the 1 s timeout, then stopped: far below MAX_TIMEOUT, the longest any collective may wait
    assert 1.0 <= missing["seconds"] < MAX_TIMEOUT


_LEAVE = """
import json, os, sys, time
import torch
from naig.distributed.launch import process_group
from naig.errors import DataError
from naig.monitor import Monitor
with process_group(2, [sys.executable, __file__]) as (rank, world):
    if rank == 1:
        os._exit(0)  # leaves without a word: its connections close
    start = time.monotonic()
    try:
        Monitor(timeout=25.0).observe({"w": torch.ones(3)})
        error = None
    except DataError as exc:
        error = str(exc)
    print(json.dumps({"error": error, "seconds": time.monotonic() - start}), flush=True)
    os._exit(0)
"""


def test_a_rank_that_leaves_is_an_error_at_once_that_says_so(tmp_path) -> None:  # noqa: ANN001
    """A peer whose connection closed fails the gather long before the timeout: the line says it failed
    after how long, not that it "did not finish within 25 s" (until 2026-12-08)."""
    script = tmp_path / "leave.py"
    script.write_text(_LEAVE)
    env = {**os.environ, "TMPDIR": str(tmp_path), "OMP_NUM_THREADS": "1"}
    r = run_python(script, cwd=tmp_path, env=env, timeout=120)
    assert r.stdout.strip(), r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["seconds"] < 12, out
    assert re.match(r"the monitor's all-gather failed after \d+\.\d s of its 25 s \(a rank left\?\) \(",
                    out["error"]), out


def _payloads(steps: int, world: int, seed: int) -> list[np.ndarray]:
    """(K, 16) payloads of K ranks' noisy 500-float gradients; rank 1 ×1.06 from step 30 on (about 2
    pooled sd of the centred log-norm: a change the CUSUM finds in a few steps)."""
    from naig.monitor.signals import MonitorSketch, pack

    sk = MonitorSketch.build([("w", 500)], seed=0)
    rng = np.random.default_rng(seed)
    out = []
    for t in range(steps):
        g = rng.standard_normal((world, 500)) + 0.5
        if t >= 29:
            g[1] *= 1.06
        out.append(torch.stack([pack(torch.from_numpy(r), sk) for r in g]).numpy())
    return out


def test_a_resumed_monitor_decides_as_the_uninterrupted_one(tmp_path) -> None:
    """Monitor.state_dict through torch.save at step 33 (a change in flight), into a new Monitor."""
    rows = _payloads(45, 4, seed=5)
    weights = np.tile(_payloads(1, 4, seed=6)[0][:1], (4, 1))  # the replicas agree ...
    apart = weights.copy()
    apart[3, 0] += 1.0  # ... until rank 3's weights come apart, found at the check of step 25

    def decide(mon: Monitor, r: np.ndarray) -> str:
        due = mon.weights_due()
        step = 1 + (mon.detector.step if mon.detector is not None else 0)
        return repr(mon.decide(r, weights=(apart if step >= 20 else weights) if due else None))

    whole = Monitor()
    with pytest.warns(UserWarning, match="warm-up"):
        decisions = [decide(whole, r) for r in rows]
    assert any("Flag(rank=1, signal='norm', score='cusum'" in d for d in decisions[33:])
    assert all("Flag(rank=3, signal='weights', score='mismatch'" in d for d in decisions[24:])
    first = Monitor()
    assert first.state_dict() == {"version": 1, "detector": None, "replicas": {"named": []},
                                  "sketch": {"blocks": 1, "seed": 0, "line": [1, 2, 4], "batch": 1.0}}
    with pytest.warns(UserWarning, match="warm-up"):
        for r in rows[:33]:
            decide(first, r)
    torch.save(first.state_dict(), tmp_path / "monitor.pt")
    resumed = Monitor()
    resumed.load_state_dict(torch.load(tmp_path / "monitor.pt", weights_only=True))
    assert [decide(resumed, r) for r in rows[33:]] == decisions[33:]


def test_a_monitor_state_of_other_settings_is_refused() -> None:
    mon = Monitor(window=16)
    with pytest.warns(UserWarning, match="warm-up"):
        mon.decide(_payloads(1, 4, seed=1)[0])
    with pytest.raises(UsageError) as err:
        Monitor(window=32).load_state_dict(mon.state_dict())
    assert err.value.field == "window"  # named with this monitor's value and the one to pass
    assert str(err.value).startswith("window=32: ") and "pass window=16 to resume" in str(err.value)
    with pytest.raises(UsageError) as err:
        Monitor(window=16, seed=3).load_state_dict(mon.state_dict())
    assert str(err.value).startswith("seed=3: ") and "pass seed=0 to resume" in str(err.value)
    with pytest.raises(UsageError, match="version"):
        Monitor().load_state_dict({"detector": None})


@pytest.mark.parametrize("where", ["settings", "world-huge", "world-bool", "replica-rank", "replica-step",
                                   "replica-later", "replica-before-any-step"])
def test_a_malformed_monitor_state_is_one_line_before_anything_is_allocated(where: str) -> None:
    """A state whose settings are not a mapping, whose world is absurd (10**9 ranks would allocate ~90 GB)
    or whose replica check names a rank outside the run is refused at load, in one line."""
    mon = Monitor(window=16)
    with pytest.warns(UserWarning, match="warm-up"):
        for rows in _payloads(20, 4, seed=1):
            mon.decide(rows)
    state = copy.deepcopy(mon.state_dict())
    if where == "settings":
        state["detector"]["settings"] = "window=16"
    elif where.startswith("world"):
        state["detector"]["settings"]["world"] = 10 ** 9 if where == "world-huge" else True
    elif where == "replica-before-any-step":  # no step decided, so no rank can have been named
        state = {"version": 1, "detector": None, "replicas": {"named": [[1, 3, 1.0]]}}
    else:
        since = {"replica-rank": 5, "replica-step": 0, "replica-later": 21}[where]
        state["replicas"] = {"named": [[99 if where == "replica-rank" else 1, since, 1.0]]}
    fresh = Monitor(window=16)  # a resumed run loads into a monitor that has decided nothing yet
    empty = copy.deepcopy(fresh.state_dict())
    with pytest.raises(UsageError, match="malformed") as err:
        fresh.load_state_dict(state)
    assert "\n" not in str(err.value)
    assert fresh.state_dict() == empty  # a refused state changes nothing


def test_a_state_whose_sketch_settings_are_tuples_or_missing_loads_or_says_what_is_missing() -> None:
    """A serializer's tuple for ``line`` was refused with "pass line=(1, 2, 4)", the value in use; a
    missing ``batch`` with "pass batch=None", which the constructor refuses (a review, 2026-12-07)."""
    mon = Monitor(window=16)
    with pytest.warns(UserWarning, match="warm-up"):
        for rows in _payloads(5, 4, seed=1):
            mon.decide(rows)
    state = copy.deepcopy(mon.state_dict())
    state["sketch"]["line"] = tuple(state["sketch"]["line"])
    resumed = Monitor(window=16)
    resumed.load_state_dict(state)
    assert resumed.state_dict() == mon.state_dict()
    del state["sketch"]["batch"]
    with pytest.raises(UsageError, match="malformed monitor state \\(its sketch settings have no 'batch'\\)"):
        Monitor(window=16).load_state_dict(state)


def test_decide_refuses_a_where_that_is_not_a_function_before_anything_changes() -> None:
    """``where=5`` was a bare TypeError after the detector had counted the step; a ``where`` returning
    a list, one after the step was kept (a review, 2026-12-07): now the step is decided, kept and
    written without it, then the error says what ``where`` must return."""
    mon = Monitor(window=16)
    with pytest.warns(UserWarning, match="warm-up"):
        for rows in _payloads(20, 4, seed=1):
            mon.decide(rows)
    bad = _payloads(1, 4, seed=2)[0].copy()
    bad[3, -1] = 1  # rank 3: a non-finite gradient, so the step is flagged and `where` is asked
    before = copy.deepcopy(mon.state_dict())
    with pytest.raises(UsageError, match="^where: expected a function"):
        mon.decide(bad, where=5)
    assert mon.state_dict() == before
    with pytest.raises(UsageError, match="^where: must return a mapping rank → text, got \\[1, 2\\]"):
        mon.decide(bad, where=lambda d: [1, 2])
    assert mon.decision.step == mon.detector.step == 21 and mon.decision.where == {}
    assert mon.decide(bad, where=lambda d: {3: "bucket 0"}).where == {3: "bucket 0"}


@pytest.mark.parametrize("gathered", [[[None] * 16] * 3, [[1.0] * 15 + [None]] * 3, [["1.5"] * 16] * 3],
                         ids=["none", "one-none", "strings"])
def test_decide_refuses_rows_that_are_not_numbers(gathered: list) -> None:
    """None was read as NaN: every rank non-finite and blamed (a review, 2026-12-07); numeric strings were
    cast. (Other objects that cast to a float, a 0-d array or tensor, a Fraction, still load: below.)"""
    mon = Monitor()
    with pytest.raises(UsageError, match="^gathered: expected rows of numbers"):
        mon.decide(gathered)
    assert mon.detector is None


def test_a_monitor_that_has_decided_says_the_state_replaces_its_steps() -> None:
    """Loaded after steps were decided (a rollback, or a resumed run that loads late), the state replaces
    the history: rank 0 says so, with the next step's number (a new user's run loaded it three steps
    late and its step numbers went back without a word, 2026-12-06)."""
    saved = Monitor(window=16)
    with pytest.warns(UserWarning, match="warm-up"):
        for rows in _payloads(5, 4, seed=1):
            saved.decide(rows)
    state = copy.deepcopy(saved.state_dict())
    mon = Monitor(window=16)
    with pytest.warns(UserWarning, match="warm-up"):
        for rows in _payloads(3, 4, seed=2):
            mon.decide(rows)
    with pytest.warns(UserWarning, match=r"the 3 step\(s\) this monitor decided .* step 6\)") as got:
        mon.load_state_dict(state)
    assert len([w for w in got if "replaced" in str(w.message)]) == 1
    assert mon.state_dict() == state
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # loading again before a step, or into a new monitor: nothing to say
        mon.load_state_dict(state)
        Monitor(window=16).load_state_dict(state)
    mon.decide(_payloads(1, 4, seed=3)[0])
    own = copy.deepcopy(mon.state_dict())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a refused state replaces nothing and says nothing
        with pytest.raises(UsageError, match="seed"):
            mon.load_state_dict({**state, "sketch": {**state["sketch"], "seed": 9}})
    assert mon.state_dict() == own
    with pytest.warns(UserWarning, match=r"the 1 step\(s\)"):
        mon.load_state_dict(state)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_cuda_observe_gathers_the_cpu_payload_within_the_float64_bound() -> None:
    """The same gradients (fp32, bf16, fp16, non-contiguous, one empty) observed on the GPU (Triton) and on
    the CPU: every payload coordinate within 1e-12 relative of Σ|g| (both sum the same exact float64
    terms in other orders), the same counts, the same decisions (a NaN step named on both)."""
    gen = torch.Generator().manual_seed(0)
    base = {"w": torch.randn(300, 70, generator=gen), "b": torch.randn(513, generator=gen).to(torch.bfloat16),
            "h": torch.randn(4097, generator=gen).to(torch.float16),
            "t": torch.randn(64, 96, generator=gen).t(), "e": torch.zeros(0)}
    monitors = {"cpu": Monitor(window=3), "cuda": Monitor(window=3)}
    for step in range(6):
        grads = {k: (v * (1 + step) if k != "w" or step != 5 else v.clone().fill_(float("nan")))
                 for k, v in base.items()}
        rows = {}
        for dev, mon in monitors.items():
            decision = mon.observe({k: v.to(dev) for k, v in grads.items()})
            rows[dev] = (mon.gathered.copy(), decision.ranks if decision.flagged else ())
        (cpu, cpu_flag), (gpu, gpu_flag) = rows["cpu"], rows["cuda"]
        scale = sum(float(v.double().abs().nan_to_num().sum()) for v in grads.values())
        finite = np.isfinite(cpu)
        assert np.array_equal(finite, np.isfinite(gpu))
        assert np.abs(cpu[finite] - gpu[finite]).max() <= 1e-12 * scale
        assert cpu_flag == gpu_flag == ((0,) if step == 5 else ())


def test_decide_reads_lists_and_low_precision_tensors_and_refuses_what_is_not_numbers() -> None:
    """Nested lists and bfloat16 tensors were internal errors (AttributeError, TypeError): they decide
    as the float64 array does; None, strings and objects are one-line usage errors naming the field."""
    rows = _payloads(25, 4, seed=3)
    by_array, by_list, by_bf16 = Monitor(), Monitor(), Monitor()
    for r in rows:
        a, b = by_array.decide(r), by_list.decide(r.tolist())
        assert repr(a) == repr(b)
        by_bf16.decide(torch.from_numpy(r).to(torch.bfloat16))
    assert by_bf16.detector.step == 25
    complex_rows = rows[0].astype(np.complex128)  # the imaginary part was dropped with a warning only
    for bad in (None, "abc", np.array([["a"] * 16] * 4, dtype=object), np.zeros((4, 15)), complex_rows,
                torch.from_numpy(complex_rows), torch.empty(4, 16, device="meta")):  # meta: a raw error
        with pytest.raises(UsageError, match="gathered") as err:
            by_array.decide(bad)
        assert "\n" not in str(err.value)
    with pytest.raises(UsageError) as err:  # a raw ValueError before
        by_array.decide(rows[0], dots="x", sq_dists="y")
    assert err.value.field == "dots"
    assert by_array.detector.step == 25


@pytest.mark.parametrize("weights", [np.zeros((3, 16)), np.zeros((4, 15)), np.zeros((4, 30)), "abc", None],
                         ids=["ranks", "columns", "other-blocks", "text", "mixed-steps"])
def test_a_decide_refused_for_its_weights_changes_nothing(weights: object) -> None:
    """The weights were checked after the detectors had taken the step: a refused call moved the step,
    the pool and the CUSUM, and a retry counted the step twice."""
    from naig.errors import DataError
    from naig.monitor.replicas import NOT_DUE

    rows = _payloads(31, 4, seed=4)
    mon, twin = Monitor(), Monitor()
    for r in rows[:30]:
        mon.decide(r)
        twin.decide(r)
    if weights is None:  # some ranks at a check step and others not
        weights = np.zeros((4, 16))
        weights[:2, -1] = NOT_DUE
    with pytest.raises((UsageError, DataError)):
        mon.decide(rows[30], weights=weights)
    assert mon.detector.step == 30
    assert repr(mon.decide(rows[30])) == repr(twin.decide(rows[30]))


@pytest.mark.parametrize(("blocks", "width"), [(1, 30), (2, 16)])
def test_payloads_of_another_sketch_width_are_refused_and_change_nothing(blocks: int, width: int) -> None:
    """A payload packed with another number of sketch blocks than the monitor's was decided on as if
    it were its own (its history then mixes two sketches)."""
    rng = np.random.default_rng(0)
    rows = rng.normal(size=(4, width))
    rows[:, -2], rows[:, -1] = (rows[:, :-2] ** 2).sum(axis=1), 0.0
    mon = Monitor(blocks=blocks)
    expected = rf"expected shape \(K, {14 * blocks + 2}\) for blocks={blocks}"
    with pytest.raises(UsageError, match=expected) as err:
        mon.decide(rows)
    assert err.value.field == "gathered" and mon.detector is None


def test_weights_that_are_not_a_mapping_are_refused_at_every_step_even_with_one_rank() -> None:
    """With one rank the replica check has nothing to compare and ``weights`` was never read: a string
    passed unnoticed."""
    mon = Monitor()
    with pytest.raises(UsageError, match="pass {name: weight}") as err:
        mon.observe({"w": torch.ones(3)}, weights="model.pt")
    assert err.value.field == "weights" and mon.detector is None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the warm-up notice
        assert mon.observe({"w": torch.ones(3)}, weights={"w": torch.ones(3)}).step == 1


def test_a_garbled_count_makes_a_rank_unusable_and_a_nan_sketch_is_not_called_an_overflow() -> None:
    """A non-finite count of 0.5 was truncated to 0 (no flag); a NaN in the sketch with a count of 0
    was labelled "overflow", which the docs keep for a finite gradient whose ‖g‖² exceeds float64."""
    rows = _payloads(21, 4, seed=2)
    mon = Monitor()
    for r in rows[:20]:
        mon.decide(r)
    last = rows[20].copy()
    last[0, -1] = 0.5
    last[1, 3] = math.nan
    last[2, -2] = math.inf
    got = {(f.rank, f.score) for f in mon.decide(last).flags if f.signal == "nonfinite"}
    assert got == {(0, "nonfinite"), (1, "nonfinite"), (2, "overflow")}


@pytest.mark.parametrize("settings, field", [({"seed": 7}, "seed"), ({"blocks": 2}, "blocks"),
                                             ({"batch": 4.0}, "batch"), ({"line": (1, 3, 7)}, "line")])
def test_a_state_of_another_sketch_is_refused_and_one_saved_before_it_was_kept_loads(settings: dict,
                                                                                     field: str) -> None:
    """A state keeps the sketch's settings: the detectors' history (pool, previous sketches, drift
    covariance) was measured with them, and a monitor with another seed or width loaded it silently."""
    rows = _payloads(20, 4, seed=8)
    mon = Monitor()
    for r in rows:
        mon.decide(r)
    state = mon.state_dict()
    with pytest.raises(UsageError, match=f"saved with {field}=") as err:
        Monitor(**settings).load_state_dict(state)
    assert err.value.field == field
    older = {k: v for k, v in state.items() if k != "sketch"}  # saved before the sketch settings were kept
    resumed = Monitor()
    resumed.load_state_dict(older)
    assert resumed.detector.step == 20


@pytest.mark.parametrize("key, value", [("blocks", True), ("seed", False), ("line", [True, 2, 4])])
def test_a_sketch_setting_saved_as_a_bool_is_refused(key: str, value: object) -> None:
    """True == 1 and False == 0 in Python: a state whose blocks is true (a JSON edit) loaded as blocks 1."""
    mon = Monitor()
    for r in _payloads(3, 4, seed=8):
        mon.decide(r)
    state = json.loads(json.dumps(mon.state_dict()))
    state["sketch"][key] = value
    with pytest.raises(UsageError, match=f"saved with {key}=") as err:
        Monitor().load_state_dict(state)
    assert err.value.field == key


SAID = {"skip": "non-finite gradient (skip: this step's optimizer update is skipped on every rank; your "
                "loop applies it)",
        "exclude": "non-finite gradient (exclude: rank 2 left out of this step's mean; your loop applies it)",
        "warn": "non-finite gradient", "log": None}


@pytest.mark.parametrize("action", list(SAID))
def test_a_flagged_step_is_said_by_every_action_that_changes_training(action: str) -> None:
    """skip and exclude said nothing: a persistent fault under skip stopped training without a word.
    Without an integration (decide, observe) the user's loop applies them, and the line says so."""
    rows = _payloads(21, 4, seed=6)
    mon = Monitor(action=action)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for r in rows[:20]:
            mon.decide(r)
    bad = rows[20].copy()
    bad[2, 0] = math.nan
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert mon.decide(bad).ranks == (2,)
    lines = [str(w.message) for w in seen]
    if SAID[action] is None:
        assert lines == []
    else:
        assert len(lines) == 1 and lines[0].startswith("step 21: rank 2")
        assert lines[0].endswith(SAID[action])


def test_numpy_scalars_are_numbers_for_false_alarm_as_for_batch() -> None:
    """``false_alarm=np.float32(1e-3)`` was refused as "not a probability" while ``batch`` took numpy
    scalars; a numpy bool is still not a number."""
    import numpy as np

    assert Monitor(false_alarm=np.float64(1e-3), batch=np.float32(8)).observe({"w": torch.ones(3)}).warmup
    Monitor(false_alarm=np.float32(1e-3))
    with pytest.raises(UsageError) as err:
        Monitor(false_alarm=np.bool_(True))
    assert err.value.field == "false_alarm"


def test_rows_of_objects_that_are_numbers_are_read_as_before() -> None:
    """A review of the refusal above found it also refused 0-d arrays, tensors and Fractions in an object
    array, which loaded before; only None and text are refused."""
    from fractions import Fraction

    from naig.monitor.signals import to_float64

    rows = np.array([[np.array(1.5), torch.tensor(2.0), Fraction(1, 4), 3]], dtype=object)
    assert to_float64(rows, "gathered").tolist() == [[1.5, 2.0, 0.25, 3.0]]


def test_meta_weights_are_refused_with_advice_for_weights_not_gradients() -> None:
    """It said "pass the gradient after backward()" for weights too (a review, 2026-12-07)."""
    with pytest.raises(UsageError, match="^weights: 'w' is a meta tensor .*pass the weights after the model"):
        Monitor().weights_row({"w": torch.empty(3, device="meta")}, torch.device("cpu"))
    with pytest.raises(UsageError, match="^grads: 'g' is a meta tensor .*pass the gradient after backward"):
        Monitor().observe({"g": torch.empty(3, device="meta")})


def test_payloads_of_another_number_of_ranks_than_the_loaded_state_say_to_resume_on_its_ranks() -> None:
    """A state of 3 ranks loaded before init_process_group (no group to check against) was accepted; the
    first step then said "signals of 2 ranks for a detector of 3" (a review, 2026-12-07)."""
    saved = Monitor(window=16)
    with pytest.warns(UserWarning, match="warm-up"):
        for rows in _payloads(5, 3, seed=1):
            saved.decide(rows)
    mon = Monitor(window=16)
    mon.load_state_dict(saved.state_dict())
    before = copy.deepcopy(mon.state_dict())
    with pytest.raises(UsageError, match="^world=2: the monitor's detectors are of 3 ranks .*resume on 3"):
        mon.decide(_payloads(1, 2, seed=2)[0])
    assert mon.state_dict() == before


def test_the_setup_a_rank_sends_fits_its_bytes_whole() -> None:
    """The first gather compares each rank's setup as sent: the widest a run could send (a
    hundred-thousand-bucket DDP model with 64 blocks, every setting on) is not cut, so no setting is."""
    from naig.monitor.integration import GradientMonitor
    from naig.monitor.observe import setup_text

    hook = GradientMonitor(torch.nn.Linear(2, 2))
    hook.exact = True
    setup = hook._setup()
    sent = setup_text(torch.empty(100_000, 14 * 64 + 3, dtype=torch.float64, device="meta"), setup)
    assert sent.decode().endswith(setup) and setup.endswith("per_bucket=1 exact=1")
