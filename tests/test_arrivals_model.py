"""The arrival model: K from the lists, validation with fields, mean cycle times (docs/design.md §10)."""

import numpy as np
import pytest

from naig.arrivals import ArrivalModel
from naig.errors import UsageError


def test_workers_from_lists_or_the_option() -> None:
    assert ArrivalModel.from_specs("exp:1").workers == 1  # one spec everywhere: one worker
    assert ArrivalModel.from_specs("exp:1", uplink="const:1", bandwidth=[1e9]).workers == 1
    assert ArrivalModel.from_specs("exp:1", workers=8).workers == 8
    assert ArrivalModel.from_specs("exp:1,exp:2,exp:3").workers == 3
    assert ArrivalModel.from_specs("exp:1", uplink="const:1,const:2").workers == 2
    m = ArrivalModel.from_specs("exp:1,exp:2", workers=2, uplink="const:0.5")
    assert [d.mean for d in m.uplink] == [0.5, 0.5]


def test_means_include_per_sample_and_transfer_times() -> None:
    m = ArrivalModel.from_specs("exp:0.2", workers=2, per_sample="const:0.01", batch_size=30,
                                uplink="exp:0.1", downlink="const:0.05", bytes_up=1e6, bytes_down=2e6,
                                bandwidth=[1e7, 2e7])
    assert m.mean_compute() == pytest.approx([0.5, 0.5])
    assert m.mean_uplink() == pytest.approx([0.1 + 0.1, 0.1 + 0.05])
    assert m.mean_downlink() == pytest.approx([0.05 + 0.2, 0.05 + 0.1])
    assert m.mean_cycle() == pytest.approx(m.mean_compute() + m.mean_uplink() + m.mean_downlink())
    assert m.var_compute() == pytest.approx([0.04, 0.04])  # const per-sample part adds nothing
    assert m.var_cycle() == pytest.approx([0.04 + 0.01, 0.04 + 0.01])


@pytest.mark.parametrize(("kwargs", "field", "needle"), [
    ({"compute": "exp:1,exp:2", "workers": 3}, "compute", "`workers` is 3"),
    ({"compute": "exp:1,exp:2", "uplink": "exp:1,exp:1,exp:1"}, "uplink", "differ"),
    ({"compute": "exp:1", "workers": 0}, "workers", ">= 1"),
    ({"compute": "exp:1", "mode": "shared-memory", "uplink": "exp:1"}, "uplink", "shared memory"),
    ({"compute": "exp:1", "mode": "async"}, "mode", "blocking, non-blocking, shared-memory"),
    ({"compute": "exp:1", "batch_size": 8}, "batch_size", "`per_sample`"),
    ({"compute": "exp:1", "per_sample": "exp:1", "batch_size": 0}, "batch_size", ">= 1"),
    ({"compute": "exp:1", "bandwidth": [0.0]}, "bandwidth", "> 0"),
    ({"compute": "exp:1", "bandwidth": [1.0, 2.0, 3.0]}, "bandwidth", "`workers` is"),
    ({"compute": "exp:1", "bytes_up": -1.0}, "bytes_up", ">= 0"),
    ({"compute": "gamma:1"}, "compute", "SHAPE"),
])
def test_errors_name_their_field(kwargs: dict, field: str, needle: str) -> None:
    if "bandwidth" in kwargs and len(kwargs["bandwidth"]) == 3:
        kwargs = kwargs | {"workers": 2}
    with pytest.raises(UsageError) as info:
        ArrivalModel.from_specs(**kwargs)
    assert info.value.field == field and needle in info.value.message, info.value


def test_describe_is_json_ready() -> None:
    d = ArrivalModel.from_specs("exp:1,gamma:2:3", downlink="const:0.1").describe()
    assert d["compute"] == ["exp:1", "gamma:2:3"] and d["downlink"] == ["const:0.1", "const:0.1"]
    assert d["uplink"] is None and d["workers"] == 2 and d["mode"] == "blocking"
    assert isinstance(np.float64(d["bytes_up"]), float)


def test_direct_construction_needs_positive_compute_means() -> None:
    from naig.arrivals import Distribution

    with pytest.raises(UsageError) as info:
        ArrivalModel(compute=[Distribution("const", 0.0)])
    assert info.value.field == "compute"
    assert ArrivalModel(compute=[Distribution("exp", 1.0)] * 2).compute == (Distribution("exp", 1.0),) * 2


def test_workers_past_the_cap_are_refused_before_any_per_worker_state() -> None:
    from naig.arrivals.model import MAX_WORKERS

    assert ArrivalModel.from_specs("exp:1", workers=MAX_WORKERS // 100).workers == MAX_WORKERS // 100
    with pytest.raises(UsageError) as info:
        ArrivalModel.from_specs("exp:1", workers=10**12)  # would need TBs if the tuples were built
    assert info.value.field == "workers" and "at most 1,000,000" in info.value.message
