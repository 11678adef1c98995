"""The body of one ``naig`` CLI run in a child forked from a preloaded server (``tests.conftest.run_naig``).

It imports nothing heavy itself: the server preloads ``naig_cli.main`` (and with it numpy, typer,
rich), torch (with ``torch._dynamo``, which the first optimizer imports) and ``scipy.stats`` (which
audit, staleness and the simulate reports import when they run), so each child starts with them
imported instead of paying interpreter start and imports (~0.7 s, ~0.55 s more for scipy.stats,
and ~3.4 s of CPU more for a command that trains). The server's objects are frozen out of the
child's garbage collector (``gc.freeze``): a collection would otherwise walk them all, and so copy
every page the fork shares (~0.15 s per run measured with torch loaded). What torch would read
from the environment at import, its threads (``OMP_NUM_THREADS``), ``execute`` sets from the run's
environment.
"""

from __future__ import annotations

import atexit
import gc
import os
import runpy
import signal
import sys
import tempfile
import threading
import types

from tests import warm_python  # (the standard library only, as here)

__all__ = ["PRELOAD", "execute", "preload", "python_target", "run_python", "run_rank"]

sys.dont_write_bytecode = False  # (the root conftest's setting: a server started under a pytest process
# that read PYTHONDONTWRITEBYTECODE, `-n 0`, inherits the flag; its runs then cache bytecode too)

PRELOAD = ("tests.cli_child", "naig_cli.main", "torch", "torch._dynamo", "scipy.stats")
"""What a server imports before it forks runs (``tests.conftest``'s forkserver, ``tests.warm_python``)."""


def preload() -> list[str]:
    """The modules a server imports before it forks runs: ``PRELOAD``, then ``tests.preload_extras``
    (the installed optional integrations that import: ``tests.preload_extras.OPTIONAL``)."""
    return [*PRELOAD, "tests.preload_extras"]


def run_rank(module: str, argv: list[str], env: dict[str, str], cwd: str, log_path: str) -> None:
    """Run ``python -m module *argv`` as one rank (``env`` holds RANK, WORLD_SIZE, MASTER_ADDR, …,
    and OMP_NUM_THREADS) in this (forked) process, its output to ``log_path``, standard input
    /dev/null, and exit with its exit status."""
    run_python(["-m", module, *argv], env, cwd, log_path, log_path)


def run_python(args: list[str], env: dict[str, str], cwd: str, out_path: str, err_path: str,
               memory_cap: int | None = None, new_session: bool = False) -> None:
    """Run ``python *args`` (``SCRIPT ARG…``, ``-m MODULE ARG…`` or ``-c CODE ARG…``) in this (forked)
    process, as the interpreter would, and exit with its exit status.

    torch's intra-op threads are set from ``OMP_NUM_THREADS`` in ``env`` when it is there (a fresh
    interpreter reads it when importing torch, which the server did before). ``memory_cap``: bytes
    of address space (``RLIMIT_AS``) from here on; ``new_session``: the child leads a new session
    and process group (``start_new_session=True``), so that a test can kill all it started.

    Raises:
        ValueError: ``args`` asks for something else of the interpreter (an option, an
            interactive session).
    """
    if new_session:
        os.setsid()
    if memory_cap is not None:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (memory_cap, memory_cap))
    _run(python_target(args), env, cwd, out_path, err_path)


def python_target(args: list[str]) -> tuple[str, str, list[str]]:
    """(how, what, sys.argv) for ``python *args``: ``module``, ``code`` or ``path``."""
    if args[:1] == ["-m"] and len(args) > 1:
        return "module", args[1], ["-m", *args[2:]]
    if args[:1] == ["-c"] and len(args) > 1:
        return "code", args[1], ["-c", *args[2:]]
    if args and not args[0].startswith("-"):
        return "path", args[0], list(args)
    raise ValueError(f"python {' '.join(args)}: only SCRIPT, -m MODULE or -c CODE runs forked")


