"""Training on gradient arrivals (naig.simulate.arrivals.engine; docs/design.md §11)."""


import numpy as np
import pytest
import torch

from naig.arrivals import simulate_arrivals
from naig.errors import UsageError
from naig.simulate import SimulateConfig, Workload, run_experiment
from naig.simulate.arrivals.engine import arrival_model
from naig.simulate.engines import start

TINY = SimulateConfig.from_options(arrivals="exp:1,exp:1,exp:2,exp:4", steps=6, seeds=1, data_bytes=200_000,
                      eval_every=3, eval_batches=2, batch_size=4, strategies=("hogwild",))


def _numbers(res) -> list:  # noqa: ANN001
    return [(r.strategy, r.final_val_loss, r.curve, r.curve_seconds, r.staleness) for r in res.runs]


def test_staleness_in_training_is_the_arrival_process_of_the_seed() -> None:
    """B = 1: the τ measured while training equal the vectorised engine's, value for value."""
    sim = Workload(TINY)
    run = start(TINY, sim, "hogwild", seed=3)
    while not run.done:
        run.step()
    assert run.gradients == run.budget == TINY.steps * 4 and run.t == run.budget
    trace = simulate_arrivals(arrival_model(sim, TINY.setting), run.budget, seed=3)
    np.testing.assert_array_equal(run.staleness[:run.budget], trace.staleness)
    np.testing.assert_array_equal(run.sender[:run.budget], trace.worker)
    assert run.time == pytest.approx(float(trace.time[-1]))


def test_workers_compute_on_the_version_they_pulled(monkeypatch: pytest.MonkeyPatch) -> None:
    sim = Workload(TINY)
    seen: list[torch.Tensor] = []
    real = Workload.worker_grad
    monkeypatch.setattr(Workload, "worker_grad",
                        lambda s, th, g, o: (seen.append(th.clone()), real(s, th, g, o))[1])
    run = start(TINY, sim, "hogwild", seed=0)
    history = [run.theta.detach().clone()]  # θ_v by version
    for _ in range(12):
        run.step()
        history.append(run.theta.detach().clone())
    pulled = [u - tau for u, tau in enumerate(run.staleness[:12])]  # B = 1: update u at version u
    for theta, v in zip(seen, pulled, strict=True):
        assert torch.equal(theta, history[v])
    assert len(run.versions) <= 4 + 1  # only versions some worker still holds are kept


def test_window_of_k_makes_one_update_per_k_arrivals() -> None:
    res = run_experiment(TINY.with_options(window=4, strategies=("hogwild", "sync")))
    hog, sync = res.runs
    assert hog.updates == TINY.steps and sync.updates == TINY.steps  # same gradient budget
    assert hog.curve_seconds[-1] < sync.curve_seconds[-1]  # sync waits for the slowest worker
    assert hog.staleness["mean"] < 4


def test_same_seed_same_json_and_every_strategy_sees_the_same_arrivals() -> None:
    cfg = TINY.with_options(strategies=("hogwild", "staleness"))
    one, two = run_experiment(cfg), run_experiment(cfg)
    assert _numbers(one) == _numbers(two)
    hog, stale = one.runs
    assert hog.staleness == stale.staleness and hog.curve_seconds == stale.curve_seconds


@pytest.mark.parametrize(("change", "field"), [
    ({"lags": (0, 1), "arrivals": "exp:1,exp:2"}, "lags"),  # lags alone would choose fixed lags
    ({"window": 5}, "window"),
    ({"window": 0}, "window"),
    ({"arrivals": "exp:-1"}, "arrivals"),
    ({"arrivals": "fast:1"}, "arrivals"),
    ({"arrivals": None, "uplink": "const:1"}, "uplink"),
    ({"arrivals": None, "window": 2}, "window"),
    ({"warmup_theta0": True}, "warmup_theta0"),
    ({"reference": "oracle"}, "reference"),
])
def test_arrival_options_are_checked_naming_the_field(change: dict, field: str) -> None:
    with pytest.raises(UsageError) as info:
        TINY.with_options(**change)
    assert info.value.field == field, str(info.value)


def test_options_that_cannot_apply_are_refused_or_noted(tmp_path) -> None:  # noqa: ANN001
    with pytest.raises(UsageError) as info:
        TINY.with_options(save_grads=str(tmp_path), save_at=(1,))
    assert info.value.field == "save_grads" and "arrivals" in info.value.message
    with pytest.raises(UsageError) as info:
        TINY.with_options(strategies=("naig",), outer_lr=0.5)  # naig is a gradient rule: no outer step
    assert info.value.field == "outer_lr"
    (tmp_path / "f").write_text("x")
    with pytest.raises(UsageError, match="is a file") as info:
        TINY.with_options(log_dir=str(tmp_path / "f"))
    notes = TINY.with_options(clip=1.0, max_staleness=2, faults=("1:zero@99",)).ignored_options()
    assert len(notes) == 3 and "`max_staleness` has no effect" in notes[0] and "`clip`" in notes[1]
    assert "start(s) after the last step" in notes[2]
    used = TINY.with_options(strategies=("centered-clip", "hogwild"), clip=1.0, window=2)
    assert used.ignored_options() == ()
