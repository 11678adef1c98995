"""Every engine × every fault kind and every rule: applied (the test sees it) or refused in one line.

naig.simulate.engines: ``select`` gives each (setting, rule) its engine; the engines declare the
fault kinds they apply. The distributed engine's real-process checks run one worker (nproc 2):
with a single worker the arrival order is fixed, so a run is deterministic and a fault's effect
is visible as a different result.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from naig.choices import LOCAL_METHODS
from naig.errors import UsageError
from naig.simulate import SimulateConfig, Workload, run_experiment
from naig.simulate.engines import GOSSIP_METHODS, select, start
from naig.simulate.faults import FAULT_KINDS, PROCESS_FAULTS
from naig.simulate.strategies import STRATEGIES
from tests.conftest import run_python

TINY = dict(steps=2, seeds=1, data_bytes=60_000, eval_every=0, eval_batches=1, batch_size=2, lr=(1e-2,))
ARG = {"signflip": ":3", "scale": ":5", "noise": ":2", "coordflip": ":0.5", "bitflip32": ":30",
       "bitflip16": ":14"}  # the kinds that need an argument
NON_FINITE = ("nan", "inf")  # they reach θ through the mean
SETTINGS = {  # every simulated engine, each with a rule that uses every worker's gradient in every update
    "lags": dict(lags=(0, 1), strategies=("hogwild",)),
    "arrivals": dict(arrivals="const:1,const:1", window=2, strategies=("hogwild",)),
    "local": dict(arrivals="const:1,const:1", local_steps=(1,), strategies=("diloco",)),
}


def _fault(kind: str, worker: int = 1) -> str:
    return f"{worker}:{kind}{ARG.get(kind, '')}"


def _theta_after(cfg: SimulateConfig, updates: int = 2) -> torch.Tensor:
    run = start(cfg, Workload(cfg), cfg.strategies[0], seed=0)
    for _ in range(updates):
        run.step()
        if run.done:
            break
    return run.theta.clone()


@pytest.mark.parametrize("kind", FAULT_KINDS)
@pytest.mark.parametrize("setting", list(SETTINGS))
def test_every_simulated_engine_applies_or_refuses_every_fault_kind(setting: str, kind: str) -> None:
    base = SimulateConfig.from_options(**SETTINGS[setting], **TINY)
    if kind in PROCESS_FAULTS:  # a process fault needs worker processes
        with pytest.raises(UsageError) as info:
            base.with_options(faults=(_fault(kind),))
        assert info.value.field == "faults" and "\n" not in str(info.value)
        assert "needs worker processes" in info.value.message
        return
    clean, faulty = _theta_after(base), _theta_after(base.with_options(faults=(_fault(kind),)))
    if kind in NON_FINITE:
        assert not bool(torch.isfinite(faulty).all())  # the NaN or inf reached θ through the mean
    else:
        assert bool(torch.isfinite(faulty).all()) and not torch.equal(clean, faulty)


def test_gasloc_refuses_every_fault_in_one_line() -> None:
    base = SimulateConfig.from_options(**{**SETTINGS["local"], "strategies": ("gasloc",)}, **TINY)
    for kind in FAULT_KINDS:
        with pytest.raises(UsageError) as info:
            base.with_options(faults=(_fault(kind),))
        assert info.value.field == "faults" and "\n" not in str(info.value)


RULES = (*STRATEGIES, *LOCAL_METHODS)


def _config_or_error(setting: dict, rule: str) -> SimulateConfig | UsageError:
    try:
        return SimulateConfig.from_options(**{**setting, "strategies": (rule,)}, **TINY)
    except UsageError as exc:
        return exc


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("setting", ["lags", "arrivals"])
def test_every_simulated_engine_runs_or_refuses_every_rule(setting: str, rule: str) -> None:
    options = {"lags": dict(lags=(0, 1, 2)),
               "arrivals": dict(arrivals="const:1,const:2,const:3", window=3)}[setting]
    if rule in LOCAL_METHODS and setting == "arrivals" and rule != "allreduce":  # allreduce: H = 1 always
        options = {**options, "local_steps": (1,)}
    cfg = _config_or_error(options, rule)
    if isinstance(cfg, UsageError):
        assert cfg.field in ("strategies", "reference") and "\n" not in str(cfg), str(cfg)
        assert (setting, rule) in REFUSED, f"{rule} refused with {setting}: {cfg}"
        return
    assert (setting, rule) not in REFUSED
    engine = select(cfg, rule)
    expected = "gossip" if rule in GOSSIP_METHODS else "local" if rule in LOCAL_METHODS else setting
    assert engine.NAME == expected
    result = run_experiment(cfg)
    (run,) = result.runs
    assert run.strategy == rule and run.updates > 0 and run.diverged_at is None
    assert run.final_val_loss < result.untrained_val_loss  # it trained (lr 1e-2, 2 steps)


REFUSED = {  # the pairs a setting does not define, each refused in one line (the rule says why)
    *(("lags", m) for m in LOCAL_METHODS),  # local updates run on the arrivals clock
    ("arrivals", "fresh-only"),  # the fixed-lag oracle; drop-stale with max_staleness 0 is its analogue
    ("lags", "drop-stale"),  # with fixed lags it would keep a fixed subset of workers: fresh-only
}


def test_distributed_setting_accepts_every_gradient_rule_and_refuses_local_methods() -> None:
    for rule in RULES:
        cfg = _config_or_error(dict(engine="distributed", nproc=4, window=3), rule)
        if rule in LOCAL_METHODS or rule == "fresh-only":  # as with arrivals
            assert isinstance(cfg, UsageError) and cfg.field == "strategies" and "\n" not in str(cfg)
        else:
            assert isinstance(cfg, SimulateConfig), f"{rule}: {cfg}"


@pytest.mark.parametrize("kind", FAULT_KINDS)
def test_distributed_config_accepts_every_fault_kind(kind: str) -> None:
    cfg = SimulateConfig.from_options(engine="distributed", nproc=3, faults=(_fault(kind),))
    assert cfg.fault_list[0].kind == kind


DISTRIBUTED_CHILD = """
import json, sys
from naig.simulate import SimulateConfig, run_experiment
from tests.test_simulate_engines import _fault
done = []
for options in json.loads(sys.argv[1]):
    faults = tuple(_fault(kind, worker=0) for kind in options.pop("fault_kinds", []))
    cfg = SimulateConfig.from_options(engine="distributed", nproc=2, timeout=10, faults=faults, **options)
    result = run_experiment(cfg)
    done.append([dict(curve=r.curve, mean_pi=r.mean_pi, updates=r.updates) for r in result.runs])
