"""Shared fixtures: real safetensors files written with safetensors itself, and a CLI runner."""

from __future__ import annotations

import contextlib
import functools
import gc
import importlib.util
import json
import locale
import multiprocessing
import multiprocessing.context
import multiprocessing.forkserver
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from threadpoolctl import threadpool_limits

from naig.io import save_gradients
from naig.monitor.detectors import null_draws_kept
from tests import cli_child as _cli_child
from tests import warm_python

# numpy's BLAS (OpenBLAS: one thread per core by default) on one thread in each test process and in
# every process it starts, as torch's are there (OMP_NUM_THREADS): the pytest-xdist workers fill the
# cores, and beside a busy process a 100 x 100 solve took 14 ms on two threads, 0.34 ms on one
# (naig.threads). The monitor sets this itself around its own work; this covers the rest.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
_BLAS_LIMIT = threadpool_limits(1, user_api="blas")

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True, scope="session")
def _null_draws_kept() -> Iterator[None]:
    """The test processes build detectors at many false-alarm rates, each walking the pool sizes again:
    every size's null draws are kept (``null_draws_kept``: ~25 MB), not drawn afresh at each (137 times,
    ~8 s of CPU, in test_monitor_detectors.py alone)."""
    with null_draws_kept():
        yield


def run_naig(*args: str | os.PathLike, timeout: float = 300,
             columns: int = 200) -> subprocess.CompletedProcess:
    """Run the real ``naig`` CLI in a child process, as ``python -m naig_cli *args``, capturing output.

    The child is forked from a server process that has imported ``naig_cli`` once (``multiprocessing``'s
    ``forkserver``, preloading ``tests.cli_child``, ``naig_cli.main``, torch, ``torch._dynamo``,
    ``scipy.stats`` and the installed integrations: ``tests.cli_child.preload``): its own process,
    exit status, file descriptors and environment (``os.environ`` plus ``COLUMNS=columns``) as a
    fresh interpreter's, without ~0.7 s of start-up per run, and for a command that trains
    without ~3.4 s of CPU more (importing torch, then ``torch._dynamo``, which torch imports when the
    first optimizer is built; measured on this 2-core machine). Tests of start-up itself (which
    modules a command imports, how long it takes) start their own interpreter.

    Raises:
        subprocess.TimeoutExpired: the run took longer than ``timeout`` seconds (it is killed).
    """
    return run_python("-m", "naig_cli", *args, env={**os.environ, "COLUMNS": str(columns)}, timeout=timeout)


def run_python(*args: str | os.PathLike, env: dict[str, str] | None = None,
               cwd: str | os.PathLike | None = None, timeout: float = 300, memory_cap: int | None = None,
               new_session: bool = False) -> subprocess.CompletedProcess:
    """``subprocess.run([sys.executable, *args], capture_output=True, text=True, ...)`` for ``SCRIPT ARG…``,
    ``-m MODULE ARG…`` or ``-c CODE ARG…``, the child forked from the preloaded server (``run_naig``):
    a process of its own with the interpreter's ``sys.argv`` and ``sys.path[0]``, ``env`` (default
    ``os.environ``) and ``cwd``, standard input /dev/null, without the interpreter's and torch's
    start-up. torch's threads follow ``OMP_NUM_THREADS`` in ``env`` where it is set, and naig_cli's
    consoles its ``COLUMNS`` and ``NO_COLOR``; what else the preloaded modules (``naig_cli.main``,
    torch) read when the server imported them stays as they read it, so a test of what start-up
    reads or imports starts its own interpreter.
    The interpreters the run starts with ``sys.executable`` or torchrun (a ``LocalCluster``'s ranks,
    torchrun's, Lightning's) are forked too, from ``tests.warm_python``'s server (``run_env`` in
    ``env``), but for a run with a ``memory_cap``, whose limit that server's runs would not carry.
    ``memory_cap``: ``RLIMIT_AS`` bytes in the child; ``new_session``: ``start_new_session=True``
    (on a timeout the whole process group is killed; the result's ``pid`` is the group's id).

    Raises:
        subprocess.TimeoutExpired: the run took longer than ``timeout`` seconds (it is killed; the
            exception holds what it wrote).
    """
    args = [str(a) for a in args]
    cmd = [sys.executable, *args]
    env = dict(os.environ if env is None else env)
    if memory_cap is None:  # (the server's runs would not carry the cap)
        env.update(warm_python.run_env(warm_bin()))
    with tempfile.TemporaryDirectory(prefix="naig-py-") as tmp:
        out, err = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
        where = str(cwd or os.getcwd())
        p = _cli_context().Process(target=_cli_child.run_python,
                                   args=(args, env, where, out, err, memory_cap, new_session))
        p.start()
        p.join(timeout)
        timed_out = p.exitcode is None
        if timed_out:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, 9) if new_session else p.kill()
            p.join()
        enc = locale.getpreferredencoding(False)  # what subprocess.run(text=True) decodes with
        stdout, stderr = Path(out).read_text(enc), Path(err).read_text(enc)
        if timed_out:
            raise subprocess.TimeoutExpired(cmd, timeout, stdout, stderr)
    done = subprocess.CompletedProcess(cmd, p.exitcode, stdout, stderr)
    done.pid = p.pid  # (with new_session, the id of the child's process group)
    return done


