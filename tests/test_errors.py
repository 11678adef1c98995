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
