"""naig.detect.live.compare: the benchmark's thresholds applied to the live scores, intervals side by side."""

import math

import numpy as np

from naig.detect.live import SCORES, compare, overlap


def _bench(thr: float) -> dict:
    cell = {m: [0.5, 0.3, 0.7] for m in ("detection", "top1")}
    return {"detectors": {name: {"threshold": thr} for name in SCORES},
            "rows": [{"fault": "scale", "magnitude": 10.0, "detectors": {name: cell for name in SCORES}}]}


def _run(seed: int, own: float) -> dict:
    # 4 steps, 3 ranks; the faulty rank scores `own`, the others 1.0
    bad = [0, 1, 2, 0]
    rows = [[own if r == b else 1.0 for r in range(3)] for b in bad]
    return {"fault": "scale", "magnitude": 10.0, "seed": seed, "bad": bad,
            "scores": {name: rows for name in SCORES}}


def test_compare_applies_the_benchmark_threshold_per_seed() -> None:
    live = {"runs": [_run(0, 5.0), _run(1, 0.5), _run(2, 5.0)]}
    rows = compare(live, _bench(thr=2.0))
    assert [r["detector"] for r in rows] == sorted(SCORES)
    for r in rows:
        mean, low, high = r["live"]["detection"]
        assert mean == 2 / 3 and low < mean < high  # seeds: 1, 0, 1
        assert r["live"]["top1"][0] == 2 / 3
        assert r["agree"] == {"detection": True, "top1": True}


def test_intervals_that_do_not_meet_disagree() -> None:
    assert not overlap([0.9, 0.85, 0.95], [0.5, 0.3, 0.7])
    assert overlap([1.0, math.nan, math.nan], [0.9, 0.8, 1.0])  # one seed: its mean
    assert not overlap([1.0, 1.0, 1.0], [0.5, 0.3, 0.7])


def test_the_monitor_on_real_ranks_scores_as_the_benchmark(tmp_path) -> None:  # noqa: ANN001
    """3 gloo processes: the monitor's own relative z of norm and distance (from its all-gather)
    equal the benchmark's ``norm`` and ``sketch-14`` scores of the same gradients."""
    from tests.conftest import run_ranks

    run = run_ranks("tests.detect_ranks", tmp_path, timeout=180)
    assert len(run["bad"]) == 4 and set(run["bad"]) <= {0, 1, 2}
    for name in SCORES:
        live, ref = np.array(run["scores"][name], float), np.array(run["reference"][name], float)
        assert live.shape == (4, 3)
        np.testing.assert_allclose(live, ref, rtol=1e-9, atol=1e-9, err_msg=name)
