"""naig's import graph: no loop between modules and no arrow up between its layers.

The graph is read from the sources (``ast``): every ``import`` and ``from … import`` a module runs,
module-level or inside a function (a loop closed only by an import inside a function is still a
loop), except those under ``if TYPE_CHECKING:`` (annotations only). ``from pkg import name`` where
``name`` is a submodule (a ``.py`` file, or a compiled extension such as ``naig.sketch._kernel``)
is an arrow to that submodule, not to the package. The root package ``naig`` (a lazy facade that
holds ``__version__``) is no layer and not counted.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NAIG = ROOT / "naig"

LAYERS: dict[str, int] = {  # top-level part of naig → its layer; a module imports only from lower layers
    **dict.fromkeys(("errors", "choices", "lazy", "interrupts"), 0),
    **dict.fromkeys(("threads", "octonion", "faults"), 1),
    **dict.fromkeys(("g2", "io", "gibbs", "arrivals", "launch", "sketch"), 2),
    "metric": 3,
    "energy": 4,
    **dict.fromkeys(("router", "audit", "spectrum", "monitor"), 5),
    "distributed": 6,  # the NAIG DDP hook's old import paths (naig.distributed.ddp, .launch)
    "simulate": 7,
    "detect": 8,
    "__main__": 9,
}


def _modules(root: Path = NAIG) -> dict[str, Path]:
    out = {}
    for p in root.rglob("*.py"):
        parts = p.relative_to(root.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = p
    return out


def _is_submodule(package: Path, name: str) -> bool:
    """``name`` is a module file (source or compiled) inside the package folder ``package``."""
    return package.is_dir() and any(package.glob(f"{name}.*"))


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip |= {id(d) for c in node.body for d in ast.walk(c)}
    return skip


def _targets(node: ast.AST, module: str, is_package: bool, root: Path) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    assert isinstance(node, ast.ImportFrom)
    base = node.module or ""
    if node.level:
        here = module.split(".") if is_package else module.split(".")[:-1]
        base = ".".join(here[: len(here) - node.level + 1] + ([base] if base else []))
    folder = root.parent.joinpath(*base.split("."))
    subs = [a.name for a in node.names if _is_submodule(folder, a.name)]
    if not subs:
        return [base]
    # a compiled extension (no .py, no package folder) is a leaf: no arrow
    return [f"{base}.{s}" for s in subs if (folder / f"{s}.py").exists() or (folder / s).is_dir()]


def import_graph(root: Path = NAIG) -> dict[str, set[str]]:
    """{module: the naig modules it imports at run time} (see the module docstring)."""
    mods = _modules(root)
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, path in mods.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skip = _type_checking_nodes(tree)
        for node in ast.walk(tree):
            if id(node) in skip or not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            for t in _targets(node, m, path.name == "__init__.py", root):
                while t and t not in mods:  # a name inside a module, or a compiled extension
                    t = t.rpartition(".")[0]
                if t and t != m and t != root.name:
                    graph[m].add(t)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _part(module: str) -> str:
    return module.split(".")[1]


def upward(graph: dict[str, set[str]]) -> list[str]:
    """Every arrow from a module to a module of a higher layer (or of no layer)."""
    bad = []
    for a, targets in sorted(graph.items()):
        if a == "naig":
            continue
        for b in sorted(targets):
            pa, pb = _part(a), _part(b)
            if pa != pb and LAYERS.get(pb, 99) >= LAYERS.get(pa, -1):
                bad.append(f"{a} -> {b}")
    return bad


GRAPH = import_graph()


def test_no_module_of_naig_is_in_an_import_loop() -> None:
    assert not cycles(GRAPH), cycles(GRAPH)


def test_every_arrow_between_parts_points_down_the_layers() -> None:
    missing = sorted({_part(m) for m in GRAPH if m != "naig"} - set(LAYERS))
    assert not missing, f"give these parts of naig a layer in LAYERS: {missing}"
    assert not upward(GRAPH), upward(GRAPH)


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, code in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(code)
    return root / "naig"


def test_the_checks_find_a_loop_closed_inside_a_function_and_an_arrow_up(tmp_path: Path) -> None:
    """The checks can fail: a loop through a function-level import, and energy importing monitor."""
    pkg = _write(tmp_path, {
        "naig/__init__.py": "",
        "naig/energy.py": "def f():\n    from naig.monitor import core\n",
        "naig/monitor/__init__.py": "",
        "naig/monitor/core.py": "from naig.energy import f\n",
        "naig/sketch/__init__.py": "from naig.sketch import _kernel\n",
        "naig/sketch/_kernel.c": "",
        "naig/io.py": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                       "    from naig.monitor import core\n"),
    })
    graph = import_graph(pkg)
    assert cycles(graph) == [["naig.energy", "naig.monitor.core"]]
    assert upward(graph) == ["naig.energy -> naig.monitor.core"]
    assert graph["naig.sketch"] == set() and graph["naig.io"] == set()


def _is_engine(module: str) -> bool:
    """An engine's module, or the engines' interface: a setting's package is its setting and its engines."""
    if module.startswith(("naig.simulate.engines", "naig.simulate.lags.engine", "naig.simulate.arrivals.")):
        return not module.endswith(".setting")
    return module.startswith("naig.simulate.distributed.") and not module.endswith(".setting")


@pytest.mark.parametrize("module", ["naig.simulate.runs", "naig.simulate.parallel", "naig.simulate.settings",
                                    "naig.simulate.config", "naig.simulate.lags.setting",
                                    "naig.simulate.arrivals.setting", "naig.simulate.distributed.setting"])
def test_the_run_contracts_settings_and_side_by_side_runs_import_no_engine(module: str) -> None:
    assert not {m for m in GRAPH[module] if _is_engine(m)}, GRAPH[module]
