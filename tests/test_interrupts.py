"""naig.interrupts: SIGTERM raised as Ctrl-C, stops held back over a block; and the program's
stops before and after a command (naig_cli.entry)."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from naig.interrupts import deferred_interrupts, sigterm_as_interrupt

ROOT = Path(__file__).resolve().parents[1]


def test_sigterm_raises_keyboard_interrupt_in_the_block_only() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt), sigterm_as_interrupt():
        signal.raise_signal(signal.SIGTERM)
    assert signal.getsignal(signal.SIGTERM) is before


def test_stops_in_a_deferred_block_are_recorded_not_raised() -> None:
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with deferred_interrupts() as late:
        signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGTERM)
        reached = True
    assert reached and late == [signal.SIGINT, signal.SIGTERM]
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


def _program(code: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})


_STOP_WHILE_IMPORTING = """
import os, signal, sys
class Stop:  # a Ctrl-C as the app's modules load
    def find_spec(self, name, path=None, target=None):
        if name == "naig_cli.main":
            os.kill(os.getpid(), signal.SIGINT)
        return None
sys.meta_path.insert(0, Stop())
sys.argv[0] = "naig"
from naig_cli.entry import main
main()
"""

_STOP_WHILE_EXITING = """
import atexit, os, signal, sys
atexit.register(lambda: os.kill(os.getpid(), signal.SIGINT))  # a Ctrl-C in the teardown
sys.argv[0] = "naig"
from naig_cli.entry import main
main()
"""


def test_a_stop_while_the_program_starts_is_one_line_and_exit_130() -> None:
    r = _program(_STOP_WHILE_IMPORTING, "spectrum", "--json")
    assert r.returncode == 130 and r.stdout == ""
    assert r.stderr == "error: interrupted while starting; nothing was done\n"


def test_a_stop_in_the_teardown_leaves_the_output_and_the_exit_status() -> None:
    r = _program(_STOP_WHILE_EXITING, "spectrum", "--json")
    assert r.returncode == 0 and '"verified": true' in r.stdout
    assert r.stderr == "", r.stderr  # no traceback from an exit handler