@functools.cache
def warm_bin() -> Path:
    """The shims' folder of this process's ``tests.warm_python`` server, waited for once: every run's
    interpreters are then its runs (a run that found no server yet would start fresh ones, which see
    another ``sys.path``)."""
    folder = warm_python.start(ROOT, _cli_context())
    assert warm_python.ready(folder, timeout=120), "the warm server did not start within 120 s"
    return folder


@functools.cache
def _cli_context() -> multiprocessing.context.BaseContext:
    """The forkserver, started once, in the repository's folder (a test's temporary folder marks the
    processes of its runs: ``leftover_processes``)."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(_cli_child.preload())
    with contextlib.chdir(ROOT):
        multiprocessing.forkserver.ensure_running()
    return ctx


def needs(module: str, why: str) -> None:
    """Skip the calling test (at module level: the module) with ``why`` when the optional top-level
    ``module`` is not installed. It is not imported (``pytest.importorskip`` imports it: 1.7 s of CPU
    for lightning.pytorch, in a process where the test only starts others that use it), so an extra
    installed but broken fails its tests, with the import error, instead of skipping them."""
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed: {why}", allow_module_level=True)


def default_sigint() -> None:
    """``preexec_fn`` for a child that is sent SIGINT as a Ctrl-C: the default handler, even when
    the tests run with SIGINT ignored (a background job of a non-interactive shell inherits SIG_IGN,
    and Python then installs no KeyboardInterrupt handler)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def warning_lines(r: subprocess.CompletedProcess) -> list[str]:
    """The lines of ``r.stderr`` but the one that says the C sketch kernel is not built (a machine
    without a C compiler at install time prints it on every audit that reads data; the numbers are
    the same)."""
    from naig_cli._common import kernel_notice

    notice = kernel_notice()
    return [ln for ln in r.stderr.splitlines() if notice is None or ln != f"warning: {notice}"]


_PROGRESS = re.compile(r" steps/s( \(run \d+ of \d+\))?$")  # simulate's progress lines without a terminal


def assert_one_line_error(r: subprocess.CompletedProcess, code: int, *needles: str) -> None:
    """Exit ``code``, stderr is one line starting with 'error: ' and naming ``needles`` (warnings and
    progress lines aside)."""
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    lines = [ln for ln in r.stderr.splitlines()
             if not ln.startswith("warning: ") and not _PROGRESS.search(ln)]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert "Traceback" not in r.stderr
    for n in needles:
        assert n in lines[0], (n, lines[0])


def make_state(seed: int, scale: float = 1.0, dtype: torch.dtype = torch.float32) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        "layer.weight": (scale * torch.randn(40, 30, generator=g)).to(dtype),
        "layer.bias": (scale * torch.randn(30, generator=g)).to(dtype),
        "head.weight": (scale * torch.randn(7, 40, generator=g)).to(dtype),
    }


@pytest.fixture
def grads_dir(tmp_path: Path) -> Path:
    """ref.safetensors plus three workers (lags 0, 10, 20) drifting away from it."""
    root = tmp_path / "inputs"
    ref = make_state(0)
    save_gradients(root / "ref.safetensors", ref, step=5, worker="ref")
    wdir = root / "workers"
    for k, lag in enumerate((0, 10, 20)):
        noise = make_state(100 + k, scale=0.1 * k)
        state = {n: ref[n] + noise[n] for n in ref}
        save_gradients(wdir / f"w{k}.safetensors", state, lag=lag, step=5, worker=k)
    return root


# One-process groups (a DDP or FSDP model in the test's own process)
@contextlib.contextmanager
def process_group_in_this_process(backend: str = "gloo", world: int = 1) -> Iterator[None]:
    """The default group over this process alone (``gloo``, world 1; ``fake``: any world, no
    communication), destroyed on exit once every piece of work on it has finished.

    torch 2.13's gloo joins its threads with the GIL held when its last reference goes (from a DDP
    reducer freed after the test), while a thread that is still completing a work item needs the
    GIL to free the item's Python callback (a communication hook's ``then``): a deadlock, seen once
    in the suite. So the objects left behind are collected and the queue drained (a barrier waits
    for all earlier work) while the group is alive, and the threads are given the GIL for a moment.
    """
    if backend == "fake":
        from torch.testing._internal.distributed.fake_pg import FakeStore

        dist.init_process_group("fake", rank=0, world_size=world, store=FakeStore())
    else:
        dist.init_process_group(backend, rank=0, world_size=world, store=dist.HashStore())
    try:
        yield
    finally:
        gc.collect()
        if backend != "fake":
            dist.barrier()
            time.sleep(0.05)
        dist.destroy_process_group()


