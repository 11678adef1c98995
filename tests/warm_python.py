"""A warm ``python`` and ``naig`` for shell snippets: each run forked from a server that imported torch once.

tests/test_docs.py runs every ```bash and ```python block of the docs as a user would, in a shell; most
of those commands are ``naig …`` or ``python …``, and a fresh interpreter pays ~1 s importing torch and
~1 s more for ``torch._dynamo`` (which torch imports when the first optimizer is built) before doing
anything. Here a server (``start`` forks one per test process from the tests' forkserver, which imported
them, with ``naig_cli.main``, once; with that process's environment, on first use; ``python -m
tests.warm_python SOCKET`` runs one alone); ``shims(folder)`` writes two small programs, ``python`` and
``naig``, to put first on ``PATH``. Each sends its arguments, environment, working directory, the
forwarded signals it ignores and descriptors 0-2 to the server over the Unix socket named by
``NAIG_TEST_WARM_SOCKET``; the server forks a handler, which forks the run (``tests.cli_child.execute``:
``sys.argv``, ``sys.path``, ``__main__`` as the interpreter sets them, torch's threads from
``OMP_NUM_THREADS``) in a process group of its own, waits for it and sends back its exit status (−N when
signal N ended it: the shim then ends by signal N, so whatever started it sees what an interpreter would
give). SIGINT, SIGTERM and SIGHUP sent to a shim are sent on to its run; a shim that dies (SIGKILL on a
timeout) closes its socket, and the handler kills the run's group. Not carried over: the shim's resource
limits and umask (the server's apply). What the server cannot run as the interpreter would (``python``
with an option other than ``-u``, ``-m`` or ``-c``, or no argument) the ``python`` shim hands to the
real interpreter, and so do both shims while there is no server (not started yet, or gone).

The runs of ``tests.conftest.run_python`` get ``run_env()`` in their environment:
``tests.cli_child.execute`` then makes the ``python`` shim the run's ``sys.executable``, and torch's
launcher reads it from ``PYTHON_EXEC``, so the ranks that a ``LocalCluster``, ``torchrun`` or
Lightning starts inside a run are forked here too, instead of paying ~3 s of CPU each to import
torch and ``torch._dynamo`` afresh. For them the ``python`` shim takes ``-u`` (torchrun's) and keeps
``naig.launch``'s parent watch: a shim whose environment names its parent
(``NAIG_DISTRIBUTED_PARENT``) exits when that parent is gone, and the handler then kills the run,
whose own watch is pointed at the handler.

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

__all__ = ["EXEC_VAR", "PARENT_VAR", "SOCKET_VAR", "main", "ready", "run_env", "serve", "shims", "start"]

SOCKET_VAR = "NAIG_TEST_WARM_SOCKET"
EXEC_VAR = "PYTHON_EXEC"  # torchrun's override of its ranks' interpreter; a run takes it as sys.executable
PARENT_VAR = "NAIG_DISTRIBUTED_PARENT"  # naig.launch.ENV_PARENT (not imported: it imports torch)
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
    """A shim's body: run ``python *prefix *sys.argv[1:]`` on the server, exit as the run did."""
    from tests.cli_child import python_target  # (the standard library only, as here)

    args = [*prefix, *sys.argv[1:]]
    env = dict(os.environ)
    if args[:1] == ["-u"]:  # (torchrun starts its ranks with it)
        args, env["PYTHONUNBUFFERED"] = args[1:], "1"
    try:
        python_target(args)
        conn = _connect(env.get(SOCKET_VAR))
    except (ValueError, OSError):  # an option the server does not run, or no server (yet)
        conn = None
    if conn is None:
        os.execv(sys.executable, [sys.executable, *prefix, *sys.argv[1:]])
    if env.get(PARENT_VAR) == str(os.getppid()):  # (a variable inherited from further up is not ours)
        _watch_parent(os.getppid())
    elif PARENT_VAR in env and not _exists(int(env[PARENT_VAR])):  # the parent died as we started
        sys.exit(1)
    ignored = [int(sig) for sig in _FORWARDED if signal.getsignal(sig) == signal.SIG_IGN]  # the run's too
    body = json.dumps({"args": args, "env": env, "cwd": os.getcwd(), "ignored": ignored}).encode()
    socket.send_fds(conn, [_HEADER.pack(len(body))], [0, 1, 2])
    conn.sendall(body)
    for sig in _FORWARDED:  # delivered to the run, which decides what they do (unless it has ended)
        signal.signal(sig, lambda number, _frame: _forward(conn, number))
    reply = b""
    with contextlib.suppress(ConnectionResetError):  # (a forwarded signal met the end of the run)
        while chunk := conn.recv(64):
            reply += chunk
    if not reply:
        sys.exit(f"tests.warm_python: the server sent no exit status for python {' '.join(args)}")
    _exit_as(int(reply))


