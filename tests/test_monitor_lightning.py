"""naig.monitor.lightning: ``MonitorCallback`` in real Lightning fits on 3 gloo ranks, and alone.

tests/monitor_lightning_ranks.py runs several ``Trainer.fit`` of 12 steps each on 3 processes
(``DDPStrategy``, CPU; the detectors' window 8); rank 2's loss is ×1000 at step 12. Measured there:
rank 2 named alone at step 12 on every rank (energy and norm transient scores), in every action;
``skip`` and ``raise`` leave the parameters of step 12 unchanged on every rank; ``log`` ends
bit-identical to the fit without the callback; a fit resumed from a checkpoint after step 6 decides
exactly as the uninterrupted one and ends with the parameters of the same resume without the
callback; a resume without the callback's state does not name rank 2 (its history is too short);
under ``ModelParallelStrategy`` (FSDP2) rank 2 is named at step 12 in its FSDP module and ``skip``
leaves every rank's shards unchanged. Skipped without the ``lightning`` extra.
"""

from __future__ import annotations

import types
import warnings

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from naig.errors import UsageError
from naig.monitor import Monitor
from tests.conftest import flagged_steps, needs, run_ranks

needs("lightning", "the Lightning integration needs the lightning extra")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> dict:
    return run_ranks("tests.monitor_lightning_ranks", tmp_path_factory.mktemp("monitor_lightning"),
                     timeout=420)


def _views(run: dict) -> dict:
    """``flagged_steps`` of a run whose ``flagged`` is (K ranks, steps, K)."""
    return flagged_steps({"flagged": [list(step) for step in zip(*run["flagged"], strict=True)]})


@pytest.mark.parametrize("kind", ["log", "skip", "raise"])
def test_every_rank_names_the_x1000_rank_at_its_step(ranks: dict, kind: str) -> None:
    run, bad, step, world = ranks["runs"][kind], ranks["bad_rank"], ranks["bad_step"], ranks["world"]
    expected = [1.0 if r == bad else 0.0 for r in range(world)]
    assert _views(run) == {step: [expected] * world}
    assert run["describe"][step - 1].startswith(f"step {step}: rank {bad} on {run['hosts'][bad]} in bucket ")


def test_log_mode_is_bit_identical_to_the_fit_without_the_callback(ranks: dict) -> None:
    runs = ranks["runs"]
    assert runs["log"]["params"] == runs["plain"]["params"]
    assert runs["log"]["unchanged"] == [[0.0]] * ranks["world"]  # the ×1000 step was applied


def test_skip_and_raise_leave_the_parameters_unchanged_on_every_rank(ranks: dict) -> None:
    world = ranks["world"]
    for kind in ("skip", "raise"):
        assert ranks["runs"][kind]["unchanged"] == [[1.0]] * world, kind
    assert ranks["runs"]["skip"]["error"] == [[0.0]] * world
    assert ranks["runs"]["raise"]["error"] == [[1.0]] * world
    assert "no update was applied" in ranks["runs"]["raise"]["error_text"]


def test_under_fsdp2_the_rank_is_named_in_its_module_and_its_step_skipped(ranks: dict) -> None:
    run, bad, step, world = ranks["runs"]["fsdp2"], ranks["bad_rank"], ranks["bad_step"], ranks["world"]
    expected = [1.0 if r == bad else 0.0 for r in range(world)]
    assert _views(run) == {step: [expected] * world}
    where = f"step {step}: rank {bad} on {run['hosts'][bad]} in module net."
    assert run["describe"][step - 1].startswith(where)
    assert run["unchanged"] == [[1.0]] * world and run["error"] == [[0.0]] * world


def test_the_decisions_reach_lightnings_loggers_and_callback_metrics(ranks: dict) -> None:
    run, step = ranks["runs"]["log"], ranks["bad_step"]
    logged = dict((s, m) for s, m in run["logged"])  # rank 0's logger: one row per step
    assert sorted(logged) == list(range(1, step + 1))
    assert logged[step]["naig_monitor/flagged_ranks"] == 1.0 and logged[step]["naig_monitor/max_rank"] == 2.0
    assert all(logged[s]["naig_monitor/flagged_ranks"] == 0.0 for s in range(1, step))
    assert "naig_monitor/max_score" in run["callback_metrics"]
    assert run["detached"]  # the end of fit detaches


def test_a_resumed_fit_keeps_the_detectors_state(ranks: dict) -> None:
    runs, step, resume = ranks["runs"], ranks["bad_step"], ranks["resume_step"]
    assert len(runs["first"]["describe"]) == resume
    resumed = runs["resumed"]["describe"]
    assert resumed == runs["log"]["describe"][resume:]  # the steps after the checkpoint, decided alike
    assert runs["resumed"]["decision_steps"] == step
    assert _views(runs["resumed"]) == {step - resume: _views(runs["log"])[step]}
    assert not _views(runs["fresh"])  # without the state: 5 steps of history, rank 2 not named


