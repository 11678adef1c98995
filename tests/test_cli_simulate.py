"""``naig simulate`` on the command line (naig_cli.simulate)."""

import importlib.util
import inspect
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from naig.simulate import SimulateConfig
from naig.simulate.config import DEFAULT_STRATEGIES
from naig_cli import simulate as cli
from naig_cli.main import app
from tests import warm_python
from tests.conftest import assert_no_leftovers, assert_one_line_error, default_sigint, run_naig, warm_bin

TINY = ["simulate", "--steps", "6", "--seeds", "1", "--data-bytes", "200000",
        "--lags", "0,2", "--eval-every", "3"]
RUNNER = CliRunner()


def _run(*args: str):  # noqa: ANN202
    return RUNNER.invoke(app, [*TINY, *args])


def _numbers(doc: dict) -> dict:
    for run in doc["runs"]:
        run.pop("ms_per_step")
    for s in doc["summaries"]:
        s.pop("ms_per_step")
    return doc


def test_json_is_one_document_and_reproducible() -> None:
    a, b = _run("--json", "--strategies", "naig,hogwild"), _run("--json", "--strategies",
                                                                 "naig,hogwild")
    assert a.exit_code == 0, a.output
    doc = json.loads(a.stdout)
    assert _numbers(doc) == _numbers(json.loads(b.stdout))
    assert [s["strategy"] for s in doc["summaries"]] == ["naig", "hogwild"]
    assert doc["untrained_val_loss"] > doc["summaries"][0]["val_loss_mean"]
    assert doc["config"]["lags"]["lags"] == [0, 2] and doc["routing_bytes"] == 56
    assert doc["summaries"][0]["val_loss_std"] is None  # one seed: undefined, not 0.0


def test_human_table() -> None:
    out = _run("--strategies", "hogwild,staleness,dc-asgd,naig-exact")
    assert out.exit_code == 0, out.output
    for word in ("untrained validation loss", "hogwild", "dc-asgd", "naig-exact", "K_eff",
                 "routing signal 56 B"):
        assert word in out.stdout
    text = " ".join(out.stdout.split())  # the legend wraps at the terminal's width
    assert "π each worker's mean weight in the update over the steps it sent" in text  # every rule's π
    assert "mean Gibbs weight per worker" not in text  # hogwild's and staleness's are no Gibbs weights


@pytest.mark.parametrize(("args", "option"), [
    (["--lags", "0,x"], "--lags"),
    (["--lags", "0,-3"], "--lags"),
    (["--beta", "-1"], "--beta"),
    (["--beta", "nan"], "--beta"),
    (["--beta", "hot"], "--beta"),
    (["--strategies", "naig,fast"], "--strategies"),
    (["--model", "gpt-9"], "--model"),
    (["--save-at", "3"], "--save-at"),
    (["--save-at", "10", "--steps", "2"], "--save-at 10: needs --save-grads"),
    (["--save-grads", ""], "--save-grads ''"),
    (["--save-grads", "somewhere"], "--save-grads 'somewhere': needs --save-at"),
    (["--lags", "0,100000000000"], "--lags 0,100000000000: a lag must be at most"),
    (["--set", "rules.dc_lambda=nan"], "--set rules.dc_lambda=nan"),
    (["--set", "rules.dc_lambda=-1"], "--set rules.dc_lambda=-1"),
    (["--set", "sketch_seed=-1"], "--set sketch_seed=-1"),
    (["--set", f"sketch_seed={2**64}"], "--set sketch_seed=18446744073709551616"),
    (["--strategies", "naig,naig,hogwild"], "naig listed more than once"),
    (["--batch-size", "0"], "--batch-size 0"),
    (["--eval-every", "-1"], "--eval-every -1"),
])
def test_usage_errors_exit_2_with_one_line(args: list[str], option: str) -> None:
    out = _run(*args)
    assert out.exit_code == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and option in lines[0]
    assert "Traceback" not in out.output and out.stdout == ""
    assert "(" not in lines[0].split(":")[0]  # the user's text, not a Python tuple
    assert "--eval-batches" not in lines[0]  # no such option


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present")
def test_cuda_without_gpu_exits_2() -> None:
    out = _run("--device", "cuda")
    assert out.exit_code == 2
    assert out.stderr.strip() == "error: --device 'cuda': no CUDA GPU is available; use cpu or auto"


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is not None,
                    reason="matplotlib is installed")
def test_plot_without_matplotlib_exits_2(tmp_path: Path) -> None:
    out = _run("--plot", str(tmp_path / "c.png"))
    assert out.exit_code == 2 and "pip install matplotlib" in out.stderr and "'.[plot]'" in out.stderr


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="needs matplotlib")
def test_plot_writes_png(tmp_path: Path) -> None:
    out = _run("--strategies", "hogwild", "--plot", str(tmp_path / "c.png"))
    assert out.exit_code == 0 and (tmp_path / "c.png").stat().st_size > 0


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="needs matplotlib")
def test_a_plot_of_runs_that_all_diverged_adds_no_numpy_warning(tmp_path: Path) -> None:
    """Every seed NaN at a point: numpy's 'Mean of empty slice' (two lines, a source line among them)
    went to stderr beside the one error line."""
    r = run_naig(*TINY, "--seeds", "2", "--strategies", "hogwild", "--faults", "0:inf",
                 "--plot", str(tmp_path / "d.png"))
    assert r.returncode == 1 and "diverged" in r.stderr and (tmp_path / "d.png").stat().st_size > 0
    assert "RuntimeWarning" not in r.stderr and "Mean of empty slice" not in r.stderr, r.stderr


