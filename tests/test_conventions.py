"""Project conventions that keep one home for each idea (checked on the source, with ast)."""

import ast
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


def _sources(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


def _docstring_nodes(tree: ast.AST) -> set[int]:
    """ids of the string constants that are module, class or function docstrings."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


OPTION_TABLE = ROOT / "naig" / "simulate" / "options.py"
"""The simulator's option table: the flags and help ``naig simulate`` shows, declared beside the config
tree's fields (in the library so the CLI reads it without torch); no error text."""


@pytest.mark.parametrize("path", [p for p in _sources("naig") if p != OPTION_TABLE],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_library_strings_name_fields_not_cli_flags(path: Path) -> None:
    """Library errors carry field names; only naig_cli words them as --flags (and the option table)."""
    tree = ast.parse(path.read_text())
    docs = _docstring_nodes(tree)
    bad = [node.value for node in ast.walk(tree)
           if isinstance(node, ast.Constant) and isinstance(node.value, str)
           and id(node) not in docs and FLAG.search(node.value)]
    assert not bad, bad


def _ours(module: str | None) -> bool:
    return bool(module) and module.split(".")[0] in ("naig", "naig_cli", "tests")


def _private_imports(path: Path) -> list[str]:
    """``from naig... import _x`` and ``mod._x`` where ``mod`` is a module of ours."""
    tree = ast.parse(path.read_text())
    names, modules = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {(a.asname or a.name).split(".")[0] for a in node.names if _ours(a.name)}
        if isinstance(node, ast.ImportFrom) and _ours(node.module):
            names += [a.name for a in node.names if a.name.startswith("_") and a.name != "__version__"]
            modules |= {a.asname or a.name for a in node.names}  # may be a submodule
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                and isinstance(node.value, ast.Name) and node.value.id in modules):
            names.append(f"{node.value.id}.{node.attr}")
    return names


@pytest.mark.parametrize("path", _sources("tests") + _sources("benchmarks") + _sources("examples"),
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_tests_and_benchmarks_use_public_names_only(path: Path) -> None:
    assert not _private_imports(path)


def test_every_library_module_declares_all() -> None:
    missing = [str(p.relative_to(ROOT)) for p in _sources("naig")
               if p.name != "__main__.py" and "__all__" not in p.read_text()]
    assert not missing


def test_code_cites_the_design_document_not_an_absent_spec() -> None:
    cites = [str(p.relative_to(ROOT)) for p in _sources("naig") + _sources("naig_cli")
             if "SPEC §" in p.read_text()]
    assert not cites
    design = (ROOT / "docs" / "design.md").read_text()
    sections = set(re.findall(r"^## (\d+)\.", design, flags=re.M))
    for p in _sources("naig") + _sources("naig_cli"):
        for sec in re.findall(r"docs/design\.md §(\d+)", p.read_text()):
            assert sec in sections, (p, sec)


RUN_KINDS = {"LagsRun", "ArrivalRun", "SyncRoundsRun", "LocalRun", "RoundRun", "GossipRun", "LagsSetting",
             "ArrivalsSetting", "DistributedSetting", "LagsEngine", "ArrivalsEngine", "LocalEngine",
             "DistributedSession", "SimulatedSession", "ParameterServer"}
ENGINES = ROOT / "naig" / "simulate" / "engines"


def _asks_the_kind(tree: ast.AST) -> list[str]:
    """``isinstance(x, <a run, setting or engine class>)``, ``type(x) is ...`` and ``hasattr(run, ...)``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("isinstance",
                                                                                            "hasattr"):
            names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} | {
                n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}
            if names & RUN_KINDS or (node.func.id == "hasattr" and names & {"run", "session", "setting"}):
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
        if isinstance(node, ast.Compare) and any(isinstance(op, ast.Is | ast.IsNot) for op in node.ops):
            names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
            if "type" in names and names & RUN_KINDS:
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


@pytest.mark.parametrize("path", [p for p in (*_sources("naig"), *_sources("naig_cli"))
                                  if ENGINES not in p.parents], ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_outside_the_engines_asks_which_kind_of_run_it_has(path: Path) -> None:
    """Only naig/simulate/engines/ tells runs, settings and sessions apart (``engines.select`` and
    ``engines.open_session`` choose; the rest use the ``Run``/``Session`` protocols and the settings'
    own methods)."""
    assert not _asks_the_kind(ast.parse(path.read_text())), path


def test_the_kind_check_finds_what_it_looks_for() -> None:
    """The check above can fail: it sees the patterns it forbids."""
    code = "isinstance(run, LagsRun)\nhasattr(run, 'sender')\ntype(s) is ArrivalsSetting\nisinstance(x, int)"
    assert len(_asks_the_kind(ast.parse(code))) == 3


def test_the_tree_is_ruff_clean() -> None:
    """The style the project holds itself to (pyproject's ``[tool.ruff]``), checked where the tests
    run: ruff comes with the ``dev`` extra, pinned (a newer ruff may add rules to a selected family)."""
    ruff = shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed (pip install -e '.[dev]')")
    r = subprocess.run([ruff, "check", "--no-cache", "."], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-1000:]
