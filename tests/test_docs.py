"""The documentation: the CLI reference is current, the site builds strictly, every snippet runs.

- docs/cli.md is generated from the Typer app by scripts/gen_cli_reference.py; a test regenerates
  it and fails, naming the command to run, when the committed page differs.
- ``mkdocs build --strict`` (skipped without the ``docs`` extra): no broken link or anchor, no page
  left out of the nav, and every name in ``__all__`` of each module documented under docs/api/
  has its own entry in the built API reference.
- Every ```python and ```bash block of README.md and docs/**/*.md runs, page by page, in order, in
  one empty folder (with a link to examples/), so a block may use the files an earlier block of
  the same page wrote. A block right after ``<!-- no-test: REASON -->`` is skipped; REASON is one
  of ``NO_TEST_REASONS`` (a GPU, several machines, set-up, a server, or minutes of run time).
  A block right after ``<!-- needs: MODULE -->`` (an optional extra; the page's prose says how to
  install it) runs only where MODULE imports; without it the page stops there, skipped with the
  reason, since later blocks may use what that block writes.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests import warm_python
from tests.conftest import warm_bin as conftest_warm_bin

ROOT = Path(__file__).resolve().parents[1]
NO_TEST_REASONS = ("gpu", "several machines", "set-up", "server", "long")
_FENCE = re.compile(r"^(?:<!-- needs: (?P<needs>[\w.]+) -->\n(?:[ \t]*\n)*)?"
                    r"(?P<marker><!-- no-test: (?P<reason>[^>]*?) -->\n(?:[ \t]*\n)*)?"
                    r"```(?P<lang>[\w-]*)[^\n]*\n(?P<body>.*?)^```[ \t]*$", flags=re.S | re.M)
_MARKER = re.compile(r"^<!-- no-test:", flags=re.M)
_NEEDS = re.compile(r"^<!-- needs:", flags=re.M)


@dataclass(frozen=True)
class Snippet:
    """One fenced block of a page: its language, its code, why it is not run (None: it runs), the
    optional module it needs (None: none) and its line."""

    lang: str
    code: str
    skip: str | None
    line: int
    needs: str | None = None


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _snippets(page: Path) -> list[Snippet]:
    text = page.read_text(encoding="utf-8")
    return [Snippet(m["lang"], m["body"], m["reason"], text.count("\n", 0, m.start()) + 1, m["needs"])
            for m in _FENCE.finditer(text)]


def _runnable(page: Path) -> list[Snippet]:
    return [s for s in _snippets(page) if s.lang in ("python", "bash")]


def _name(page: Path) -> str:
    return str(page.relative_to(ROOT))


# ---------------------------------------------------------------- CLI reference
def _generator():
    path = ROOT / "scripts" / "gen_cli_reference.py"
    spec = importlib.util.spec_from_file_location("gen_cli_reference", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cli_reference_is_current(tmp_path):
    gen = _generator()
    out, simulate = tmp_path / "cli.md", tmp_path / "simulate.md"
    simulate.write_text((ROOT / "docs" / "simulate.md").read_text(encoding="utf-8"), encoding="utf-8")
    gen.main(["--output", str(out), "--simulate", str(simulate)])
    committed = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    assert out.read_text(encoding="utf-8") == committed, f"docs/cli.md is out of date: run `{gen.COMMAND}`"
    page = (ROOT / "docs" / "simulate.md").read_text(encoding="utf-8")
    assert simulate.read_text(encoding="utf-8") == page, \
        f"docs/simulate.md's Config keys are out of date: run `{gen.COMMAND}`"


def test_the_config_keys_block_is_refused_when_its_markers_are_gone():
    gen = _generator()
    with pytest.raises(ValueError, match="config-keys"):
        gen.with_config_keys("# a page without the block\n")


def test_cli_reference_has_a_section_per_command():
    from naig_cli.main import app

    text = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    names = [c.name for c in app.registered_commands] + [g.name for g in app.registered_groups]
    assert len(names) >= 4
    for name in names:
        assert re.search(rf"^#+ `naig {re.escape(name)}`$", text, flags=re.M), name


def test_readme_links_every_command_to_its_reference_section():
    """A newcomer goes from the README to any command's full description in one click."""
    from naig_cli.main import app

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for name in [c.name for c in app.registered_commands] + [g.name for g in app.registered_groups]:
        assert f"(docs/cli.md#naig-{name})" in readme, f"README: no link to docs/cli.md#naig-{name}"


