"""Worker faults of the distributed engine (naig.distributed.faults)."""

import pytest

from naig.distributed.faults import WorkerFault, parse_worker_faults
from naig.errors import UsageError


def test_parse_defaults_and_activity() -> None:
    kill, nan = parse_worker_faults(["2:kill@7", " 0:nan "], workers=3)
    assert kill == WorkerFault(2, "kill", 7) and nan == WorkerFault(0, "nan", 0)
    assert not kill.active(6) and kill.active(7) and kill.active(100)
    assert nan.active(0)


@pytest.mark.parametrize("spec", ["1:explode", "x:kill", "1:kill@-2", "1:nan@", "kill", "1:kill:3"])
def test_malformed_specs_name_the_field(spec: str) -> None:
    with pytest.raises(UsageError) as err:
        parse_worker_faults([spec], workers=3)
    assert err.value.field == "worker_faults" and err.value.value == spec


def test_worker_out_of_range() -> None:
    with pytest.raises(UsageError, match="worker 3 does not exist; use 0..2"):
        parse_worker_faults(["3:hang"], workers=3)
