"""naig.detect.sequential: persistent faults on a training run, clean pools and their subsets."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from naig.detect.sequential import Context, PoolSpec, SequentialConfig, fault_runs, pool_run, subset
from naig.errors import UsageError

CFG = SequentialConfig(onset=23, horizon=2, faults=("scale:2", "stale", "nan:1", "reinit"), validation=1,
                       test=1, data_bytes=100_000, pool_ranks=5, context=16, replays=2, fa_ranks=(3, 4),
                       pools=(PoolSpec(8, "calibration", 0, 6),))


@pytest.fixture(scope="module")
def runs() -> list:
    return fault_runs(Context(CFG), 0)


def test_fault_runs_share_the_clean_prefix_and_differ_from_the_onset(runs: list) -> None:
    assert [r.kind for r in runs] == list(CFG.faults)
    assert all(r.payload.shape == (CFG.onset + CFG.horizon, 4, 16) for r in runs)
    for r in runs[1:]:
        np.testing.assert_array_equal(r.payload[:CFG.onset - 1], runs[0].payload[:CFG.onset - 1])
    x2, stale, nan, reinit = runs
    bad, t = x2.bad, CFG.onset - 1
    assert np.isfinite(x2.payload).all() and not nan.payload[t, bad, -1] == 0  # the NaN rank reports it
    others = [k for k in range(4) if k != bad]
    # ×2 at the onset: the bad rank's ‖g‖² is 4× the same clean gradient (the branch restored θ and streams)
    clean_sq = stale.payload[t, others, 14]
    np.testing.assert_allclose(x2.payload[t, others, 14], clean_sq, rtol=1e-6)
    assert not np.allclose(reinit.payload[t, bad, 14], x2.payload[t, bad, 14] / 4)
    assert nan.skipped == CFG.horizon + 1 and x2.skipped == 0  # a non-finite mean applies no update


def test_the_replica_payloads_are_the_weights_each_rank_computed_at(runs: list) -> None:
    """Every rank's weights agree but the bad rank's from the onset on, for the faults of its weights
    (stale: θ of 20 steps before; reinit: another initialisation); the others' are θ's."""
    x2, stale, _, reinit = runs
    t = CFG.onset - 1
    for r in runs:
        assert r.weights.shape == r.payload.shape
        assert (r.weights[:t] == r.weights[:t, :1]).all()  # clean prefix: the replicas agree
    assert (x2.weights == x2.weights[:, :1]).all()  # a gradient fault leaves the weights alone
    for r in (stale, reinit):
        others = [k for k in range(4) if k != r.bad]
        assert (r.weights[t:, others] == r.weights[t:, others[:1]]).all()
        assert not np.isclose(r.weights[t:, r.bad, 14], r.weights[t:, others[0], 14], rtol=1e-4).any()
    np.testing.assert_array_equal(stale.weights[t, stale.bad], stale.weights[t - 20, 0])  # θ_{t−20}


def test_the_exact_statistics_of_a_pool_subset_equal_a_direct_computation() -> None:
    ctx = Context(CFG)
    payload, gram, weights = pool_run(ctx, PoolSpec(8, "test", 0, 3))
    assert payload.shape == (3, 5, 16) and gram.shape == (3, 5, 5) and weights.shape == (3, 16)
    assert not np.array_equal(weights[0], weights[1])  # θ moves with training
    ranks = np.array([4, 1, 2])
    rec = subset(payload, gram, ranks, weights)
    assert rec.weights.shape == (3, 3, 16) and (rec.weights == weights[:, None]).all()
    g = torch.randn(5, 7, generator=torch.Generator().manual_seed(0)).double()
    gm = (g @ g.T).numpy()[None]
    sub = subset(np.zeros((1, 5, 16)), gm, ranks)
    x = g[ranks]
    mean = x.mean(0)
    np.testing.assert_allclose(sub.dots[0], (x @ mean).numpy(), rtol=1e-12)
    np.testing.assert_allclose(sub.sq_dists[0], ((x - mean) ** 2).sum(1).numpy(), rtol=1e-10)
    np.testing.assert_array_equal(rec.payload, payload[:, ranks])


@pytest.mark.parametrize("kwargs, field", [({"faults": ("x3",)}, "faults"), ({"onset": 10}, "onset"),
                                           ({"ranks": 2}, "ranks"), ({"fa_ranks": (3, 12)}, "fa_ranks"),
                                           ({"pools": ()}, "pools"), ({"false_alarm": 0.7}, "false_alarm")])
def test_bad_configs_name_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(UsageError) as err:
        SequentialConfig(**kwargs)
    assert err.value.field == field


def test_a_cache_of_other_faults_is_refused_not_reused(tmp_path) -> None:
    """A cache folder recorded for one set of faults is not silently read for another (the faults'
    new names included: a cache of x2 is not one of scale:2)."""
    import dataclasses

    from naig.detect.sequential import record_all

    one = dataclasses.replace(CFG, faults=("scale:2",), onset=3, horizon=1,
                              pools=(PoolSpec(8, "calibration", 0, 2),))
    first, _ = record_all(one, cache=str(tmp_path))
    again, _ = record_all(one, cache=str(tmp_path))  # the same faults: read back, equal
    np.testing.assert_array_equal(first["validation"][0].payload, again["validation"][0].payload)
    with pytest.raises(UsageError, match="holds the runs of another configuration") as err:
        record_all(dataclasses.replace(one, faults=("scale:0.5",)), cache=str(tmp_path))
    assert err.value.field == "cache"
