"""Library errors carry the field at fault and an exit code (naig.errors)."""

import pytest

from naig.errors import DataError, NaigError, UsageError, VerificationError


def test_field_and_value_read_as_an_argument() -> None:
    err = UsageError("must be >= 0", field="beta", value=-1.0)
    assert str(err) == "beta=-1.0: must be >= 0"
    assert (err.field, err.value, err.has_value, err.exit_code) == ("beta", -1.0, True, 2)


def test_field_without_value_and_plain_messages() -> None:
    assert str(UsageError("pass one", field="staleness")) == "staleness: pass one"
    err = DataError("f.safetensors: truncated")
    assert str(err) == "f.safetensors: truncated" and err.field is None and err.exit_code == 1


@pytest.mark.parametrize(("cls", "code"), [(DataError, 1), (UsageError, 2), (VerificationError, 1)])
def test_exit_codes_and_hierarchy(cls: type, code: int) -> None:
    assert cls.exit_code == code and issubclass(cls, NaigError)


def test_none_is_a_value_too() -> None:
    assert str(UsageError("is required", field="data", value=None)) == "data=None: is required"


def test_run_main_prints_one_line_and_exits_with_the_errors_code(capsys, monkeypatch) -> None:
    from naig.errors import run_main

    def main(argv: list[str]) -> None:
        raise (UsageError if argv == ["usage"] else DataError)("bad thing", field="steps", value=0)

    monkeypatch.delenv("NAIG_DEBUG", raising=False)
    for argv, code in ((["usage"], 2), (["data"], 1)):
        with pytest.raises(SystemExit) as done:
            run_main(main, argv)
        assert done.value.code == code
        assert capsys.readouterr().err == "error: steps=0: bad thing\n"
    monkeypatch.setenv("NAIG_DEBUG", "1")
    with pytest.raises(UsageError):
        run_main(main, ["usage"])


def test_warn_caller_points_at_the_users_line_through_naig_and_torch() -> None:
    """The two-rank warning (built inside ``Monitor.decide``) and the ``warn`` action's line (inside
    DDP's communication hook, under ``loss.backward()``) are shown at this file's lines."""
    import warnings

    import numpy as np
    import torch
    from torch.nn.parallel import DistributedDataParallel

    from naig.monitor import Monitor, MonitorHook
    from naig.monitor.detectors import TWO_RANKS
    from tests.conftest import process_group_in_this_process

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Monitor().decide(np.ones((2, 16)))  # 2 ranks' payloads: the detector warns once
    two = [w for w in caught if str(w.message) == TWO_RANKS]
    assert len(two) == 1 and two[0].filename == __file__
    with process_group_in_this_process():
        model = torch.nn.Linear(3, 2)
        ddp = DistributedDataParallel(model)
        MonitorHook(model, Monitor(action="warn")).register(ddp)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            (ddp(torch.ones(2, 3)).sum() * float("nan")).backward()
    lines = [w for w in caught if str(w.message).startswith("step 1: rank 0")]  # (and the warm-up note)
    assert len(lines) == 1 and "non-finite gradient" in str(lines[0].message)
    assert {w.filename for w in caught} == {__file__}
