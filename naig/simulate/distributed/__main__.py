"""``python -m naig.simulate.distributed CONFIG.json``: one rank of the parameter server (§14).

The processes ``naig simulate`` spawns on one machine run this, and so can ``torchrun``
on several: every rank reads the same config (a JSON object of ``SimulateConfig``
fields, ``engine`` distributed); rank 0 serves and prints the result as one JSON
document on stdout; the others work. Errors are one line on stderr (exit 1 data,
2 usage); NAIG_DEBUG=1 shows the traceback.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from naig.errors import NaigError, UsageError
from naig.io import json_ready

__all__ = ["main"]


def main(argv: list[str]) -> int:
    """Run this process's rank; returns the exit status."""
    from naig.simulate.distributed.session import config_from_json
    from naig.simulate.experiment import run_experiment

    rank = os.environ.get("RANK", "?")
    try:
        if len(argv) != 2:
            raise UsageError("usage: python -m naig.simulate.distributed CONFIG.json (under torchrun "
                            "or spawned)")
        result = run_experiment(config_from_json(Path(argv[1]).read_text()))
    except KeyboardInterrupt:
        return 130
    except (NaigError, OSError, RuntimeError, ValueError) as exc:
        if os.environ.get("NAIG_DEBUG") == "1":
            raise
        code = exc.exit_code if isinstance(exc, NaigError) else 1
        text = str(exc).strip()
        sys.stderr.write(f"error: rank {rank}: {text.splitlines()[0] if text else repr(exc)}\n")
        return code
    if result is not None:
        sys.stdout.write(json.dumps(json_ready(result.to_dict()), indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