def test_cli_options_are_not_given_by_default_and_show_the_library_defaults() -> None:
    """Every option defaults to None or False (not given, so --config and settings can tell), and its
    help shows the value the library applies instead."""
    import typing

    from naig.simulate.arrivals.setting import DEFAULT_LOCAL_STEPS, ArrivalsSetting

    hints = typing.get_type_hints(cli.simulate, include_extras=True)
    params = inspect.signature(cli.simulate).parameters
    assert all(p.default in (None, False) for p in params.values())
    cfg = SimulateConfig.from_options()
    shown = {name: typing.get_args(hints[name])[1].show_default for name in params}
    library = {"steps": cfg.steps, "seeds": cfg.seeds, "batch_size": cfg.batch_size,
               "eval_every": cfg.eval_every, "data_bytes": cfg.data_bytes, "optimizer": cfg.optimizer,
               "device": cfg.device, "model": cfg.model, "beta": cfg.rules.beta,
               "mode": ArrivalsSetting().mode,
               "window": ArrivalsSetting().window, "local_steps": DEFAULT_LOCAL_STEPS, "engine": cfg.engine}
    for name, value in library.items():
        assert shown[name] == str(value), name
    assert float(shown["lr"]) == cfg.lr[0]
    assert shown["lags"] == ",".join(map(str, cfg.setting.lags))
    assert shown["strategies"].startswith(",".join(DEFAULT_STRATEGIES["lags"]))


def test_choice_enums_list_what_the_library_accepts() -> None:
    from naig.choices import ARRIVAL_MODES, DEVICES, OPTIMIZERS
    from naig.simulate.model import PRESETS

    assert [m.value for m in cli.Model] == list(PRESETS)
    assert [o.value for o in cli.Optimizer] == list(OPTIMIZERS) == ["sgd", "adam"]
    assert [d.value for d in cli.Device] == list(DEVICES) == ["cpu", "cuda", "auto"]
    assert [m.value for m in cli.ArrivalMode] == list(ARRIVAL_MODES)
    help_text = RUNNER.invoke(app, ["simulate", "--help"], env={"COLUMNS": "200"}).stdout
    assert "gpt2-124m" in help_text and "adam" in help_text


def test_cli_modules_do_not_import_torch() -> None:
    code = "import sys, naig_cli.main; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def _lags_in(doc: object) -> list[int]:
    if isinstance(doc, dict):
        own = [int(doc["lag"])] if doc.get("lag") is not None else []
        return own + [x for v in doc.values() for x in _lags_in(v)]
    if isinstance(doc, list):
        return [x for v in doc for x in _lags_in(v)]
    return []


def test_a_second_run_into_one_log_dir_says_it_replaces_the_first_runs_logs(tmp_path: Path) -> None:
    """On stderr and in the JSON alike, before training; the first run says nothing (its JSON, built
    after its runs wrote their logs, listed them as an earlier run's in a first version)."""
    said = []
    for _ in range(2):
        r = run_naig(*TINY, "--strategies", "naig", "--log-dir", str(tmp_path), "--json")
        assert r.returncode == 0, r.stderr
        said.append(([w for w in json.loads(r.stdout)["warnings"] if "--log-dir" in w],
                     [line for line in r.stderr.splitlines() if "--log-dir" in line]))
    assert said[0] == ([], [])
    (doc,), (line,) = said[1]
    assert doc.startswith("--log-dir holds 1 finished log(s) of these runs from an earlier run")
    assert line == f"warning: {doc}"


def test_saved_gradients_are_read_by_naig_audit(tmp_path: Path) -> None:
    """Runs both commands in processes of their own (``naig audit`` reads what another process wrote)."""
    made = run_naig(*TINY, "--lags", "0,2,3", "--strategies", "naig",
                 "--save-grads", str(tmp_path), "--save-at", "4")
    assert made.returncode == 0, made.stderr
    folder = tmp_path / "naig-seed0-step4"
    workers = sorted(str(p) for p in folder.glob("worker*.safetensors"))
    audit = run_naig("audit", str(folder / "ref.safetensors"), *workers, "--json")
    assert audit.returncode == 0, audit.stderr
    assert sorted(set(_lags_in(json.loads(audit.stdout)))) == [0, 2, 3]
    table = run_naig("audit", str(folder / "ref.safetensors"), str(folder))
    assert table.returncode == 0, table.stderr
    assert all(lag in table.stdout for lag in ("0", "2", "3"))


def test_save_grads_on_a_file_exits_2_before_training(tmp_path: Path) -> None:
    f = tmp_path / "grads"
    f.write_text("not a directory")
    r = run_naig(*TINY, "--strategies", "hogwild", "--save-grads", str(f), "--save-at", "1")
    assert_one_line_error(r, 2, "--save-grads", "is not a directory", "pass a directory")
    assert r.stdout == "" and f.read_text() == "not a directory"


