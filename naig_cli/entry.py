"""The ``naig`` program (the script, ``python -m naig`` and ``python -m naig_cli``): the app, with a
stop from outside (Ctrl-C, SIGTERM) said in one line, exit 130, before and after it runs.

While the command runs, ``naig_cli._common.handle_errors`` and the commands handle a stop (what
finished is reported). Before that, the imports take ~0.1–1.5 s, where a Ctrl-C raised a
traceback: a stop there is one line, exit 130. After it, the interpreter's teardown (torch's
finalizers, ~0.7 s), where a stop printed a traceback from an exit handler or turned a finished
command's exit status into 0, −2 or −15: there the stops are blocked, so the command's own exit
status stands (its output is complete) and the process ends as it would have.
"""

from __future__ import annotations

import os
import signal
import sys

__all__ = ["main"]

_STOPS = (signal.SIGINT, signal.SIGTERM)


def _starting(signum: int, frame: object) -> None:
    os.write(2, b"error: interrupted while starting; nothing was done\n")
    os._exit(130)


def main() -> None:
    """Run the ``naig`` app (``naig_cli.main.app``) as a program."""
    for stop in _STOPS:
        signal.signal(stop, _starting)
    from naig_cli.main import app

    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        app(prog_name="naig")
    finally:
        for stream in (sys.stdout, sys.stderr):  # what the command wrote is out before a stop can end it
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        if hasattr(signal, "pthread_sigmask"):  # POSIX: the teardown is not cut, the exit status stays
            signal.pthread_sigmask(signal.SIG_BLOCK, _STOPS)