print(json.dumps(done))
"""


def _distributed_runs(*option_sets: dict) -> list[list[dict]]:
    """``run_experiment`` on the distributed engine (nproc 2: one worker) for each set of options
    (``fault_kinds``: faults on worker 0), one after another in one ``run_python`` run, whose worker
    processes are forked warm (tests.warm_python); each result's runs as ``curve``, ``mean_pi`` and
    ``updates`` (floats exact through JSON, NaN included)."""
    r = run_python("-c", DISTRIBUTED_CHILD, json.dumps([{**o, "lr": list(o["lr"])} for o in option_sets]),
                   timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.splitlines()[-1])


def test_distributed_engine_applies_every_gradient_fault_kind() -> None:
    """One worker, real processes: deterministic, so every gradient fault changes the curve (nan: NaN)."""
    kinds = [k for k in sorted(FAULT_KINDS) if k not in PROCESS_FAULTS]  # kill and hang: a lost worker,
    #                                                   tests/test_simulate_distributed_server.py
    base = dict(strategies=["hogwild"], **{**TINY, "steps": 3})
    results = _distributed_runs(base, base, *({**base, "fault_kinds": [kind]} for kind in kinds))
    clean, again, *faulty = [_losses(runs) for runs in results]
    assert clean == again  # one worker: the same result twice
    for kind, curve in zip(kinds, faulty, strict=True):
        if kind in NON_FINITE:
            assert not math.isfinite(curve[-1]), curve
        else:
            assert curve[-1] != clean[-1] and math.isfinite(curve[-1]), (kind, curve, clean)


def _losses(runs: list[dict]) -> list[float]:
    (run,) = runs
    return [loss for _, loss in run["curve"]]


MEMORY_CHILD = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (3 * 2**30, 3 * 2**30))  # far below steps × K × 8 bytes
from naig.simulate import SimulateConfig, Workload
from naig.simulate.engines import start
options = {setting}
cfg = SimulateConfig.from_options(steps=10**9, seeds=1, data_bytes=60_000, eval_batches=1, batch_size=2,
                                  **options)
run = start(cfg, Workload(cfg), cfg.strategies[0], seed=0)
for _ in range(3):
    run.step()
print(run.t, len(run.history.rows()))
"""


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_memory_is_what_ran_not_the_budget(setting: str) -> None:
    """A billion steps allocate nothing per step up front: three updates run under a 3 GiB cap."""
    code = MEMORY_CHILD.format(setting=repr(SETTINGS[setting]))
    out = run_python("-c", code, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    t, rows = map(int, out.stdout.split())
    assert t == 3 and rows == 3  # three updates made, three rows of π kept: nothing sized by the budget


def test_one_worker_distributed_runs_several_rules_and_reports_them(tmp_path) -> None:  # noqa: ANN001
    """--nproc 2 (K = 1): every run is reported, with the staleness law for one worker (τ = 0); sync
    holds a window of that one worker (it crashed there: no row buffer for a window of one)."""
    from tests.conftest import run_naig

    r = run_naig("simulate", "--engine", "distributed", "--nproc", "2", "--strategies", "hogwild,naig,sync",
                 "--steps", "3", "--seeds", "1", "--data-bytes", "60000", "--eval-every", "0", "--json")
    assert r.returncode == 0, r.stderr
    import json

    doc = json.loads(r.stdout)
    assert [run["strategy"] for run in doc["runs"]] == ["hogwild", "naig", "sync"]
    for run in doc["runs"]:
        assert run["complete"] and run["updates"] == 3 and run["staleness"]["mean"] == 0.0
        law = run["staleness"]["predicted"]  # sync waits for its window: no arrival law applies
        assert law is None if run["strategy"] == "sync" else law["mean"] == 0


def test_a_message_timeout_under_a_second_still_lets_the_processes_meet() -> None:
    """distributed.timeout bounds each message; the rendezvous waits for slow starts (torch imports)."""
    from tests.conftest import run_naig

    r = run_naig("simulate", "--engine", "distributed", "--nproc", "3", "--set", "distributed.timeout=0.5",
                 "--strategies", "hogwild", "--steps", "2", "--seeds", "1", "--data-bytes", "60000",
                 "--eval-every", "0")
    assert r.returncode == 0, r.stderr[-2000:]


def test_lags_that_never_join_are_noted() -> None:
    cfg = SimulateConfig.from_options(lags=(0, 5, 9), steps=5, strategies=("hogwild",))
    (note,) = cfg.ignored_options()
    assert "worker(s) 1,2 never join" in note
    assert cfg.with_options(warmup_theta0=True).ignored_options() == ()  # they start at θ_0 then


@pytest.mark.parametrize("rule", ["hogwild", "naig", "dc-asgd"])
def test_one_worker_on_real_processes_equals_the_simulated_arrivals_engine(rule: str) -> None:
    """One update path: with one worker (no arrival order to vary) the distributed engine's run is the
    simulated arrivals engine's run, loss for loss, for a rule with state (naig's EMA, dc-asgd)."""
    common = dict(strategies=(rule,), **{**TINY, "steps": 4, "eval_every": 2})
    ((a,),) = _distributed_runs({**common, "strategies": [rule]})
    (b,) = run_experiment(SimulateConfig.from_options(arrivals="const:1", **common)).runs
    a_curve, a_pi = tuple(tuple(point) for point in a["curve"]), tuple(a["mean_pi"])  # (JSON's lists)
    assert a["updates"] == b.updates == 4
    if rule == "naig":  # its weight comes from a sketch of the received buffer: sums reduced in another
        #                 memory layout differ in the last float32 bits, so w (the lr scale) does too
        assert [x for x, _ in a_curve] == [x for x, _ in b.curve]
        assert [v for _, v in a_curve] == pytest.approx([v for _, v in b.curve], rel=1e-6, abs=0)
        assert a_pi == pytest.approx(b.mean_pi, rel=1e-5)
    else:  # bit for bit
        assert a_curve == b.curve and a_pi == b.mean_pi


@pytest.mark.parametrize("rule", [*STRATEGIES, *LOCAL_METHODS])
@pytest.mark.parametrize("setting", ["lags", "arrivals"])
def test_each_engine_lives_in_its_settings_package_beside_the_setting(setting: str, rule: str) -> None:
    """The setting is the unit: ``select`` hands a rule an engine from the package of the setting's class."""
    if setting == "lags" and rule in LOCAL_METHODS:
        pytest.skip("local-update methods run with arrivals only")
    options = {"lags": dict(lags=(0, 1)), "arrivals": dict(arrivals="const:1,const:1")}[setting]
    cfg = SimulateConfig.from_options(**options, steps=2, strategies=("hogwild",))
    package = type(cfg.setting).__module__.rpartition(".")[0]
    assert package == f"naig.simulate.{setting}", package
    assert select(cfg, rule).__module__.startswith(f"{package}."), (rule, select(cfg, rule).__module__)


def test_the_distributed_setting_and_its_engine_share_a_package() -> None:
    from naig.simulate.distributed import DistributedSession, DistributedSetting

    assert DistributedSetting.__module__ == "naig.simulate.distributed.setting"
    assert DistributedSession.__module__.startswith("naig.simulate.distributed.")


def test_the_distributed_engine_refuses_a_log_dir_it_would_not_write(tmp_path) -> None:  # noqa: ANN001
    """Its server writes no per-step CSV: --log-dir was accepted and ignored in silence."""
    with pytest.raises(UsageError, match="the distributed engine writes no per-step log") as err:
        SimulateConfig.from_options(engine="distributed", nproc=2, log_dir=str(tmp_path))
    assert err.value.field == "log_dir" and list(tmp_path.iterdir()) == []