def _run(target: tuple[str, str, list[str]], env: dict[str, str], cwd: str, out_path: str,
         err_path: str) -> None:
    """``execute`` ``target`` with standard input /dev/null and output to ``out_path`` and ``err_path``
    (one file when they are the same path)."""
    null = os.open(os.devnull, os.O_RDONLY)
    out = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    err = out if err_path == out_path else os.open(err_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    for fd, f in ((0, null), (1, out), (2, err)):
        os.dup2(f, fd)
    for f in {null, out, err}:
        os.close(f)
    execute(target, env, cwd)


def execute(target: tuple[str, str, list[str]], env: dict[str, str], cwd: str) -> None:
    """Run ``target`` (``python_target``: how, what, ``sys.argv``) as ``__main__`` on descriptors 0-2 as
    they are, after replacing the environment and the working directory; exit with its status.

    As the interpreter does: ``sys.path`` starts with the script's folder (a path), ``''`` (``-c``) or
    the working directory (``-m``), then ``PYTHONPATH``'s entries; ``-c`` code runs in a new
    ``__main__`` module; temporary files go under ``TMPDIR``; stderr escapes what it cannot encode
    (``backslashreplace``) and ``PYTHONUNBUFFERED`` writes through; with ``tests.warm_python.run_env``
    in ``env``, ``sys.executable`` is its ``python`` shim (the interpreters the run starts are forked
    from that server too); an uncaught exception prints its
    traceback and exits 1, an uncaught ``KeyboardInterrupt`` ends the process by SIGINT; at the end
    the non-daemon threads are joined and the ``atexit`` functions run; naig_cli's consoles read this
    environment (``COLUMNS``, ``NO_COLOR``, and what else rich reads when a console is made). What
    else the server read when it imported its modules (``OMP_NUM_THREADS`` for torch, submodules
    already imported) stays as it read it: tests of start-up start an interpreter.
    """
    how, what, argv = target
    gc.freeze()  # (the server's objects: a collection would walk, and so copy, every page of them)
    if "OMP_NUM_THREADS" in env:  # (a fresh interpreter's torch reads it at import)
        import torch

        torch.set_num_threads(int(env["OMP_NUM_THREADS"]))
    os.environ.clear()
    os.environ.update(env)
    if env.get(warm_python.SOCKET_VAR) and env.get(warm_python.EXEC_VAR):  # warm_python.run_env
        sys.executable = env[warm_python.EXEC_VAR]
    os.chdir(cwd)
    tempfile.tempdir = None  # (the server's imports cached its TMPDIR)
    _fresh_consoles()
    unbuffered = bool(env.get("PYTHONUNBUFFERED"))
    sys.stdin = open(0, closefd=False)  # the process's own descriptors
    sys.stdout = open(1, "w", closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False, errors="backslashreplace")  # line-buffered
    for stream in (sys.stdout, sys.stderr) if unbuffered else ():
        stream.reconfigure(write_through=True)
    sys.argv = argv
    first = {"path": os.path.dirname(os.path.abspath(what)), "code": "", "module": os.getcwd()}[how]
    sys.path[:0] = [first, *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]]
    code = _main(how, what)
    try:
        threading._shutdown()  # type: ignore[attr-defined]  (what the interpreter does at exit)
        atexit._run_exitfuncs()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    if code == -signal.SIGINT:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code)


def _fresh_consoles() -> None:
    """naig_cli's consoles (imported by the server) as a fresh import would build them from this
    run's environment: its ``COLUMNS``, ``NO_COLOR`` and ``TERM``; every module holds the same objects."""
    common = sys.modules.get("naig_cli._common")
    if common is not None:
        for console, fresh in zip((common.stdout, common.stderr), common.consoles(), strict=True):
            console.__dict__.update(fresh.__dict__)


def _main(how: str, what: str) -> int:
    """Run the module, path or code as ``__main__``; its exit status (``-SIGINT``: an uncaught
    ``KeyboardInterrupt``)."""
    code: object = 0
    try:
        if how == "module":
            runpy.run_module(what, run_name="__main__", alter_sys=True)
        elif how == "path":
            runpy.run_path(what, run_name="__main__")
        else:
            main = types.ModuleType("__main__")
            sys.modules["__main__"] = main
            exec(compile(what, "<string>", "exec"), main.__dict__)
    except SystemExit as exc:
        code = exc.code
    except BaseException as exc:  # reported as Python reports an uncaught one
        import traceback

        traceback.print_exc()
        code = -signal.SIGINT if isinstance(exc, KeyboardInterrupt) else 1
    if code is None:
        return 0
    if not isinstance(code, int):
        print(code, file=sys.stderr)
        return 1
    return code