def test_a_resumed_fit_ends_where_the_resumed_fit_without_the_callback_does(ranks: dict) -> None:
    """The callback (log) changes no parameter on resume either. A resumed fit and the uninterrupted
    one differ in the last bits (27 of 420 parameters by 3e-8, measured) with or without the callback:
    Lightning's and DDP's resume, not the monitor's."""
    runs = ranks["runs"]
    assert runs["resumed"]["params"] == runs["plain_resumed"]["params"]
    plain = zip(runs["plain_resumed"]["params"], runs["plain"]["params"], strict=True)
    assert max(abs(a - b) for a, b in plain) < 1e-6


# ----------------------------------------------------------------- one process


# (lightning is imported here, by the tests that run in this process, not when the module is
# collected: 1.7-3.5 s of CPU in every pytest-xdist worker, where its fits run in other processes)
def _tiny() -> torch.nn.Module:
    """A new LightningModule: one linear layer, SGD."""
    import lightning.pytorch as pl

    class Tiny(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(3, 2)

        def training_step(self, batch: list[torch.Tensor], index: int) -> torch.Tensor:
            return self.net(batch[0]).square().mean()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return Tiny()


def _trainer(callback: object, **kwargs: object) -> object:
    import lightning.pytorch as pl

    return pl.Trainer(accelerator="cpu", max_steps=2, logger=False, callbacks=[callback],
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      **kwargs)


def test_one_process_says_so_once_and_trains() -> None:
    from naig.monitor.lightning import ONE_PROCESS, MonitorCallback

    cb = MonitorCallback(Monitor(action="raise"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _trainer(cb, devices=1).fit(_tiny(), DataLoader(TensorDataset(torch.ones(4, 3)), batch_size=2))
    assert [str(w.message) for w in caught if str(w.message) == ONE_PROCESS] == [ONE_PROCESS]
    assert cb.watch is None and cb.monitor.decision is None


def test_a_strategy_it_cannot_watch_is_refused_in_lightnings_error_type() -> None:
    from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy
    from lightning.pytorch.utilities.exceptions import MisconfigurationException

    from naig.monitor.lightning import MonitorCallback

    cb = MonitorCallback()
    averaging = _trainer(cb, devices=1, strategy=DDPStrategy(model_averaging_period=4))
    fsdp = types.SimpleNamespace(strategy=FSDPStrategy())  # Lightning builds FSDP only on a GPU
    for trainer, needle in ((fsdp, "FSDPStrategy wraps with FSDP1"), (averaging, "model averaging")):
        with pytest.raises(MisconfigurationException, match=needle) as err:
            cb.setup(trainer, _tiny(), "fit")
        assert "\n" not in str(err.value)


def test_bad_arguments_are_usage_errors() -> None:
    from naig.monitor.lightning import MonitorCallback

    with pytest.raises(UsageError) as err:
        MonitorCallback("log")
    assert err.value.field == "monitor"
    with pytest.raises(UsageError) as err:
        MonitorCallback(per_rank=1)
    assert err.value.field == "per_rank"
    # checked when built, not at fit start (never, on one process) (a review, 2026-12-07)
    for kwargs, field in (({"exact": "yes"}, "exact"), ({"per_bucket": 1}, "per_bucket"),
                          ({"exact": True, "monitor": Monitor(action="exclude")}, "exact")):
        with pytest.raises(UsageError) as err:
            MonitorCallback(**kwargs)
        assert err.value.field == field


def test_a_lightning_optimizer_is_attached_through_its_torch_optimizer() -> None:
    """``LightningOptimizer`` copies its optimizer's ``__dict__``, step hooks included: attached as it was,
    ``skip`` applied, but ``detach`` then warned that it had not (a review, 2026-12-07)."""
    from lightning.pytorch.core.optimizer import LightningOptimizer
    from torch.nn.parallel import DistributedDataParallel

    from naig.monitor import MonitorHook, monitor_comm_hook
    from tests.conftest import process_group_in_this_process

    with process_group_in_this_process():
        model = torch.nn.Linear(3, 2)
        ddp = DistributedDataParallel(model)
        hook = MonitorHook(model, Monitor(action="skip", window=3))
        ddp.register_comm_hook(state=hook, hook=monitor_comm_hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        hook.attach(LightningOptimizer(opt))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ddp(torch.ones(4, 3)).square().sum().mul(float("nan")).backward()
        before = [p.detach().clone() for p in model.parameters()]
        opt.step()
        assert hook.decision.flagged
        assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # applied: nothing to say
            hook.detach()


def test_exact_statistics_under_fsdp2_are_refused_not_dropped() -> None:
    """``ModelParallelStrategy`` built the FSDP2 monitor without ``exact``, silently (a review,
    2026-12-07)."""
    from lightning.pytorch.strategies import ModelParallelStrategy

    from naig.monitor.lightning import MonitorCallback

    trainer = types.SimpleNamespace(strategy=ModelParallelStrategy())  # its set-up needs several processes
    with pytest.raises(UsageError, match="^exact=True: exact statistics are DDP's only") as err:
        MonitorCallback(exact=True).on_fit_start(trainer, _tiny())
    assert "\n" not in str(err.value)