def test_huge_lag_needs_no_huge_ring() -> None:
    r = run_naig("simulate", "--steps", "2", "--seeds", "1", "--data-bytes", "200000",
                 "--eval-every", "0", "--strategies", "hogwild", "--lags", "0,100000000")
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    assert lines[0].startswith("warning: worker(s) 1 never join")  # a lag beyond --steps is noted
    assert all(ln.startswith("hogwild seed 0") for ln in lines[1:])  # then progress only
    assert "hogwild" in r.stdout and "± —" in r.stdout


def test_data_directory_says_so(tmp_path: Path) -> None:
    out = _run("--data", str(tmp_path))
    assert out.exit_code == 1 and "is a directory; pass one text file" in out.stderr


def test_old_seed_option_is_gone() -> None:
    assert _run("--seed", "1").exit_code == 2


def _nan_hogwild(monkeypatch: pytest.MonkeyPatch) -> None:
    from naig.simulate.strategies import Update
    from naig.simulate.strategies.hogwild import Hogwild

    monkeypatch.setattr(Hogwild, "combine", lambda self, b: Update(
        torch.full_like(b.grads[0], float("nan")), torch.full((b.grads.shape[0],), 1.0 / b.grads.shape[0])))


def test_some_runs_diverge_exit_0_with_a_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    _nan_hogwild(monkeypatch)
    out = _run("--strategies", "naig,hogwild")
    assert out.exit_code == 0, out.output
    assert "hogwild" in out.stdout and "diverged at step 0" in out.stdout
    warn = [ln for ln in out.stderr.splitlines() if " steps/s" not in ln]  # progress lines aside
    assert len(warn) == 1 and warn[0].startswith("warning: 1 of 2 runs diverged"), out.stderr
    ends = [ln for ln in out.stderr.splitlines() if " steps/s (run " in ln]  # one line per run, as it ends
    # the run's last progress line names the step the table, the warning and --json name (it said
    # "step 1/4 diverged": steps done, one more than the step it diverged at)
    assert len(ends) == 2 and any(ln.startswith("hogwild seed 0 ") and " diverged at step 0 " in ln
                                  for ln in ends), ends
    assert "hogwild seed 0 at step 0" in warn[0]
    js = _run("--strategies", "naig,hogwild", "--json")
    doc = json.loads(js.stdout)
    assert doc["warnings"] == [warn[0].removeprefix("warning: ")]  # the JSON carries what stderr says
    hog = doc["summaries"][1]
    assert hog["val_loss_mean"] is None and hog["diverged_at"] == [0]
    assert doc["runs"][1]["final_val_loss"] is None and doc["runs"][1]["diverged_at"] == 0
    assert doc["summaries"][0]["val_loss_mean"] > 0


def test_the_json_document_carries_the_warnings_of_stderr_in_their_order() -> None:
    """Warnings known before training (an option no listed rule uses, a worker that never joins) are
    said on stderr at once and kept in the document's ``warnings``, worded alike (the flags)."""
    out = _run("--strategies", "naig", "--lags", "0,9", "--set", "rules.max_staleness=3", "--json")
    assert out.exit_code == 0, out.output
    said = [ln.removeprefix("warning: ") for ln in out.stderr.splitlines() if ln.startswith("warning: ")]
    doc = json.loads(out.stdout)
    assert len(said) == 2 and doc["warnings"] == said, (said, doc["warnings"])
    assert "--set rules.max_staleness" in said[0] and "never join" in said[1] and "`" not in "".join(said)
    assert json.loads(_run("--strategies", "naig", "--json").stdout)["warnings"] == []


def test_every_run_diverges_exit_1_with_the_table_kept() -> None:
    args = ("simulate", "--steps", "3", "--seeds", "1", "--data-bytes", "200000", "--eval-every", "0",
            "--strategies", "hogwild,naig", "--lr", "1e6", "--optimizer", "sgd")
    r = run_naig(*args)
    assert_one_line_error(r, 1, "2 of 2 runs diverged", "--lr")
    assert "diverged at step" in r.stdout and "naig" in r.stdout
    r = run_naig(*args, "--json")  # the error, not a warning: the document's warnings hold stderr's only
    assert_one_line_error(r, 1, "2 of 2 runs diverged", "--lr")
    said = [ln.removeprefix("warning: ") for ln in r.stderr.splitlines() if ln.startswith("warning: ")]
    assert json.loads(r.stdout)["warnings"] == said and not any("diverged" in w for w in said)


def _warm_simulate(*args: str, cwd: Path) -> subprocess.Popen:
    """``python -m naig_cli simulate *args`` as the warm server's ``python`` (tests.warm_python: the
    run, and any process it forks, comes from that server), working in ``cwd`` (which marks them all),
    SIGINT at its default, stdout and stderr piped (text)."""
    folder = warm_bin()
    env = {**os.environ, **warm_python.run_env(folder)}
    return subprocess.Popen([str(folder / "python"), "-m", "naig_cli", "simulate", *args], env=env, cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=default_sigint)


