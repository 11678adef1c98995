"""A warm ``python`` and ``naig`` for shell snippets: each run forked from a server that imported torch once.

tests/test_docs.py runs every ```bash and ```python block of the docs as a user would, in a shell;
most of those commands are ``naig …`` or ``python …``, and a fresh interpreter pays ~1 s importing
torch and ~1 s more for ``torch._dynamo`` (which torch imports when the first optimizer is built)
before doing anything. Here a server (``python -m tests.warm_python SOCKET``, started with the
snippets' environment) imports them, with ``naig_cli.main``, once; ``shims(folder)`` writes two
small programs, ``python`` and ``naig``, to put first on ``PATH``. Each sends its arguments,
environment, working directory and descriptors 0-2 to the server over the Unix socket named by
``NAIG_TEST_WARM_SOCKET``; the server forks a handler, which forks the run (``tests.cli_child.execute``:
``sys.argv``, ``sys.path``, ``__main__`` as the interpreter sets them, torch's threads from
``OMP_NUM_THREADS``) in a process group of its own, waits for it and sends back its exit status
(128 + N when signal N ended it), which the shim exits with. SIGINT, SIGTERM and SIGHUP sent to a
shim are sent on to its run; a shim that dies (SIGKILL on a timeout) closes its socket, and the
handler kills the run's group. Not carried over: the shim's resource limits and umask (the
server's apply). What the server cannot run as the interpreter would (``python`` with an option other than
``-m`` or ``-c``, or no argument) the ``python`` shim hands to the real interpreter, and so do both
shims without a server. The programs the runs start (``torchrun``, a rank, ``sys.executable``) are
fresh interpreters, as always.

Only the standard library is imported at module level: the shims start with ``python -S``.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import select
import signal
import socket
import stat
import struct
import sys
from pathlib import Path

__all__ = ["SOCKET_VAR", "main", "serve", "shims"]

SOCKET_VAR = "NAIG_TEST_WARM_SOCKET"
_HEADER = struct.Struct("!Q")
_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def shims(folder: Path, root: Path) -> Path:
    """Write the ``python`` and ``naig`` shims into ``folder`` (created) and return it."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, prefix in (("python", []), ("naig", ["-m", "naig_cli"])):
        shim = folder / name
        shim.write_text(f"#!{sys.executable} -S\nimport sys\nsys.path.insert(0, {str(root)!r})\n"
                        f"from tests.warm_python import main\nmain({prefix!r})\n")
        shim.chmod(shim.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return folder


def main(prefix: list[str]) -> None:
    """A shim's body: run ``python *prefix *sys.argv[1:]`` on the server, exit with its status."""
    from tests.cli_child import python_target  # (the standard library only, as here)

    args = [*prefix, *sys.argv[1:]]
    path = os.environ.get(SOCKET_VAR)
    try:
        python_target(args)
    except ValueError:  # an option or a session the server does not run
        path = None
    if not path:
        os.execv(sys.executable, [sys.executable, *args])
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(path)
    body = json.dumps({"args": args, "env": dict(os.environ), "cwd": os.getcwd()}).encode()
    socket.send_fds(conn, [_HEADER.pack(len(body))], [0, 1, 2])
    conn.sendall(body)
    for sig in _FORWARDED:  # delivered to the run, which decides what they do
        signal.signal(sig, lambda number, _frame: conn.send(bytes([number])))
    reply = b""
    while chunk := conn.recv(64):
        reply += chunk
    if not reply:
        sys.exit(f"tests.warm_python: the server at {path} sent no exit status for python {' '.join(args)}")
    sys.exit(int(reply))


def serve(path: str) -> None:
    """Import ``tests.cli_child.PRELOAD`` (torch, ``torch._dynamo``, ``scipy.stats``, ``naig_cli.main``),
    then serve runs on the socket ``path`` (created last, so that it existing means the server is
    ready) until killed."""
    from tests.cli_child import PRELOAD

    for name in PRELOAD:
        importlib.import_module(name)

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path + ".tmp")
    listener.listen(64)
    os.rename(path + ".tmp", path)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # handlers are reaped by the kernel
    while True:
        conn, _ = listener.accept()
        if os.fork() == 0:
            listener.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            try:
                _handle(conn)
            finally:
                os._exit(0)
        conn.close()


def _handle(conn: socket.socket) -> None:
    """Receive one request, fork its run, answer with the run's exit status."""
    head, fds, _, _ = socket.recv_fds(conn, _HEADER.size, 3)
    head += _receive(conn, _HEADER.size - len(head))
    req = json.loads(_receive(conn, _HEADER.unpack(head)[0]))
    pid = os.fork()
    if pid == 0:
        from tests.cli_child import execute, python_target

        conn.close()
        os.setpgid(0, 0)  # the run and what it starts: one group, killed whole if the shim dies
        for fd, src in enumerate(fds):
            os.dup2(src, fd)
        for src in fds:
            os.close(src)
        try:
            execute(python_target(req["args"]), req["env"], req["cwd"])
        except BaseException:  # (execute exits itself; this is a failure to start the run)
            import traceback

            traceback.print_exc()
        os._exit(1)
    for src in fds:
        os.close(src)
    conn.sendall(str(_wait(pid, conn)).encode())


def _receive(conn: socket.socket, size: int) -> bytes:
    """Exactly ``size`` bytes from ``conn``.

    Raises:
        EOFError: the shim closed its end first.
    """
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise EOFError(f"{len(data)} of {size} bytes")
        data += chunk
    return data


def _wait(pid: int, conn: socket.socket) -> int:
    """The exit status of ``pid`` (128 + N after signal N). A byte from ``conn`` is a signal the shim
    received, sent on to ``pid``; if ``conn`` closes first, ``pid``'s process group is killed."""
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            code = os.waitstatus_to_exitcode(status)
            return 128 - code if code < 0 else code
        readable, _, _ = select.select([conn], [], [], 0.02)
        if not readable:
            continue
        sent = conn.recv(1)
        if sent:  # a signal the shim received
            os.kill(pid, sent[0])
            continue
        with contextlib.suppress(ProcessLookupError):  # the shim is gone
            os.killpg(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        return 137


if __name__ == "__main__":
    serve(sys.argv[1])
