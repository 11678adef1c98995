"""naig.detect.protocol and report: the calibrated rate holds on clean data; faults never move θ."""

import math

import numpy as np
import pytest
from scipy import stats

from naig.detect import DETECTORS, DetectConfig, evaluate, run_protocol
from naig.errors import UsageError

SMALL = dict(ranks=4, warmup=3, window=3, batch_size=2, context=16, data_bytes=50_000)


def test_calibration_gives_the_configured_false_alarm_rate_on_clean_test_data() -> None:
    """The threshold leaves ⌊αN⌋ of N clean calibration values above it; on the clean test steps the
    rate agrees with that within the sampling of both sets (Fisher's exact test, 5% Bonferroni over the
    nine scores: the observed rate's own interval ignores that the threshold is itself estimated: with
    N = 400 at α = 0.1 its true rate has a standard deviation of 0.015)."""
    cfg = DetectConfig(**SMALL, steps=20, calibration=5, validation=0, test=5, faults=("nan",),
                       false_alarm=0.1)
    res = evaluate(cfg, run_protocol(cfg), n_params=0, seconds=0.0)
    n = cfg.calibration_samples
    for name in DETECTORS[1:]:
        fa = res.false_alarms[name]
        assert fa["total"] == 5 * 20 * 4 == n
        above = math.floor(cfg.false_alarm * n)  # calibration values above the threshold
        table = [[above, n - above], [fa["flagged"], fa["total"] - fa["flagged"]]]
        # The monitor's score is stateful (warm-up, pooled histories, CUSUM): its threshold fitted on
        # calibration seeds may only be conservative on others, never exceed the rate (one-sided).
        side = "less" if name == "monitor" else "two-sided"
        assert stats.fisher_exact(table, alternative=side).pvalue > 0.05 / 9, (name, fa)
    rates = [res.false_alarms[d]["rate"] for d in DETECTORS[1:] if d != "monitor"]
    assert 0.07 < float(np.mean(rates)) < 0.13  # the eight stateless ones together: about the configured 0.1
    assert res.false_alarms["nan"]["flagged"] == 0  # clean gradients are finite
    assert res.default is None  # no validation seeds, no choice


def test_faults_never_change_the_trajectory() -> None:
    a = run_protocol(DetectConfig(**SMALL, steps=3, calibration=1, validation=0, test=1, faults=("scale",),
                                  false_alarm=0.2))
    b = run_protocol(DetectConfig(**SMALL, steps=3, calibration=1, validation=0, test=1,
                                  faults=("noise", "data-random"), false_alarm=0.2))
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x.clean, y.clean)
    assert a[1].faulted.shape[0] == 7 and b[1].faulted.shape[0] == 9
    assert a[0].faulted.shape[0] == 0  # calibration seeds score clean steps only


def test_the_default_is_the_best_on_validation() -> None:
    cfg = DetectConfig(**SMALL, steps=4, calibration=1, validation=1, test=1, faults=("scale", "nan"),
                       false_alarm=0.1)
    res = evaluate(cfg, run_protocol(cfg), n_params=0, seconds=0.0)
    assert res.validation is not None
    assert res.validation[res.default] == max(res.validation.values())
    assert len(res.rows) == len(cfg.cells) == 8
    doc = res.to_dict()
    assert set(doc["detectors"]) == set(DETECTORS) and doc["default"] == res.default


@pytest.mark.parametrize(("change", "field"), [
    (dict(warmup=2), "warmup"), (dict(ranks=2), "ranks"), (dict(context=65), "context"),
    (dict(false_alarm=1e-4), "calibration"), (dict(false_alarm=0.5), "false_alarm"),
    (dict(faults="x"), "faults"),
    (dict(lr=float("nan")), "lr"), (dict(steps=0), "steps"),
    (dict(test=100_000_000), "test"), (dict(calibration=100_000_000), "calibration"),
    (dict(validation=100_000_000), "validation"), (dict(warmup=100_000_000), "warmup"),
    (dict(steps=100_000_000), "steps"),
])
def test_bad_settings_are_refused_naming_the_field(change: dict, field: str) -> None:
    kw = {**SMALL, "steps": 4, "calibration": 1, "validation": 0, "test": 1, "faults": ("stale",),
          "false_alarm": 0.1, "warmup": 20, **change}
    with pytest.raises(UsageError) as e:
        DetectConfig(**kw)
    assert e.value.field == field


def test_unreachable_calibration_says_so_and_what_to_change() -> None:
    """1e-7 with one calibration seed would need 31,250 seeds: more than the cap, so not that advice."""
    with pytest.raises(UsageError) as e:
        DetectConfig(false_alarm=1e-7, calibration=1)
    assert e.value.field == "calibration" and "31,250 calibration seeds" in e.value.message
    assert "more than the 10,000 seeds allowed" in e.value.message
    assert "`false_alarm` of at least" in e.value.message


def test_warmup_error_grammar() -> None:
    with pytest.raises(UsageError) as e:
        DetectConfig(warmup=3)  # window 16 and the stale faults' τ 20
    assert "(20) need that many" in e.value.message
    with pytest.raises(UsageError) as e:
        DetectConfig(warmup=3, faults="scale")
    assert "(16) needs that many" in e.value.message


def test_score_memory_names_the_option_driving_the_size(monkeypatch: pytest.MonkeyPatch) -> None:
    from naig.arrivals import engine

    monkeypatch.setattr(engine, "available_bytes", lambda: 2**30)
    with pytest.raises(UsageError) as e:
        run_protocol(DetectConfig(ranks=100_000))
    assert e.value.message.startswith("`ranks` 100000 × `steps` 40 ×") and "`ranks` (or" in e.value.message
    with pytest.raises(UsageError) as e:
        run_protocol(DetectConfig(test=9000))
    assert "(`test` 9000)" in e.value.message and "use a smaller `test`" in e.value.message