def test_a_stop_after_a_run_diverged_says_the_divergence_on_stderr_as_in_the_json(tmp_path: Path) -> None:
    """SIGINT once the diverged run has ended (its progress line says so): the warning on stderr, then
    the interruption's error, and the JSON document's ``warnings`` the same warning."""
    import signal

    proc = _warm_simulate("--steps", "2000", "--seeds", "1", "--data-bytes", "200003", "--eval-every", "0",
                          "--set", "eval_batches=4", "--strategies", "hogwild,naig", "--lags", "0,2,2",
                          "--faults", "1:nan", "--json", "--jobs", "1", cwd=tmp_path)
    try:
        first = proc.stderr.readline()
        time.sleep(0.5)  # the run's result is kept just before its line; the other run takes ~40 s
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert first.startswith("hogwild seed 0 ") and " diverged " in first, first
    assert proc.returncode == 130, err
    said = [ln.removeprefix("warning: ") for ln in err.splitlines() if ln.startswith("warning: ")]
    assert len(said) == 1 and said[0].startswith("1 of 1 runs diverged"), err
    assert json.loads(out)["warnings"] == said
    assert err.rstrip().splitlines()[-1].startswith("error: interrupted")
    assert_no_leftovers(str(tmp_path))


@pytest.mark.parametrize("columns", [80, 200])
def test_table_fits_the_terminal(columns: int) -> None:
    args = [*TINY, "--strategies", "naig,hogwild,staleness,sync,dc-asgd,naig-exact",
            "--lags", "0,10,20,35", "--seeds", "2", "--steps", "3"]
    r = run_naig(*args, columns=columns)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert max(map(len, lines)) <= columns, "\n" + r.stdout
    rows = [ln for ln in lines if ln.split()[:1] and ln.split()[0] in
            ("naig", "hogwild", "staleness", "sync", "dc-asgd", "naig-exact")]
    assert len(rows) == 6 and all("±" in ln and "0.250" in r.stdout for ln in rows)
    header = next(ln for ln in lines if ln.startswith("strategy"))
    assert ("H first→last" in header) == (columns > 100)
    assert ("too narrow for" in r.stdout) == (columns <= 100)


def test_empty_data_file_is_a_data_error(tmp_path: Path) -> None:
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    r = run_naig("simulate", "--data", str(empty), "--steps", "2", "--seeds", "1")
    assert_one_line_error(r, 1, "--data", "empty")


@pytest.mark.parametrize("target", ["curves.xyz", "missing/curves.png"])
def test_bad_plot_target_refused_before_training(tmp_path: Path, target: str) -> None:
    r = run_naig("simulate", "--plot", str(tmp_path / target), "--steps", "2", "--seeds", "1")
    assert r.returncode == 2 and r.stderr.startswith("error: ") and r.stderr.count("\n") == 1
    assert not list(tmp_path.iterdir())


def test_lr_list_tunes_on_validation_and_reports_test(tmp_path: Path) -> None:
    out = _run("--json", "--strategies", "hogwild,naig", "--lr", "1e-4,3e-3", "--seeds", "2",
               "--log-dir", str(tmp_path / "logs"))
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    assert len(doc["runs"]) == 2 * 2 * 2 and doc["config"]["lr"] == [1e-4, 3e-3]
    for s in doc["summaries"]:
        runs = [r for r in doc["runs"] if r["strategy"] == s["strategy"]]
        val = {lr: sum(r["final_val_loss"] for r in runs if r["lr"] == lr) / 2 for lr in (1e-4, 3e-3)}
        assert s["lr"] == min(val, key=val.get)  # chosen on validation
        chosen = [r["final_test_loss"] for r in runs if r["lr"] == s["lr"]]
        assert s["test_loss_mean"] == pytest.approx(sum(chosen) / 2)  # reported on test
        assert all(r["final_test_loss"] != r["final_val_loss"] for r in runs)
    logs = sorted(p.name for p in (tmp_path / "logs").iterdir())
    assert len(logs) == 8 and logs[0] == "hogwild-seed0-lr0.0001.csv"
    rows = (tmp_path / "logs" / "naig-seed1-lr0.003.csv").read_text().splitlines()
    assert rows[0] == "step,time_s,train_loss,val_loss,pi_0,pi_1" and len(rows) == 7
    assert rows[3].split(",")[3] != "" and rows[1].split(",")[3] == ""  # val every 3 steps
    assert doc["environment"]["torch"] == torch.__version__ and doc["schema_version"] == 5


def test_progress_lines_without_a_terminal() -> None:
    out = _run("--strategies", "hogwild")
    lines = [ln for ln in out.stderr.splitlines() if ln.startswith("hogwild seed 0")]
    ends = [ln for ln in lines if ln.endswith("steps/s (run 1 of 1)")]  # one line per finished run
    assert len(ends) == 1 and ends[0] == lines[-1] and ends[0].startswith("hogwild seed 0 lr 0.001 step 6/6")
    assert all(" val " in ln for ln in lines[:-1])  # any other: a heartbeat at an evaluation (a slow machine)


# Local updates and gossip (docs/design.md §13)
LOCAL = ["simulate", "--steps", "4", "--seeds", "1", "--data-bytes", "200000", "--eval-every", "2",
         "--arrivals", "exp:1,exp:1,exp:2,exp:4"]