# Distributed engine (naig.distributed)
def leftover_processes(marker: str) -> list[str]:
    """Command lines of live processes (this one excepted) that mention ``marker`` or work in a folder
    whose path does.

    Tests that start processes give them a marker (their temporary directory, on the command line or
    as the working directory) and check that none outlives the test. A run forked by ``run_python``
    has the forkserver's command line, and so has whatever it forks without exec; the working
    directory, which they inherit, is what marks them.
    """
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            cwd = os.readlink(proc / "cwd")
        except OSError:
            continue
        if marker in cmd or marker in cwd:
            found.append(f"{proc.name}: {cmd} (in {cwd})")
    return found


def process_alive(pid: int) -> bool:
    """True while process ``pid`` exists and is not a zombie (exited, not yet reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split()[2] != "Z"


def assert_no_leftovers(marker: str, wait: float = 10.0, what: str = "a process of the run") -> None:
    """Wait up to ``wait`` seconds for every process ``leftover_processes(marker)`` finds to end (an
    orphan notices its parent is gone within a second), then fail naming those still alive."""
    deadline = time.monotonic() + wait
    while leftover_processes(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = leftover_processes(marker)
    assert not left, f"{what} is still alive: {left}"


def run_ranks(module: str, tmp: Path, timeout: float) -> dict:
    """Run the rank script ``module`` (``python -m module OUT.json``) as ``WORLD`` ranks, with its
    temporary files in ``tmp``; assert every rank succeeded and none is left; return the JSON rank 0
    wrote.

    The ranks work in ``tmp`` (so that ``leftover_processes`` finds what they leave) and are started
    as ``torchrun`` starts them (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
    ``MASTER_PORT`` in their environment; the script's ``process_group`` joins that group), each
    forked from the CLI's server process (``run_naig``), which has imported torch already: ~3.4 s
    of CPU saved per rank. The rendezvous store is this process's. ``WORLD`` is read from the
    script's source (its module-level ``WORLD`` assignment).
    """
    out = tmp / "out.json"
    world = _world_of(module)
    store = dist.TCPStore("127.0.0.1", 0, world, True, wait_for_workers=False)
    base = {**os.environ, "TMPDIR": str(tmp), "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(store.port), "NAIG_DISTRIBUTED_STORE": "1",
            "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // world))}
    ctx = _cli_context()
    procs = [ctx.Process(target=_cli_child.run_rank,
                         args=(module, [str(out)], {**base, "RANK": str(r), "LOCAL_RANK": str(r)},
                               str(tmp), str(tmp / f"rank{r}.log")))
             for r in range(world)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout
    try:
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    assert_no_leftovers(str(tmp), what=f"{module}: a process of the ranks")  # (they work in tmp)
    failed = {r: p.exitcode for r, p in enumerate(procs) if p.exitcode != 0}
    logs = {r: log.read_text(errors="replace")[-3000:] if (log := tmp / f"rank{r}.log").exists()
            else "(no log)" for r in failed}
    assert not failed, f"{module}: ranks {failed} (exit codes; -9: killed after {timeout} s)\n" + "\n".join(
        f"--- rank {r}\n{logs[r]}" for r in failed)
    return json.loads(out.read_text())


def _world_of(module: str) -> int:
    """The int a rank script assigns to ``WORLD`` at module level (``WORLD = 3`` or ``WORLD, X = 3, …``)."""
    import ast
    import importlib.util

    tree = ast.parse(Path(importlib.util.find_spec(module).origin).read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
            names = [target] if isinstance(target, ast.Name) else getattr(target, "elts", [])
            values = [value] if isinstance(target, ast.Name) else getattr(value, "elts", [])
            for name, v in zip(names, values, strict=False):
                if isinstance(name, ast.Name) and name.id == "WORLD" and isinstance(v, ast.Constant):
                    return int(v.value)
    raise AssertionError(f"{module}: no module-level WORLD = <int>")


def flagged_steps(run: dict) -> dict[int, list[list[float]]]:
    """{step: each rank's view of the flag mask} for the steps of a monitor rank script's ``run``
    (its ``flagged``: per step, per rank, per rank a 0/1) where any rank saw a flag."""
    return {i + 1: views for i, views in enumerate(run["flagged"]) if any(any(v) for v in views)}


@pytest.fixture
def float64() -> Iterator[None]:
    """Build models in float64 (torch's default dtype for the test), so that identities between two
    computations of the same update hold to float64 rounding; the old default is restored after."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(old)
