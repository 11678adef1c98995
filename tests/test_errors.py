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