@pytest.mark.parametrize(("args", "message"), [
    (["--strategies", "diloco"], "--strategies 'diloco': runs on the simulated clock and needs --arrivals"),
    (["--local-steps", "5"], "--local-steps 5: needs --arrivals"),
    (["--set", "arrivals.bandwidth=1e6"], "--set arrivals.bandwidth=1e6: needs --arrivals"),
    (["--arrivals", "exp:1,exp:2", "--strategies", "hogwild", "--set", "arrivals.local.outer_lr=0.5"],
     "--set arrivals.local.outer_lr=0.5: applies to local-update"),
    (["--arrivals", "exp:1,exp:2", "--local-steps", "0"], "--local-steps 0: use one int >= 1"),
    (["--arrivals", "exp:1,exp:2", "--local-steps", "ten"], "--local-steps 'ten': use one int >= 1"),
    (["--arrivals", "exp:1,exp:2", "--strategies", "gasloc", "--set", "arrivals.local.outer_momentum=1"],
     "--set arrivals.local.outer_momentum=1: use a value in [0, 1)"),
    (["--arrivals", "exp:1,exp:2", "--set", "arrivals.bandwidth=fast"], "--set arrivals.bandwidth=fast: "),
    (["--arrivals", "exp:1,exp:2", "--strategies", "diloco", "--set", "arrivals.local.topology=ring"],
     "--set arrivals.local.topology=ring: applies to gasloc only"),
    (["--arrivals", "exp:1,exp:2,exp:1", "--strategies", "gasloc",
      "--set", "arrivals.local.topology=two-peer", "--set", "arrivals.local.gossip_step=0.75"],
     "--set arrivals.local.gossip_step=0.75: a two-peer graph of 3 workers has degree up to 2"),
    (["--arrivals", "exp:1,exp:2", "--strategies", "diloco", "--set", "arrivals.local.gossip_step=0.5"],
     "--set arrivals.local.gossip_step=0.5: applies to gasloc only"),
    (["--arrivals", "exp:1,exp:2", "--strategies", "gasloc", "--set", "arrivals.local.form=nesterov"],
     "--set arrivals.local.form=nesterov"),
    (["--arrivals", "exp:1,exp:2", "--strategies", "gossip-adam", "--faults", "0:nan"],
     "--faults '0:nan': gossip-adam has no server"),
    (["--arrivals", "exp:1,exp:2", "--set", "arrivals.bandwidth=1e6,-1"],
     "--set arrivals.bandwidth=1e6,-1: use bytes per second > 0"),
    (["--arrivals", "exp:1,exp:2", "--strategies", "gasloc", "--set", "arrivals.local.topology=two-peer"],
     "--set arrivals.local.topology=two-peer: needs at least 3 workers"),
    (["--arrivals", "exp:1,exp:2,exp:1", "--strategies", "gasloc", "--set", "arrivals.local.topology=ring",
      "--set", "arrivals.local.gossip_step=2"],
     "--set arrivals.local.gossip_step=2: use a value in (0, 1/d] for the largest degree d of a ring graph "
     "(d = 2"),
    (["--arrivals", "exp:1,exp:1,exp:2,exp:4", "--strategies", "gasloc", "--set", "arrivals.bandwidth=1,2"],
     "--set arrivals.bandwidth=1,2: lists 2 values but --arrivals lists 4"),
])
def test_local_update_usage_errors(args: list[str], message: str) -> None:
    out = RUNNER.invoke(app, ["simulate", "--steps", "2", "--seeds", "1", *args])
    assert out.exit_code == 2 and out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {message}"), lines


def test_local_updates_report_bytes_seconds_and_samples() -> None:
    args = [*LOCAL, "--strategies", "diloco,gasloc,gossip-adam,local-sgd,allreduce,diloco-naig,naig",
            "--local-steps", "2", "--set", "arrivals.bandwidth=1e6", "--set", "arrivals.local.topology=ring",
            "--set", "arrivals.local.gossip_step=0.25"]
    doc = json.loads(RUNNER.invoke(app, [*args, "--json"]).stdout)
    arrivals = doc["config"]["arrivals"]
    assert arrivals["local"]["steps"] == [2] and arrivals["bandwidth"] == [1e6]
    for s in doc["summaries"]:
        assert s["curve_samples"][-1] == 4 * 4 * 8 and len(s["curve_bytes"]) == len(s["curve_seconds"])
        assert len(s["bytes_per_worker"]) == 4 and s["curve_seconds"][-1] > 0
    runs = {r["strategy"]: r for r in doc["runs"]}
    assert runs["diloco-naig"]["local"]["weighting"] == "gibbs"
    assert runs["gasloc"]["local"]["topology"] == "ring" and runs["gasloc"]["local"]["gossip_step"] == 0.25
    assert runs["gossip-adam"]["local"]["topology"] == "async-pairs"
    assert runs["gasloc"]["bytes_per_worker"] == [2 * 2 * 4 * doc["n_params"]] * 4  # 2 rounds, 2 peers, 4n
    assert runs["naig"]["local"] is None and runs["naig"]["staleness"]["mean"] >= 0  # the gradient rule
    assert runs["diloco"]["local"]["outer"] == "sgd-nesterov" and runs["diloco"]["local"]["rounds"] == 2
    at = args.index("--strategies") + 1
    two = [*args[:at], "gasloc,gossip-adam", *args[at + 1:]]
    text = RUNNER.invoke(app, two, env={"COLUMNS": "200"}).stdout  # the table: the two rules its lines name
    assert "bytes sent per worker" in text
    assert "  gossip-adam (adamw → adam lr 0.001 m 0.9; H 2,2,2,2): " in text
    assert "  gasloc (adamw → mixed gossip on ring lr 0.7 m 0.9; H 2,2,2,2): " in text


