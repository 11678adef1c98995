"""The body of one ``naig`` CLI run in a child forked from a preloaded server (``tests.conftest.run_naig``).

It imports nothing heavy itself: the server preloads ``naig_cli.main`` (and with it numpy, typer,
rich) and torch (with ``torch._dynamo``, which the first optimizer imports), so each child starts
with them imported instead of paying interpreter start and imports (~0.7 s, and ~3.4 s of CPU more
for a command that trains). torch reads no setting of the environment the child replaces when it
is imported: the commands set its threads themselves (``--threads``).
"""

from __future__ import annotations

import os
import runpy
import sys

__all__ = ["run_cli", "run_rank"]


def run_cli(args: list[str], env: dict[str, str], cwd: str, out_path: str, err_path: str) -> None:
    """Run ``python -m naig_cli *args`` in this (forked) process and exit with its exit status.

    Standard input is /dev/null; standard output and error go to the files ``out_path`` and
    ``err_path`` (file descriptors 1 and 2, so children of the CLI write there too); the
    environment is replaced by ``env`` and the working directory by ``cwd``.
    """
    _run_module("naig_cli", ["-m", *args], env, cwd, out_path, err_path)


def run_rank(module: str, argv: list[str], env: dict[str, str], cwd: str, log_path: str) -> None:
    """Run ``python -m module *argv`` as one rank (``env`` holds RANK, WORLD_SIZE, MASTER_ADDR, …) in this
    (forked) process, its output to ``log_path``, and exit with its exit status.

    As a launcher's child would: one torch thread (``OMP_NUM_THREADS`` in ``env`` is read by torch
    at import, which the server did before), standard input /dev/null.
    """
    import torch

    torch.set_num_threads(int(env.get("OMP_NUM_THREADS", "1")))
    _run_module(module, [module, *argv], env, cwd, log_path, log_path)


def _run_module(module: str, argv: list[str], env: dict[str, str], cwd: str, out_path: str,
                err_path: str) -> None:
    """``runpy`` ``module`` as ``__main__`` with ``sys.argv = argv``, after replacing the environment,
    the working directory and descriptors 0-2 (/dev/null, ``out_path``, ``err_path``: one file when
    they are the same path); exit with its status (an uncaught exception: traceback, status 1)."""
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    out = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    err = out if err_path == out_path else os.open(err_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    for fd, f in ((1, out), (2, err)):
        os.dup2(f, fd)
    for f in {out, err}:
        os.close(f)
    sys.stdin = open(0, closefd=False)  # the process's own descriptors
    sys.stdout = open(1, "w", closefd=False)
    sys.stderr = open(2, "w", closefd=False)
    sys.argv = argv
    code: object = 0
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code
    except BaseException:  # reported as Python reports an uncaught one
        import traceback

        traceback.print_exc()
        code = 1
    if code is None:
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