def test_readme_links_point_to_files_and_headings_that_exist():
    """The README is not part of the site, so its relative links are checked here (GitHub anchors)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    links = re.findall(r"\]\((?!https?://)([^)#\s]+)(?:#([^)\s]+))?\)", readme)
    assert len(links) >= 10
    for target, anchor in links:
        path = ROOT / target
        assert path.exists(), f"README links to {target}, which does not exist"
        if anchor:
            headings = re.findall(r"^#+ (.+)$", path.read_text(encoding="utf-8"), flags=re.M)
            slugs = {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}
            assert anchor in slugs, f"README links to {target}#{anchor}: no such heading"


# ---------------------------------------------------------------- the site
def _documented_modules() -> dict[str, list[str]]:
    """{api page: modules it documents with ``::: module``}."""
    pages = {}
    for page in sorted((ROOT / "docs" / "api").glob("*.md")):
        modules = re.findall(r"^::: ([\w.]+)\s*$", page.read_text(encoding="utf-8"), flags=re.M)
        if modules:
            pages[page.stem] = modules
    return pages


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    for module in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python"):
        pytest.importorskip(module, reason="the docs extra is not installed: pip install -e '.[docs]'")
    out = tmp_path_factory.mktemp("site")
    # Not --quiet: it hides the warnings from --strict too, and the build then passes with them.
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f",
                        str(ROOT / "mkdocs.yml"), "-d", str(out)], cwd=ROOT, capture_output=True, text=True,
                       timeout=300, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    warnings = [line for line in (r.stdout + r.stderr).splitlines() if line.startswith("WARNING")]
    assert r.returncode == 0 and not warnings, "\n".join(warnings) or r.stderr[-3000:]
    return out


def test_site_builds_strictly_without_warnings(site):
    assert (site / "index.html").is_file() and (site / "cli" / "index.html").is_file()


def test_every_public_name_of_the_documented_modules_is_in_the_api_reference(site):
    pages = _documented_modules()
    assert {"math", "router", "arrivals", "monitor", "distributed"} <= set(pages)
    for page, modules in pages.items():
        html = (site / "api" / page / "index.html").read_text(encoding="utf-8")
        for module in modules:
            try:
                names = importlib.import_module(module).__all__
            except ModuleNotFoundError:  # an object, not a module: naig.arrivals.predict.predict
                parent, _, attr = module.rpartition(".")
                assert hasattr(importlib.import_module(parent), attr), module
                continue
            missing = [n for n in names
                       if not re.search(rf'id="{re.escape(module)}(\.\w+)*\.{re.escape(n)}"', html)]
            assert not missing, f"docs/api/{page}.md: {module}: not documented: {missing}"


# ---------------------------------------------------------------- snippets
def test_the_snippet_markers_are_well_formed():
    for page in _pages():
        text = page.read_text(encoding="utf-8")
        attached = [s for s in _snippets(page) if s.skip is not None]
        assert len(_MARKER.findall(text)) == len(attached), f"{_name(page)}: a no-test marker before no block"
        needing = [s for s in _snippets(page) if s.needs is not None]
        assert len(_NEEDS.findall(text)) == len(needing), f"{_name(page)}: a needs marker before no block"
        for s in attached:
            assert s.skip.split(" (")[0] in NO_TEST_REASONS, f"{_name(page)}:{s.line}: reason {s.skip!r}"
            assert s.lang in ("python", "bash"), f"{_name(page)}:{s.line}: only code blocks are marked"


def test_the_docs_hold_the_snippets_that_left_the_readme():
    """Router, save_gradients, arrivals, the DDP hook and the math still run as snippets (in docs/)."""
    code = "\n".join(s.code for page in _pages() for s in _runnable(page) if s.skip is None)
    for needle in ("naig.Router(", "save_gradients(", "ArrivalClock(", "NaigCommHook(", "fano_fisher_metric(",
                   "Monitor("):
        assert needle in code, needle


# One thread: on a loaded 2-core machine torch's default two threads made a 6 s run take minutes.
_SNIPPET_ENV = {"PYTHONPATH": str(ROOT), "COLUMNS": "100", "NO_COLOR": "1", "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def warm_bin() -> Path:
    """The folder of the ``python`` and ``naig`` shims of this process's ``tests.warm_python`` server,
    once the server is ready."""
    return conftest_warm_bin()


def _run(snippet: Snippet, cwd: Path, where: str, warm_bin: Path) -> None:
    """Run one block in a shell (bash) or as ``python -c``; ``python`` and ``naig`` are the warm ones."""
    if snippet.lang == "python":
        cmd = [str(warm_bin / "python"), "-c", snippet.code]
    else:
        cmd = ["bash", "-e", "-o", "pipefail", "-c", snippet.code]
    tmp = cwd / ".tmp"  # (TMPDIR: what a snippet's tools leave there, torchrun's logs, goes with the folder)
    tmp.mkdir(exist_ok=True)
    r = _shell(cmd, cwd, {**_snippet_env(warm_bin), "TMPDIR": str(tmp)}, timeout=600)
    assert r.returncode == 0, f"{where}: exit {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"


def _snippet_env(warm_bin: Path) -> dict[str, str]:
    """This process's environment, the snippets' settings, the warm shims first on ``PATH``."""
    return {**os.environ, **_SNIPPET_ENV, "PATH": f"{warm_bin}{os.pathsep}{os.environ.get('PATH', '')}",
            **warm_python.run_env(warm_bin)}


def _shell(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    """``subprocess.run`` in a session of its own, all of which is killed on a timeout (the shims with
    it, and so their runs)."""
    with subprocess.Popen(cmd, cwd=cwd, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          start_new_session=True) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.communicate()
            raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def test_the_warm_python_runs_as_the_interpreter_would(tmp_path, warm_bin):
    """Arguments, ``sys.path[0]``, the folder, the environment (``TMPDIR`` too), standard input and
    output, exit statuses (a signal: 128 + N), a SIGTERM sent on to the run, and ``naig`` through the
    shims (``tests.warm_python``)."""
    env = {**_snippet_env(warm_bin), "SEEN": "yes"}
    (tmp_path / "s.py").write_text("import os, sys\nprint(sys.argv, sys.path[0], os.getcwd(),"
                                   " os.environ['SEEN'], sys.stdin.read())\nsys.exit(4)\n")
    (tmp_path / "sig.py").write_text("import signal, sys, time\n"
                                     "signal.signal(signal.SIGTERM,"
                                     " lambda *_: sys.exit(print('graceful') or 5))\n"
                                     "open('ready', 'w').close()\ntime.sleep(60)\n")
    script = """
        set +e
        echo in | python s.py a 'b c'; echo "status $?"
        python -c 'import sys; print(sys.argv, repr(sys.path[0])); sys.exit(3)' x; echo "status $?"
        python -c 'import os, signal; os.kill(os.getpid(), signal.SIGTERM)'; echo "status $?"
        naig simulate --steps 0 2>&1 | tail -1; naig spectrum --help > /dev/null; echo "status $?"
        python -V > /dev/null; echo "status $?"
        mkdir t; TMPDIR=$PWD/t python -c 'import tempfile; print(tempfile.gettempdir() == "'$PWD/t'")'
        python sig.py & run=$!
        for _ in $(seq 600); do [ -e ready ] && break; sleep 0.05; done; kill -TERM $run; wait $run
        echo "status $?"
    """
    r = _shell(["bash", "-c", script], tmp_path, env, timeout=120)
    lines = r.stdout.splitlines()
    assert lines[:6] == [f"['s.py', 'a', 'b c'] {tmp_path} {tmp_path} yes in", "", "status 4",
                         "['-c', 'x'] ''", "status 3", "status 143"], r.stdout + r.stderr
    assert lines[6].startswith("error: --steps 0: ") and lines[7:] == [
        "status 0", "status 0", "True", "graceful", "status 5"], r.stdout + r.stderr


def _pages_to_run() -> list[Path]:
    return [p for p in _pages() if any(s.skip is None for s in _runnable(p))]


@pytest.mark.parametrize("page", _pages_to_run(), ids=_name)
def test_every_snippet_of_the_page_runs_in_order(tmp_path, page, warm_bin):
    (tmp_path / "examples").symlink_to(ROOT / "examples", target_is_directory=True)
    for snippet in _runnable(page):
        where = f"{_name(page)}:{snippet.line}"
        missing = snippet.needs is not None and importlib.util.find_spec(snippet.needs) is None
        if snippet.skip is None and missing:
            pytest.skip(f"{where} and the blocks after it need {snippet.needs}, which is not installed "
                        "(the page says which extra holds it; `.[dev]` holds them all)")
        if snippet.skip is None:
            _run(snippet, tmp_path, where, warm_bin)