@pytest.mark.parametrize(("jobs", "stop"), [("1", "SIGINT"), ("2", "SIGINT"), ("1", "SIGTERM")])
def test_ctrl_c_keeps_the_finished_runs_and_the_json_stays_valid(jobs: str, stop: str, tmp_path: Path,
                                                                  tmp_path_factory: pytest.TempPathFactory
                                                                  ) -> None:
    """SIGINT (or SIGTERM, a scheduler's stop) after runs finished: exit 130, a valid JSON document with
    finished runs only (one process: in planned order, the first recorded once the second ends; two
    side by side: the runs whose results had come back when the signal did, the children stopped).
    --log-dir holds a CSV under a run's name only once it has every step; a cut run's is
    NAME.partial.csv (it was cut short under the finished name, replacing an earlier complete log)
    with the steps it ran."""
    import signal

    where = tmp_path_factory.mktemp("cwd")  # (tmp_path holds the logs only)
    proc = _warm_simulate("--steps", "40", "--seeds", "3", "--data-bytes", "200017", "--eval-every", "0",
                          "--set", "eval_batches=4", "--strategies", "hogwild,naig", "--lags", "0,2",
                          "--json", "--jobs", jobs, "--log-dir", str(tmp_path), cwd=where)  # 200017: a mark
    try:
        lines = [proc.stderr.readline() for _ in range(2 if jobs == "1" else 4)]  # runs' last steps
        proc.send_signal(getattr(signal, stop))
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert all(" step 40/40 " in line for line in lines), lines
    if jobs == "1":
        assert lines[0].startswith("hogwild seed 0 ") and lines[1].startswith("naig seed 0 "), lines
    assert proc.returncode == 130, err
    doc = json.loads(out)
    assert doc["interrupted"] is True and 1 <= len(doc["runs"]) < 6
    finished = [(r["strategy"], r["seed"]) for r in doc["runs"]]
    assert len(set(finished)) == len(finished) and (jobs == "2" or finished[0] == ("hogwild", 0)), finished
    assert all(r["updates"] == 40 and r["final_val_loss"] < 5.0 for r in doc["runs"])
    assert "error: interrupted" in err and "Traceback" not in err
    time.sleep(0.5)
    assert not _processes_with(f"--jobs\x00{jobs}\x00"), "a run process outlived the CLI"
    assert_no_leftovers(str(where), what="a run process of the CLI")
    logs = {p.name for p in tmp_path.iterdir()}
    whole = {n for n in logs if not n.endswith(".partial.csv")}
    assert whole >= {f"{s}-seed{k}-lr0.001.csv" for s, k in finished}, logs  # (one may end unreported)
    assert all(len((tmp_path / n).read_text().splitlines()) == 41 for n in whole)  # 40 steps, every one
    for name in logs - whole:  # a cut run's log: its header and whole rows (SIGKILLed children left it empty)
        lines = (tmp_path / name).read_text().splitlines()
        assert lines and len({line.count(",") for line in lines}) == 1, (name, lines[-2:])


