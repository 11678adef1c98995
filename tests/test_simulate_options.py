"""naig.simulate.options: every option of the config tree declared once, everything else derived."""

from __future__ import annotations

import dataclasses
import inspect
import subprocess
import sys
import typing

import pytest

from naig.simulate.config import OPTIONS, SET_KEYS, RuleOptions, SimulateConfig
from naig.simulate.options import DOCS, doc_of, show
from naig.simulate.settings import SETTINGS, LocalUpdates
from naig_cli import simulate as cli

COMMAND_ONLY = {"config", "set_keys", "engine", "json_out", "plot"}  # what no field of the tree holds


def _tree_fields() -> list[tuple[str, dataclasses.Field]]:
    parts = [(SimulateConfig, ""), (RuleOptions, "rules."), *((s, f"{s.NAME}.") for s in SETTINGS.values())]
    parts.insert(parts.index((SETTINGS["arrivals"], "arrivals.")) + 1, (LocalUpdates, "arrivals.local."))
    return [(prefix + f.name, f) for kind, prefix in parts for f in dataclasses.fields(kind)
            if f.name not in ("rules", "setting", "local")]


def test_every_field_of_the_tree_is_declared_once_under_its_own_key() -> None:
    fields = _tree_fields()
    assert [key for key, _ in fields] == [d.key for d in DOCS]
    for key, f in fields:
        assert f.metadata["doc"] is doc_of(key), key
        assert f.default == doc_of(key).default, key
    assert len({d.key for d in DOCS}) == len(DOCS)


def test_the_option_map_the_set_keys_and_the_list_keys_come_from_the_table() -> None:
    assert SET_KEYS == tuple(d.key for d in DOCS)
    assert OPTIONS["local_steps"] == ("arrivals.local", "steps")
    assert OPTIONS["arrivals"] == ("arrivals", "compute")
    assert OPTIONS["window"] == ("setting", "window")  # arrivals and distributed both have one
    assert set(OPTIONS) == {d.name for d in DOCS}
    for d in DOCS:  # a list key holds a tuple, a switch a bool, in the field's own annotation
        annotation = str(next(f for k, f in _tree_fields() if k == d.key).type)
        assert d.listed == (annotation.startswith("tuple[") and "..." in annotation), d.key
        assert d.switch == (annotation == "bool"), d.key


def test_every_flag_of_the_table_is_a_parameter_of_simulate_with_its_help_panel_and_default() -> None:
    hints = typing.get_type_hints(cli.simulate, include_extras=True)
    params = set(inspect.signature(cli.simulate).parameters)
    by_name = {}
    for d in DOCS:
        if d.flag is not None:
            by_name.setdefault(d.name, d)  # window: the first of its two fields
    assert params - COMMAND_ONLY == set(by_name)
    for name, d in by_name.items():
        opt = typing.get_args(hints[name])[1]
        assert d.flag in (opt.default, *opt.param_decls), name
        assert opt.help == d.help and opt.rich_help_panel == d.where, name
        assert opt.show_default == (d.shown_default or False), name


def test_a_field_without_a_flag_is_named_by_its_set_key_in_errors() -> None:
    from typer.testing import CliRunner

    from naig_cli.main import app

    out = CliRunner().invoke(app, ["simulate", "--lags", "0,1", "--strategies", "dc-asgd",
                                   "--set", "rules.dc_lambda=-1"])
    assert out.exit_code == 2 and "--set rules.dc_lambda=-1" in out.stderr, out.stderr
    out = CliRunner().invoke(app, ["simulate", "--arrivals", "exp:1,exp:1", "--window", "0"])
    assert out.exit_code == 2 and "--window 0:" in out.stderr, out.stderr


def test_shown_defaults() -> None:
    assert (show((0, 10)), show(20.0), show(False), show(1e-3), show(None), show(())) == \
        ("0,10", "20", "false", "0.001", None, None)
    assert doc_of("rules.max_staleness").shown_default == "K"
    with pytest.raises(KeyError):
        doc_of("rules.nope")


def test_the_option_table_and_the_cli_load_no_torch() -> None:
    code = "import sys, naig.simulate.options, naig_cli.simulate; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0