def _forward(conn: socket.socket, number: int) -> None:
    """Send signal ``number`` on to the run; a run that has just ended gets none."""
    with contextlib.suppress(OSError):
        conn.send(bytes([number]))


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _connect(path: str | None) -> socket.socket | None:
    """A connection to the server at ``path``; None when there is none (no path).

    Raises:
        OSError: nothing listens there (not yet started, or gone).
    """
    if not path:
        return None
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
    except OSError:
        conn.close()
        raise
    return conn


def _watch_parent(parent: int) -> None:
    """Exit (status 1, closing the connection: the handler then kills the run) once ``parent`` is no
    longer this process's parent, as ``naig.launch.watch_parent`` makes a rank do."""
    import threading
    import time

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.2)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def _exit_as(code: int) -> None:
    """Exit with ``code``, or end by signal −``code`` when it is negative (as the run ended)."""
    if code < 0:
        if -code in _FORWARDED:  # (our forwarding handler; SIGKILL and the like have none to reset)
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    sys.exit(128 - code if code < 0 else code)


def start(root: Path, ctx: object) -> Path:
    """This process's server (started on the first call, in ``root``, with this process's environment;
    not waited for: a shim finding no server yet runs the real interpreter) and its shims' folder.

    The server is forked from ``ctx``, a ``multiprocessing`` forkserver context whose server imported
    ``tests.cli_child.preload()`` (``tests.conftest``'s): ~7 s of CPU less than a fresh interpreter
    importing them. It ends when this process does (killed at exit), or, this process killed, with
    the forkserver (its own watch of its parent; a forkserver killed while still importing them
    forks the server it was asked for first, and both end once it has: 5-8 s).
    """
    global _STARTED
    if _STARTED is None:
        import atexit
        import shutil
        import tempfile

        folder = Path(tempfile.mkdtemp(prefix="naig-warm-"))
        server = ctx.Process(target=_serve_forked, args=(str(folder / "socket"), dict(os.environ), str(root)))
        server.start()
        _STARTED = shims(folder / "bin", root)
        # (registered after multiprocessing's own exit function, so run before it joins its children)
        atexit.register(lambda: (server.kill(), server.join(), shutil.rmtree(folder, ignore_errors=True)))
    return _STARTED


def _serve_forked(path: str, env: dict[str, str], cwd: str) -> None:
    """``serve`` as ``start``'s server: in a session of its own (a Ctrl-C to the tests is not its), with
    ``env`` and ``cwd``, watching the forkserver that forked it. It lets go of the forkserver's and the
    resource tracker's descriptors, which each stays up while a process holds them: held by this
    process, which waits for the forkserver to go, neither would end when the tests' process is killed
    (a run or rank of this server that wants either starts its own)."""
    from multiprocessing import forkserver, resource_tracker

    for owner, attrs in ((forkserver._forkserver, ("_forkserver_alive_fd", "_forkserver_address",
                                                   "_forkserver_pid")),
                         (resource_tracker._resource_tracker, ("_fd", "_pid"))):
        if getattr(owner, attrs[0]) is not None:
            os.close(getattr(owner, attrs[0]))
        for attr in attrs:
            setattr(owner, attr, None)
    os.setsid()
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    serve(path, os.getppid())


_STARTED: Path | None = None


def ready(bin_folder: Path, timeout: float) -> bool:
    """Wait up to ``timeout`` seconds for the server of ``bin_folder`` to listen; True once it does."""
    import time

    deadline = time.monotonic() + timeout
    while not (bin_folder.parent / "socket").exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def run_env(bin_folder: Path) -> dict[str, str]:
    """What a run's environment needs for the interpreters it starts to be this server's runs."""
    return {SOCKET_VAR: str(bin_folder.parent / "socket"), EXEC_VAR: str(bin_folder / "python")}


def serve(path: str, parent: int | None = None) -> None:
    """Import ``tests.cli_child.preload()`` (torch, ``torch._dynamo``, ``scipy.stats``, ``naig_cli.main``;
    Lightning, transformers' Trainer and Accelerate where installed and importable), then serve runs on
    the socket ``path`` (created last, so that it existing means the server is ready) until killed, or
    until ``parent`` (a pid) is no longer its parent."""
    from tests.cli_child import preload

    if parent is not None:
        _watch_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server and its handlers; each run sets its own
    for name in preload():
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
    if PARENT_VAR in req["env"]:  # the run's parent watch watches this handler (the shim watches its own)
        req["env"][PARENT_VAR] = str(os.getpid())
    pid = os.fork()
    if pid == 0:
        from tests.cli_child import execute, python_target

        conn.close()
        os.setpgid(0, 0)  # the run and what it starts: one group, killed whole if the shim dies
        for sig in _FORWARDED:  # as an interpreter started where the shim was would have them
            default = signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL
            signal.signal(sig, signal.SIG_IGN if int(sig) in req["ignored"] else default)
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
    """The exit status of ``pid`` (−N after signal N). A byte from ``conn`` is a signal the shim
    received, sent on to ``pid``; if ``conn`` closes first, ``pid``'s process group is killed."""
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
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
    serve(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else None)