def _processes_with(marker: str) -> list[int]:
    """Live processes whose command line holds ``marker`` (forked children keep their parent's)."""
    pids = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            line = (proc / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if "naig_cli\x00simulate" in line and "200017" in line and marker in line:
            pids.append(int(proc.name))
    return pids


CONFIG_TOML = """
strategies = ["naig", "hogwild"]
steps = 4
seeds = 1
data_bytes = 200000
eval_every = 2

[rules]
beta = 0.5

[arrivals]
compute = "const:1,exp:2"
window = 1
"""


def test_config_file_round_trip(tmp_path: Path) -> None:
    """--config reads the tree; a result's config block loads back and reproduces the run."""
    path = tmp_path / "run.toml"
    path.write_text(CONFIG_TOML)
    first = RUNNER.invoke(app, ["simulate", "--config", str(path), "--json"])
    assert first.exit_code == 0, first.output
    doc = json.loads(first.stdout)
    assert doc["config"] == SimulateConfig.load(path).to_dict()
    assert doc["config"]["arrivals"]["compute"] == "const:1,exp:2" and doc["config"]["rules"]["beta"] == 0.5
    saved = tmp_path / "result.json"
    saved.write_text(first.stdout)
    again = json.loads(RUNNER.invoke(app, ["simulate", "--config", str(saved), "--json"]).stdout)
    assert _numbers(again) == _numbers(doc)  # the same runs, number for number
    more = RUNNER.invoke(app, ["simulate", "--config", str(path), "--seeds", "2", "--json"])
    more = json.loads(more.stdout)
    assert more["config"]["seeds"] == 2 and more["config"]["arrivals"] == doc["config"]["arrivals"]


def test_flags_that_switch_the_config_files_setting_say_what_of_it_is_not_used(tmp_path: Path) -> None:
    path = tmp_path / "run.toml"
    path.write_text(CONFIG_TOML)
    r = RUNNER.invoke(app, ["simulate", "--config", str(path), "--lags", "0,1", "--steps", "1", "--json"])
    assert r.exit_code == 0, r.output
    assert "warning: runs fixed lags, not the arrivals setting: --arrivals is not used (the --config " \
        "file's, overridden here)" in " ".join(r.stderr.split())  # (its window = 1 is the default)
    assert json.loads(r.stdout)["config"]["lags"]["lags"] == [0, 1]
    kept = RUNNER.invoke(app, ["simulate", "--config", str(path), "--steps", "1", "--json"])
    assert kept.exit_code == 0 and "not used" not in kept.stderr


@pytest.mark.parametrize(("content", "args", "needles"), [
    (None, [], ["--config", "cannot read it"]),
    ("steps = [", [], ["--config", "is not valid TOML"]),
    ("stepz = 3", [], ["stepz", "unknown key"]),
    ("[arrivals]\ncompute = 'exp:1,exp:1'\n[lags]\nlags = [0, 1]", [], ["give one setting"]),
    ("[arrivals]\ncomputer = 'exp:1'", [], ["computer", "is not a key of [arrivals]"]),
    (CONFIG_TOML, ["--lags", "0,1", "--arrivals", "exp:1,exp:1"], ["--lags 0,1", "belongs to fixed lags"]),
    (CONFIG_TOML, ["--nproc", "3"], ["--nproc 3", "needs --engine distributed"]),
])
def test_bad_config_files_are_one_line_errors(tmp_path: Path, content: str | None, args: list[str],
                                              needles: list[str]) -> None:
    path = tmp_path / "run.toml"
    if content is not None:
        path.write_text(content)
    before = sorted(tmp_path.iterdir())
    r = run_naig("simulate", "--config", str(path), *args)
    assert_one_line_error(r, 2, *needles)
    assert sorted(tmp_path.iterdir()) == before  # nothing written


def test_help_shows_panels_and_examples() -> None:
    text = RUNNER.invoke(app, ["simulate", "--help"], env={"COLUMNS": "200"}).stdout
    for panel in ("Common", "Rules", "Fixed lags", "Arrivals", "Local updates", "Distributed", "Output"):
        assert f"─ {panel}" in text, panel
    assert "Examples" in text and "naig simulate --arrivals exp:1,exp:1,exp:2,exp:4" in text


def test_no_command_has_more_than_30_options() -> None:
    """The rest of the config tree is reached with --set KEY=VALUE (huggingface_hub's largest command: 30)."""
    import typer.main

    for command in typer.main.get_command(app).commands.values():
        options = [p for p in command.params if p.param_type_name == "option" and not p.hidden]
        assert len(options) <= 30, (command.name, len(options))


@pytest.mark.parametrize(("args", "needle"), [
    (["--set", "steps"], "--set steps: has no value; use KEY=VALUE"),
    (["--set", "=5"], "--set =5: use KEY=VALUE with a key of the config file"),
    (["--set", "nope=1"], "--set nope=1: the config has no key nope; its keys are arrivals, batch_size"),
    (["--set", "rules.nope=1"], "rules has no key nope; its keys are beta, byzantine, clip, dc_lambda"),
    (["--set", "steps.x=1"], "--set steps.x=1: steps is a value, not a table"),
    (["--set", "rules"], "--set rules: is a table; set one of its keys"),
    (["--set", "arrivals.local=1"], "is a table; set one of its keys (form, gossip_step, outer_lr"),
    (["--set", "steps=3", "--steps", "4"], "--set steps=3: sets what --steps gives too; give it once"),
    (["--set", "rules.clip=1", "--set", "rules.clip=2"], "--set rules.clip=2: sets a key set before"),
    (["--set", "lags.warmup_theta0=maybe"], "--set lags.warmup_theta0=maybe: use true or false"),
    (["--set", "arrivals.uplink=const:0.1"], "--set arrivals.uplink=const:0.1: needs --arrivals"),
    (["--lags", "0,1", "--set", "distributed.window=2"],
     "--set distributed.window=2: needs --arrivals or --engine distributed; fixed lags have no window"),
    (["--strategies", "dc-asgd", "--set", "rules.dc-lambda=-1"], "--set rules.dc-lambda=-1: DC-ASGD's λ"),
])
def test_set_refusals_are_one_line_exit_2(args: list[str], needle: str) -> None:
    out = _run(*args)
    assert out.exit_code == 2, out.output
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], lines


