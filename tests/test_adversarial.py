"""Hostile input to the CLI, one table of cases (issue 18): every bad value must end in one line.

Each case runs ``python -m naig_cli ARGS`` in a fresh working directory, in its own session,
with its address space capped (``RLIMIT_AS``, set in the child before it starts), and
asserts what a user is owed:

- exit status 1 (data) or 2 (usage), as the case says;
- stderr is exactly one line, ``error: …``, naming what the case names, and no traceback;
- stdout is empty and nothing was written: the working directory holds the same files
  with the same sizes and times;
- no process of the run is left (its session's process group is gone);
- the run fits under the memory cap: a runaway request is refused, not attempted.

Add a command by adding rows to ``CASES`` (``naig simulate`` rows belong here too). A row's
arguments may use ``{good}``, ``{other}``, ``{text}``, ``{trunc}`` for the fixture files;
``naig simulate`` rows name the files of ``workdir`` directly (``small.txt``, ``fifo``, ``adir``,
``afile``, the ``*.toml`` configs), since they run in that directory. A row has its own timeout:
a simulate row that wrongly starts training uses tiny sizes (``SIM_BASE``) and ends fast.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from tests.conftest import run_python

ROOT = Path(__file__).resolve().parents[1]
MEMORY_CAP = 4 * 2**30  # bytes of address space (python + torch + numpy need about 2 GiB of it)
TIMEOUT = 60


@dataclass(frozen=True)
class Case:
    """One hostile command line.

    Attributes:
        args: ``naig`` arguments (placeholders ``{good}`` etc. name fixture files).
        code: the exit status owed (1 data, 2 usage).
        needles: text the one error line must contain (the option named, the fix).
        timeout: seconds the command may run before it is killed (and the case fails).
        inprocess: a row that validation must refuse, run in this process (fast); rows about
            memory, pipes, devices and sizes always run in a capped subprocess.
    """

    args: tuple[str, ...]
    code: int
    needles: tuple[str, ...] = ()
    timeout: float = TIMEOUT
    inprocess: bool = False  # run through typer's CliRunner (no new interpreter: no torch import per row)


def _c(line: str, code: int, *needles: str) -> Case:
    return Case(tuple(line.split()), code, needles)


# tiny sizes first: a row's own options come after and win (click keeps an option's last value),
# so a row that wrongly starts training finishes in seconds. Rows that pass validation on purpose
# (the bad value is found later) add --lags 0,0: the default lags reach --steps 2, and their
# "never join" warning would be a second stderr line the row is not about.
SIM_BASE = "simulate --steps 2 --seeds 1 --data-bytes 100000 --strategies hogwild"
SIM_TIMEOUT = 30


def _s(line: str, code: int, *needles: str, timeout: float = SIM_TIMEOUT, isolate: bool = False) -> Case:
    """A ``naig simulate`` row: ``SIM_BASE``, then ``line`` in shell quoting (``--lags ''``: empty).

    Rows run in process unless ``isolate`` or they name a size, a pipe or a device (the memory cap
    and the process checks need a subprocess there)."""
    risky = isolate or any(k in line for k in ("fifo", "/dev/", "000000", "e1", "e2", "e3"))
    return Case(tuple(shlex.split(f"{SIM_BASE} {line}")), code, needles, timeout, inprocess=not risky)


_MANY_LAGS = ",".join(["0"] * 50_000)  # K = 50,000 workers at fixed lags: 2K gradient rows, one argument


CASES: dict[str, Case] = {
    # naig staleness: runaway sizes, extreme laws, malformed options
    "staleness-updates-1e12": _c(f"staleness --updates {10**12}", 2, "--updates", "GiB of memory"),
    "staleness-updates-1e9": _c(f"staleness --updates {10**9}", 2, "--updates", "GiB of memory"),
    "staleness-workers-1e8": _c(f"staleness --workers {10**8} --updates 1000", 2, "--workers", "at most"),
    "staleness-workers-1e6": _c(f"staleness --workers {10**6} --updates {10**9}", 2, "GiB of memory"),
    "staleness-workers-0": _c("staleness --workers 0", 2, "--workers"),
    "staleness-sigma-40": _c("staleness --compute lognormal:1:40", 2, "--compute", "sigma"),
    "staleness-mean-tiny": _c("staleness --compute exp:1e-300", 2, "--compute"),
    "staleness-mean-huge": _c("staleness --compute exp:1e300", 2, "--compute"),
    "staleness-const-huge": _c("staleness --uplink const:1e300", 2, "--uplink"),
    "staleness-gamma-shape": _c("staleness --compute gamma:1:1e-300", 2, "--compute", "shape"),
    "staleness-nan": _c("staleness --compute exp:nan", 2, "--compute", "finite"),
    "staleness-bandwidth": _c("staleness --bandwidth 1e-300", 2, "--bandwidth"),
    "staleness-params": _c(f"staleness --params {10**40}", 2, "--params"),
    "staleness-window": _c("staleness --workers 2 --window 5", 2, "--window"),
    "staleness-sweep": _c("staleness --sweep workers=0..3", 2, "--sweep"),
    "staleness-sweep-memory": _c(f"staleness --sweep workers=1,2 --updates {10**12}", 2, "GiB"),
    "staleness-seed": _c(f"staleness --seed {2**64}", 2, "--seed"),
    # naig spectrum
    "spectrum-line": _c("spectrum --line 1,2,3", 2, "--line"),
    "spectrum-line-text": _c("spectrum --line a,b,c", 2, "--line"),
    "spectrum-tol-negative": _c("spectrum --tol -1", 2, "--tol"),
    "spectrum-tol-nan": _c("spectrum --tol nan", 2, "--tol"),
    "spectrum-tol-huge": _c("spectrum --tol 2", 2, "--tol"),
    # naig audit
    "audit-missing-ref": _c("audit missing.safetensors {good}", 1, "missing.safetensors"),
    "audit-missing-worker": _c("audit {good} missing.safetensors", 1, "missing.safetensors"),
    "audit-text-file": _c("audit {good} {text}", 1, "notes.txt"),
    "audit-truncated": _c("audit {good} {trunc}", 1, "trunc.safetensors"),
    "audit-beta": _c("audit {good} {other} --beta -1", 2, "--beta"),
    "audit-beta-nan": _c("audit {good} {other} --beta nan", 2, "--beta"),
    "audit-line": _c("audit {good} {other} --line 1,2,3", 2, "--line"),
    "audit-chunk": _c("audit {good} {other} --chunk-mb 0", 2, "--chunk-mb"),
    "audit-keys-regex": _c("audit {good} {other} --keys ([", 2, "--keys"),
    "audit-csv-dir": _c("audit {good} {other} --csv missing/out.csv", 2, "--csv"),
    # naig simulate: common options
    "sim-steps-0": _s("--steps 0", 2, "--steps"),
    "sim-steps-negative": _s("--steps -1", 2, "--steps"),
    "sim-steps-1e12": _s(f"--steps {10**12}", 2, "--steps"),
    "sim-steps-text": _s("--steps abc", 2, "--steps"),
    "sim-steps-float": _s("--steps 1.5", 2, "--steps"),
    "sim-seeds-0": _s("--seeds 0", 2, "--seeds"),
    "sim-seeds-negative": _s("--seeds -1", 2, "--seeds"),
    "sim-seeds-1e12": _s(f"--lags 0,0 --seeds {10**12}", 2, "--seeds"),
    "sim-lr-nan": _s("--lr nan", 2, "--lr"),
    "sim-lr-inf": _s("--lr inf", 2, "--lr"),
    "sim-lr-0": _s("--lr 0", 2, "--lr"),
    "sim-lr-negative": _s("--lr -1e-3", 2, "--lr"),
    "sim-lr-twice": _s("--lr 1e-3,1e-3", 2, "--lr", "twice"),
    "sim-lr-text": _s("--lr abc", 2, "--lr"),
    "sim-lr-empty": _s("--lags 0,0 --lr ''", 2, "--lr"),
    "sim-lr-trailing-comma": _s("--lr 1e-3,", 2, "--lr"),
    "sim-optimizer": _s("--optimizer x", 2, "--optimizer"),
    "sim-batch-size-0": _s("--batch-size 0", 2, "--batch-size"),
    "sim-batch-size-negative": _s("--batch-size -8", 2, "--batch-size"),
    "sim-batch-size-1e9": _s(f"--lags 0,0 --batch-size {10**9}", 2, "--batch-size"),
    "sim-eval-batches-1e9": _s(f"--lags 0,0 --set eval_batches={10**9}", 2, "--set eval_batches", "GiB"),
    "sim-eval-every-negative": _s("--eval-every -1", 2, "--eval-every"),
    "sim-device-cuda": _s("--device cuda", 2, "--device"),
    "sim-device-unknown": _s("--device tpu", 2, "--device"),
    "sim-model": _s("--model x", 2, "--model"),
    "sim-data-bytes-0": _s("--data-bytes 0", 2, "--data-bytes"),
    "sim-data-bytes-negative": _s("--data-bytes -5", 2, "--data-bytes"),
    "sim-data-bytes-huge-small-file": _s(f"--lags 0,0 --data small.txt --data-bytes {10**15}", 1, "--data"),
    "sim-data-missing": _s("--lags 0,0 --data missing.txt", 1, "--data", "missing.txt"),
    "sim-data-directory": _s("--lags 0,0 --data adir", 1, "--data", "adir"),
    "sim-data-fifo": _s("--lags 0,0 --data fifo", 1, "--data", "fifo"),
    "sim-data-device": _s("--lags 0,0 --data /dev/zero", 1, "--data", "/dev/zero"),
    "sim-data-empty": _s("--lags 0,0 --data empty.txt", 1, "--data", "empty.txt"),
    "sim-sketch-seed-negative": _s("--set sketch_seed=-1", 2, "--set sketch_seed"),
    "sim-sketch-seed-2^64": _s(f"--set sketch_seed={2**64}", 2, "--set sketch_seed"),
    "sim-strategies-empty": _s("--lags 0,0 --strategies ''", 2, "--strategies"),
    "sim-strategies-unknown": _s("--strategies bogus", 2, "--strategies", "bogus"),
    "sim-strategies-twice": _s("--strategies naig,naig", 2, "--strategies"),
    "sim-strategies-local-without-arrivals": _s("--strategies diloco", 2, "--arrivals"),
    "sim-unknown-option": _s("--stepz 2", 2, "--stepz"),
    "sim-json-error": _s("--json --steps 0", 2, "--steps"),
    # naig simulate: rule options
    "sim-beta-negative": _s("--strategies naig --beta -1", 2, "--beta"),
    "sim-beta-nan": _s("--strategies naig --beta nan", 2, "--beta"),
    "sim-beta-text": _s("--strategies naig --beta hot", 2, "--beta"),
    "sim-clip-0": _s("--strategies centered-clip --set rules.clip=0", 2, "--set rules.clip"),
    "sim-clip-negative": _s("--strategies centered-clip --set rules.clip=-1", 2, "--set rules.clip"),
    "sim-clip-nan": _s("--strategies centered-clip --set rules.clip=nan", 2, "--set rules.clip"),
    "sim-byzantine-negative": _s("--strategies trimmed-mean --set rules.byzantine=-1", 2,
                                 "--set rules.byzantine"),
    "sim-byzantine-too-many": _s("--lags 0,0,0 --strategies trimmed-mean --set rules.byzantine=2", 2,
                                 "--set rules.byzantine"),
    "sim-max-staleness-negative": _s("--strategies drop-stale --set rules.max_staleness=-2", 2,
                                     "--set rules.max_staleness"),
    "sim-dc-lambda-nan": _s("--strategies dc-asgd --set rules.dc_lambda=nan", 2, "--set rules.dc_lambda"),
    "sim-reference": _s("--strategies naig --set rules.reference=oracle", 2, "--set rules.reference"),
    # naig simulate: faults
    "sim-faults-malformed": _s("--faults garbage", 2, "--faults"),
    "sim-faults-empty": _s("--faults ''", 2, "--faults"),
    "sim-faults-unknown-kind": _s("--faults 1:bogus", 2, "--faults", "bogus"),
    "sim-faults-worker-range": _s("--faults 9:nan", 2, "--faults", "worker 9"),
    "sim-faults-worker-negative": _s("--faults -1:nan", 2, "--faults"),
    "sim-faults-arg-nan": _s("--faults 0:scale:nan", 2, "--faults"),
    "sim-faults-arg-text": _s("--faults 0:signflip:abc", 2, "--faults"),
    "sim-faults-step-negative": _s("--faults 0:nan@-1", 2, "--faults"),
    "sim-faults-kill-simulated": _s("--faults 0:kill", 2, "--faults", "--engine distributed"),
    "sim-faults-hang-arrivals": _s("--arrivals exp:1,exp:1 --faults 0:hang", 2, "--faults"),
    "sim-faults-gasloc": _s("--arrivals exp:1,exp:1 --strategies gasloc --faults 0:nan", 2, "--faults",
                            "gasloc"),
    # naig simulate: fixed lags
    "sim-lags-empty": _s("--lags ''", 2, "--lags"),
    "sim-lags-negative": _s("--lags 0,-1", 2, "--lags"),
    "sim-lags-text": _s("--lags 0,x", 2, "--lags"),
    "sim-lags-double-comma": _s("--lags 0,,1", 2, "--lags"),
    "sim-lags-huge": _s("--lags 99999999999", 2, "--lags"),
    "sim-lags-none-join": _s("--lags 5,5", 2, "--lags"),
    "sim-save-at-without-save-grads": _s("--lags 0,0 --save-at 1", 2, "--save-at", "--save-grads"),
    "sim-save-grads-without-save-at": _s("--lags 0,0 --save-grads grads", 2, "--save-grads", "--save-at"),
    "sim-save-grads-file": _s("--lags 0,0 --save-grads afile --save-at 1", 2, "--save-grads"),
    "sim-save-grads-under-file": _s("--lags 0,0 --save-grads afile/g --save-at 1", 2, "--save-grads"),
    "sim-save-grads-empty": _s("--lags 0,0 --save-grads '' --save-at 1", 2, "--save-grads"),
    "sim-save-at-beyond-steps": _s("--lags 0,0 --save-grads grads --save-at 5", 2, "--save-at"),
    "sim-save-at-text": _s("--lags 0,0 --save-grads grads --save-at 1,x", 2, "--save-at"),
    # naig simulate: arrivals
    "sim-arrivals-bad-spec": _s("--arrivals bogus", 2, "--arrivals"),
    "sim-arrivals-empty": _s("--arrivals ''", 2, "--arrivals"),
    "sim-arrivals-exp-negative": _s("--arrivals exp:-1", 2, "--arrivals"),
    "sim-arrivals-nan": _s("--arrivals exp:nan,exp:1", 2, "--arrivals"),
    "sim-arrivals-mean-huge": _s("--arrivals exp:1e300,exp:1", 2, "--arrivals"),
    "sim-arrivals-sigma-huge": _s("--arrivals lognormal:1:40,exp:1", 2, "--arrivals"),
    "sim-arrivals-double-comma": _s("--arrivals exp:1,,exp:1", 2, "--arrivals"),
    "sim-lags-50000-workers": _s(f"--lags {_MANY_LAGS}", 2, "--lags", "GiB", isolate=True),
    "sim-window-0": _s("--arrivals exp:1,exp:1 --window 0", 2, "--window"),
    "sim-window-too-big": _s("--arrivals exp:1,exp:1 --window 3", 2, "--window"),
    "sim-window-without-setting": _s("--window 2", 2, "--window"),
    "sim-mode": _s("--arrivals exp:1,exp:1 --mode x", 2, "--mode"),
    "sim-uplink-without-arrivals": _s("--set arrivals.uplink=const:0.1", 2,
                                      "--set arrivals.uplink", "--arrivals"),
    "sim-uplink-negative": _s("--arrivals exp:1,exp:1 --set arrivals.uplink=exp:-1", 2,
                              "--set arrivals.uplink"),
    "sim-uplink-three-for-two": _s("--arrivals exp:1,exp:1 --set arrivals.uplink=const:1,const:1,const:1", 2,
                                   "--set arrivals.uplink"),
    "sim-downlink-bad-spec": _s("--arrivals exp:1,exp:1 --set arrivals.downlink=bogus", 2,
                                "--set arrivals.downlink"),
    "sim-shared-memory-with-uplink": _s(
        "--arrivals exp:1,exp:1 --mode shared-memory --set arrivals.uplink=const:1", 2,
                                        "--set arrivals.uplink"),
    "sim-bandwidth-0": _s("--arrivals exp:1,exp:1 --set arrivals.bandwidth=0", 2, "--set arrivals.bandwidth"),
    "sim-bandwidth-negative": _s("--arrivals exp:1,exp:1 --set arrivals.bandwidth=-1", 2,
                                 "--set arrivals.bandwidth"),
    "sim-bandwidth-nan": _s("--arrivals exp:1,exp:1 --set arrivals.bandwidth=nan", 2,
                            "--set arrivals.bandwidth"),
    "sim-bandwidth-three-for-two": _s("--arrivals exp:1,exp:1 --set arrivals.bandwidth=1e6,1e6,1e6", 2,
                                      "--set arrivals.bandwidth"),
    "sim-bandwidth-without-arrivals": _s("--set arrivals.bandwidth=1e6", 2,
                                         "--set arrivals.bandwidth", "--arrivals"),
    # naig simulate: local updates
    "sim-local-steps-0": _s("--arrivals exp:1,exp:1 --strategies diloco --local-steps 0", 2, "--local-steps"),
    "sim-local-steps-three-for-two": _s("--arrivals exp:1,exp:1 --strategies diloco --local-steps 1,2,3", 2,
                                        "--local-steps"),
    "sim-local-steps-huge": _s(f"--arrivals exp:1,exp:1 --strategies diloco --local-steps {10**12}", 2,
                               "--local-steps"),
    "sim-local-steps-text": _s("--arrivals exp:1,exp:1 --strategies diloco --local-steps x", 2,
                               "--local-steps"),
    "sim-local-steps-no-local-method": _s("--arrivals exp:1,exp:1 --local-steps 5", 2, "--local-steps"),
    "sim-local-steps-without-arrivals": _s("--local-steps 5", 2, "--local-steps", "--arrivals"),
    "sim-outer-lr-nan": _s("--arrivals exp:1,exp:1 --strategies diloco --set arrivals.local.outer_lr=nan", 2,
                           "--set arrivals.local.outer_lr"),
    "sim-outer-lr-0": _s("--arrivals exp:1,exp:1 --strategies diloco --set arrivals.local.outer_lr=0", 2,
                         "--set arrivals.local.outer_lr"),
    "sim-outer-momentum-1": _s(
        "--arrivals exp:1,exp:1 --strategies diloco --set arrivals.local.outer_momentum=1", 2,
                               "--set arrivals.local.outer_momentum"),
    "sim-outer-momentum-negative": _s(
        "--arrivals exp:1,exp:1 --strategies diloco --set arrivals.local.outer_momentum=-0.1", 2,
                                      "--set arrivals.local.outer_momentum"),
    # naig simulate: distributed (every row fails validation before any process starts)
    "sim-engine": _s("--engine x", 2, "--engine"),
    "sim-engine-no-nproc": _s("--engine distributed", 2, "--nproc"),
    "sim-nproc-1": _s("--engine distributed --nproc 1", 2, "--nproc"),
    "sim-nproc-without-engine": _s("--nproc 3", 2, "--nproc", "--engine distributed"),
    "sim-slowdown-half": _s("--engine distributed --nproc 3 --set distributed.slowdown=0.5,1", 2,
                            "--set distributed.slowdown"),
    "sim-slowdown-count": _s("--engine distributed --nproc 3 --set distributed.slowdown=1,1,1", 2,
                             "--set distributed.slowdown"),
    "sim-slowdown-without-engine": _s("--set distributed.slowdown=1,1", 2,
                                      "--set distributed.slowdown", "--engine distributed"),
    "sim-timeout-0": _s("--engine distributed --nproc 3 --set distributed.timeout=0", 2,
                        "--set distributed.timeout"),
    "sim-timeout-31": _s("--engine distributed --nproc 3 --set distributed.timeout=31", 2,
                         "--set distributed.timeout"),
    "sim-timeout-nan": _s("--engine distributed --nproc 3 --set distributed.timeout=nan", 2,
                          "--set distributed.timeout"),
    "sim-sketch-first-hogwild": _s("--engine distributed --nproc 3 --set distributed.sketch_first", 2,
                                   "--set distributed.sketch_first"),
    "sim-sketch-first-without-engine": _s("--strategies naig --set distributed.sketch_first", 2,
                                          "--set distributed.sketch_first"),
    "sim-distributed-window-too-big": _s("--engine distributed --nproc 3 --window 3", 2, "--window"),
    "sim-distributed-local-method": _s("--engine distributed --nproc 3 --strategies diloco", 2,
                                       "--strategies"),
    "sim-distributed-fault-range": _s("--engine distributed --nproc 3 --faults 5:kill", 2, "--faults"),
    # naig simulate: options of two settings together
    "sim-lags-with-arrivals": _s("--lags 0,1 --arrivals exp:1,exp:1", 2, "--lags", "--arrivals"),
    "sim-nproc-with-arrivals": _s("--nproc 3 --arrivals exp:1,exp:1", 2, "--nproc"),
    "sim-save-grads-with-arrivals": _s("--save-grads grads --save-at 1 --arrivals exp:1,exp:1", 2,
                                       "--save-grads"),
    "sim-lags-with-engine": _s("--engine distributed --nproc 3 --lags 0,1", 2, "--lags"),
    "sim-arrivals-with-engine": _s("--engine distributed --nproc 3 --arrivals exp:1,exp:1", 2, "--arrivals"),
    "sim-warmup-with-arrivals": _s("--arrivals exp:1,exp:1 --set lags.warmup_theta0", 2,
                                   "--set lags.warmup_theta0"),
    # naig simulate: output
    "sim-log-dir-file": _s("--log-dir afile", 2, "--log-dir"),
    "sim-log-dir-under-file": _s("--log-dir afile/logs", 2, "--log-dir"),
    "sim-log-dir-empty": _s("--lags 0,0 --log-dir ''", 2, "--log-dir"),
    "sim-plot-suffix": _s("--plot curves.txt", 2, "--plot"),
    "sim-plot-no-suffix": _s("--plot curves", 2, "--plot"),
    "sim-plot-missing-folder": _s("--plot missing/curves.png", 2, "--plot"),
    "sim-plot-under-file": _s("--plot afile/curves.png", 2, "--plot"),
    # naig simulate: --config
    "sim-config-missing": _s("--config missing.toml", 2, "--config", "missing.toml"),
    "sim-config-invalid-toml": _s("--config bad.toml", 2, "--config", "TOML"),
    "sim-config-invalid-json": _s("--config bad.json", 2, "--config", "JSON"),
    "sim-config-unknown-key": _s("--config unknown.toml", 2, "stepz"),
    "sim-config-unknown-rules-key": _s("--config unknown_rules.toml", 2, "betta"),
    "sim-config-two-settings": _s("--config two.toml", 2, "one setting"),
    "sim-config-wrong-type": _s("--config wrong_type.toml", 2, "steps"),
    "sim-config-directory": _s("--config adir", 2, "--config", "adir"),
    "sim-config-fifo": _s("--config fifo", 2, "--config", "fifo", timeout=15),
    "sim-config-device": _s("--config /dev/zero", 2, "--config", "/dev/zero", timeout=15),
    "sim-config-not-a-table": _s("--config list.json", 2, "--config"),
    "sim-config-setting-then-option": _s("--config lags.toml --window 2", 2, "--window"),
}


_CONFIGS = {  # simulate --config files, each wrong in one way
    "bad.toml": "steps = [\n",
    "bad.json": "{\"steps\": 2,",
    "list.json": "[1, 2]",
    "unknown.toml": "stepz = 2\n",
    "unknown_rules.toml": "[rules]\nbetta = 1.0\n",
    "two.toml": "[lags]\nlags = [0, 1]\n\n[arrivals]\ncompute = \"exp:1,exp:1\"\n",
    "wrong_type.toml": "steps = \"two\"\n",
    "lags.toml": "[lags]\nlags = [0, 1]\n",
}


@pytest.fixture
def workdir(tmp_path: Path) -> dict[str, str]:
    """A working directory with a reference, a worker, a text file and a truncated file.

    For ``naig simulate``: a text too small to train on (``small.txt``), an empty one, a
    directory (``adir``), a named pipe (``fifo``), a plain file (``afile``) and config files.
    """
    gen = torch.Generator().manual_seed(0)
    save_file({"w": torch.randn(64, 8, generator=gen), "b": torch.randn(8, generator=gen)},
              str(tmp_path / "good.safetensors"))
    save_file({"w": torch.randn(64, 8, generator=gen), "b": torch.randn(8, generator=gen)},
              str(tmp_path / "other.safetensors"))
    (tmp_path / "notes.txt").write_text("not a tensor file\n")
    (tmp_path / "trunc.safetensors").write_bytes((tmp_path / "good.safetensors").read_bytes()[:100])
    (tmp_path / "small.txt").write_text("def f(x):\n    return x\n")
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "adir").mkdir()
    (tmp_path / "afile").write_text("a plain file\n")
    os.mkfifo(tmp_path / "fifo")
    for name, text in _CONFIGS.items():
        (tmp_path / name).write_text(text)
    return {"good": "good.safetensors", "other": "other.safetensors", "text": "notes.txt",
            "trunc": "trunc.safetensors", "dir": str(tmp_path)}


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")}


def capped_cli(argv: list[str], cwd: Path, timeout: float, name: str) -> subprocess.CompletedProcess:
    """``python -m naig_cli ARGV`` forked (``run_python``) in its own session, its address space capped at
    ``MEMORY_CAP``; fails the test when it runs past ``timeout`` seconds (killed, its stderr shown) or
    leaves a process of its group alive."""
    env = {**os.environ, "COLUMNS": "200", "PYTHONPATH": str(ROOT), "NAIG_DEBUG": "0"}
    try:
        r = run_python("-m", "naig_cli", *argv, cwd=cwd, env=env, timeout=timeout, memory_cap=MEMORY_CAP,
                       new_session=True)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{name}: still running after {timeout:g} s (killed); stderr: {exc.stderr[-999:]!r}")
    assert not _group_alive(r.pid), f"{name}: a process of the run is still alive"
    return r


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_ends_in_one_line(name: str, workdir: dict[str, str],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    case = CASES[name]
    cwd = Path(workdir["dir"])
    before = _snapshot(cwd)
    argv = [a.format(**workdir) for a in case.args]
    if case.inprocess:
        _in_process(name, case, argv, cwd, monkeypatch)
        assert _snapshot(cwd) == before, f"{name}: wrote to the working directory"
        return
    proc = capped_cli(argv, cwd, case.timeout, name)
    out, err = proc.stdout, proc.stderr
    assert proc.returncode == case.code, (name, proc.returncode, err[-2000:])
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), (name, err[-2000:])
    assert "Traceback" not in err and "MemoryError" not in err and "Unable to allocate" not in err, err
    for needle in case.needles:
        assert needle in lines[0], (name, needle, lines[0])
    assert out == "", (name, out[:500])
    assert _snapshot(cwd) == before, f"{name}: wrote to the working directory"


def _in_process(name: str, case: Case, argv: list[str], cwd: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same assertions on a run through typer's CliRunner, in this process (no exception escapes)."""
    from typer.testing import CliRunner

    from naig_cli.main import app

    monkeypatch.chdir(cwd)
    result = CliRunner().invoke(app, argv, env={"COLUMNS": "200"})
    assert result.exception is None or isinstance(result.exception, SystemExit), (name, result.exception)
    assert result.exit_code == case.code, (name, result.exit_code, result.stderr[-2000:])
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), (name, result.stderr[-2000:])
    assert "Traceback" not in result.stderr
    for needle in case.needles:
        assert needle in lines[0], (name, needle, lines[0])
    assert result.stdout == "", (name, result.stdout[:500])