def test_set_reaches_every_part_of_the_tree_and_runs(tmp_path: Path) -> None:
    """--set K=V is the line K = V of a config file: the values land in the run's config (its --json),
    a comma list fills a list key, a switch needs no value, and --set may mend what a flag alone breaks
    (trimmed-mean with 2 workers needs f = 0, not the default 1)."""
    r = run_naig("simulate", "--lags", "0,0", "--strategies", "trimmed-mean,hogwild", "--steps", "2",
                 "--seeds", "1",
                 "--data-bytes", "100000", "--eval-every", "0", "--set", "rules.byzantine=0",
                 "--set", "sketch-seed=7", "--set", "lags.warmup_theta0", "--set", "lr=3e-4,1e-3", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    cfg = json.loads(r.stdout)["config"]
    assert cfg["rules"]["byzantine"] == 0 and cfg["sketch_seed"] == 7
    assert cfg["lags"]["warmup_theta0"] is True and cfg["lr"] == [3e-4, 1e-3]
    bad = run_naig("simulate", "--lags", "0,0", "--strategies", "trimmed-mean", "--steps", "2")
    assert bad.returncode == 2 and "--set rules.byzantine" in bad.stderr, bad.stderr


def test_nan_losses_are_divergences_with_their_steps_in_every_setting() -> None:
    """A huge lr: every run ends non-finite, in fixed lags and with arrivals; each is counted as
    diverged at a named step (no blank step list) and the command exits 1."""
    for setting in (["--lags", "0,1"], ["--arrivals", "exp:1,exp:1"]):
        r = run_naig("simulate", *setting, "--strategies", "hogwild,naig", "--optimizer", "sgd", "--lr",
                     "1e8", "--steps", "10", "--seeds", "2", "--data-bytes", "200000", "--json")
        assert_one_line_error(r, 1, "4 of 4 runs diverged")
        doc = json.loads(r.stdout)
        assert all(isinstance(run["diverged_at"], int) for run in doc["runs"]), doc["runs"]
        assert "at step None" not in r.stderr and "at step ;" not in r.stderr


def test_diverged_runs_show_a_dash_at_the_points_they_never_reached() -> None:
    r = RUNNER.invoke(app, ["simulate", "--arrivals", "exp:1,exp:1", "--strategies", "hogwild", "--optimizer",
                            "sgd", "--lr", "1e8", "--steps", "4", "--seeds", "1", "--eval-every", "2",
                            "--data-bytes", "200000"], env={"COLUMNS": "200"})
    assert r.exit_code == 1
    row = next(line for line in r.stdout.splitlines() if line.startswith("hogwild") and "@0u" in line)
    assert row.split()[-2:] == ["—", "—"] and len(row.split()) == 5  # name, the untrained point (2 words),
    #                                                                       then — for #1 and #2


def test_naig_only_header_lines_are_left_out_without_a_naig_strategy() -> None:
    """reference, β and the 56 B routing signal mean nothing to a gasloc or hogwild run."""
    base = ["simulate", "--arrivals", "const:1,const:1", "--steps", "2", "--seeds", "1",
            "--data-bytes", "200000"]
    for strategies, shown in (("gasloc", False), ("hogwild", False), ("hogwild,naig", True)):
        r = RUNNER.invoke(app, [*base, "--strategies", strategies, "--local-steps", "1"]
                          if strategies == "gasloc" else [*base, "--strategies", strategies])
        assert r.exit_code == 0, r.output
        for word in ("reference ema", "β auto", "routing signal 56 B"):
            assert (word in r.stdout) == shown, (strategies, word, r.stdout)


def test_the_fix_a_refusal_suggests_runs_as_written() -> None:
    """fresh-only in arrival mode suggested `--set rules.max_staleness 0`, which typer refuses (an extra
    argument); the suggestion is now KEY=VALUE, and running it works."""
    base = ("simulate", "--arrivals", "exp:1,exp:1", "--steps", "2", "--seeds", "1", "--eval-every", "0")
    r = run_naig(*base, "--strategies", "fresh-only")
    assert_one_line_error(r, 2, "--strategies", "--set rules.max_staleness=0")
    fix = r.stderr.split("use ")[-1].split()  # ['drop-stale', 'with', '--set', 'rules.max_staleness=0']
    assert fix[0] == "drop-stale" and fix[2:] == ["--set", "rules.max_staleness=0"]
    ok = run_naig(*base, "--strategies", fix[0], *fix[2:])
    assert ok.returncode == 0, ok.stderr


def test_without_a_terminal_the_first_progress_line_comes_after_2_s_then_at_most_every_10_s(
        capsys: pytest.CaptureFixture) -> None:
    """Progress lines without a terminal (stderr captured: not a TTY): at an evaluation once 2 s have
    passed (the rate, early), then at evaluations at most every 10 s after the last line, and as each
    run ends."""
    from naig.simulate.runs import StepEvent

    now = [100.0]
    report = cli.progress_reporter(lambda *_: pytest.fail("a bar without a terminal"), runs=2,
                                   clock=lambda: now[0])
    said = []
    for at, step, val in [(1.0, 10, 2.5), (1.9, 19, 2.45), (2.0, 20, None), (2.1, 21, 2.4), (5.0, 40, 2.3),
                          (12.0, 50, 2.2), (12.2, 60, 2.1), (14.0, 100, 2.0)]:
        now[0] = 100.0 + at
        report(StepEvent("naig", 0, 1e-3, step, 100, val, seconds=at))
        said += [(at, line) for line in capsys.readouterr().err.splitlines()]
    assert [at for at, _ in said] == [2.1, 12.2, 14.0], said
    assert said[0][1] == "naig seed 0 lr 0.001 step 21/100 val 2.4000 10.0 steps/s"
    assert said[-1][1].endswith("step 100/100 val 2.0000 7.1 steps/s (run 1 of 2)")
