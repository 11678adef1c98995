"""The config tree (naig.simulate.config): one setting, options mapped once, files, wrong types."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from naig.errors import UsageError
from naig.simulate import SimulateConfig
from naig.simulate.config import OPTIONS
from naig.simulate.results import SCHEMA_VERSION
from naig.simulate.settings import ArrivalsSetting, DistributedSetting, LagsSetting, LocalUpdates

TREES = {
    "lags": dict(lags=(0, 3), warmup_theta0=True, steps=7, faults=("1:noise:0.5@2",), beta=0.5),
    "arrivals": dict(arrivals="exp:1,gamma:2:3", uplink="const:0.1", mode="non-blocking", window=2,
                     strategies=("naig", "diloco", "diloco-naig", "gasloc"), local_steps=(3, 2), outer_lr=0.5,
                     bandwidth=(1e6,), clip=2.0, topology="complete", gossip_step=0.5,
                     gasloc_form="summarised"),
    "distributed": dict(engine="distributed", nproc=4, window=3, slowdown=(1, 2, 3), timeout=5,
                        faults=("2:kill@4", "0:scale:3"), strategies=("naig", "hogwild")),
}


@pytest.mark.parametrize("name", list(TREES))
def test_the_tree_round_trips_through_dict_json_and_toml(name: str, tmp_path: Path) -> None:
    cfg = SimulateConfig.from_options(**TREES[name])
    assert cfg.setting.NAME == name
    tree = cfg.to_dict()
    assert set(tree) & {"lags", "arrivals", "distributed"} == {name}  # exactly one setting
    assert SimulateConfig.from_dict(tree) == cfg
    (tmp_path / "c.json").write_text(json.dumps(tree))
    assert SimulateConfig.load(tmp_path / "c.json") == cfg
    assert SimulateConfig.from_options(**cfg.to_options()) == cfg


def test_toml_file_is_the_same_tree(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('steps = 9\nstrategies = ["naig", "diloco"]\n[rules]\nbeta = 2.0\n'
                    '[arrivals]\ncompute = "exp:1,exp:2"\n[arrivals.local]\nsteps = [4]\n')
    cfg = SimulateConfig.load(path)
    assert isinstance(cfg.setting, ArrivalsSetting) and cfg.setting.local.steps == (4,)
    assert cfg.rules.beta == 2.0 and cfg.steps == 9 and cfg.setting.inner_steps() == (4, 4)


def test_every_option_maps_to_one_path_of_the_tree() -> None:
    fields = {"": {f for f in SimulateConfig.__dataclass_fields__} - {"rules", "setting"},
              "rules": set(SimulateConfig().rules.__dataclass_fields__),
              "lags": set(LagsSetting.__dataclass_fields__),
              "arrivals": set(ArrivalsSetting.__dataclass_fields__),
              "arrivals.local": set(LocalUpdates.__dataclass_fields__),
              "distributed": set(DistributedSetting.__dataclass_fields__),
              "setting": {"window"}}
    for option, (section, key) in OPTIONS.items():
        assert key in fields[section], option
    paths = list(OPTIONS.values())
    assert len(set(paths)) == len(paths)  # one option per path


@pytest.mark.parametrize(("options", "field", "needle"), [
    (dict(lags=(0, 1), arrivals="exp:1,exp:1"), "lags", "belongs to fixed lags, and `arrivals` chose"),
    (dict(save_at=(1,), engine="distributed", nproc=3), "save_at", "`engine` distributed chose"),
    (dict(uplink="exp:1"), "uplink", "needs `arrivals`"),
    (dict(local_steps=(3,)), "local_steps", "needs `arrivals`"),
    (dict(window=2), "window", "fixed lags have no window"),
    (dict(nproc=3), "nproc", "needs `engine` distributed"),
    (dict(timeout=3.0), "timeout", "needs `engine` distributed"),
    (dict(engine="distributed", nproc=3, mode="blocking"), "mode", "not available with `engine` distributed"),
    (dict(engine="threads"), "engine", "use simulated or distributed"),
    (dict(stepz=3), "stepz", "unknown option"),
])
def test_options_of_another_setting_are_refused_in_one_line(options: dict, field: str, needle: str) -> None:
    with pytest.raises(UsageError) as info:
        SimulateConfig.from_options(**options)
    assert info.value.field == field and needle in info.value.message and "\n" not in str(info.value)


@pytest.mark.parametrize(("options", "field"), [
    (dict(steps="3"), "steps"), (dict(seeds=2.5), "seeds"), (dict(lags="0,1"), "lags"),
    (dict(lr="1e-3"), "lr"), (dict(faults=3), "faults"), (dict(strategies=[1, 2]), "strategies"),
    (dict(data_bytes="x"), "data_bytes"), (dict(arrivals=3), "arrivals"), (dict(beta=[1]), "beta"),
    (dict(engine="distributed", nproc="3"), "nproc"), (dict(arrivals="exp:1,exp:1", window="2"), "window"),
    (dict(byzantine=-1), "byzantine"), (dict(dc_lambda=float("nan")), "dc_lambda"),
    (dict(arrivals="exp:1", strategies=("diloco",), outer_momentum=1.5), "outer_momentum"),
    (dict(engine="distributed", nproc=3, slowdown="fast"), "slowdown"),
    (dict(engine="distributed", nproc=3, timeout=1e-7), "timeout"),  # gloo read 0 ms: a traceback
    (dict(engine="distributed", nproc=3, timeout=30.5), "timeout"),
    (dict(eval_batches=0), "eval_batches"), (dict(log_dir=5), "log_dir"),
    (dict(data=""), "data"), (dict(data="  "), "data"),  # was read as ".", a directory (exit 1)
])
def test_wrong_types_and_values_are_usage_errors_naming_the_field(options: dict, field: str) -> None:
    with pytest.raises(UsageError) as info:
        SimulateConfig.from_options(**options)
    assert info.value.field == field, str(info.value)


def test_not_given_differs_from_the_default() -> None:
    """An option given at its default value still chooses (and conflicts with) its setting."""
    with pytest.raises(UsageError) as info:
        SimulateConfig.from_options(lags=(0, 10, 20, 35), arrivals="exp:1,exp:1")  # the default lags
    assert info.value.field == "lags"
    assert SimulateConfig.from_options(lags=None, arrivals="exp:1,exp:1").setting.NAME == "arrivals"


def test_with_options_keeps_or_switches_the_setting() -> None:
    base = SimulateConfig.from_options(**TREES["arrivals"])
    assert base.with_options(seeds=5).setting == base.setting
    lags = base.with_options(arrivals=None, strategies=("naig",))
    assert isinstance(lags.setting, LagsSetting) and lags.rules == base.rules  # rule options stay
    assert base.with_options(lags=(0, 1), strategies=("naig",)).setting == LagsSetting(lags=(0, 1))  # chosen
    assert base.with_options(engine="simulated").setting == base.setting  # not another setting
    with pytest.raises(UsageError) as info:
        base.with_options(lags=(0, 1), arrivals="exp:1,exp:1")  # two settings in one change
    assert info.value.field == "lags"
    with pytest.raises(UsageError) as info:
        base.with_options(nproc=3)  # an option of another setting, without choosing it
    assert info.value.field == "nproc"
    switched = base.with_options(engine="distributed", nproc=3, strategies=("naig",))
    assert switched.setting.NAME == "distributed"


def test_a_switched_setting_names_the_options_it_drops() -> None:
    """``dropped_by``: the old setting's options not at their default, named once the setting moves;
    ``window`` is carried from arrivals into the distributed engine (so not dropped there)."""
    base = SimulateConfig.from_options(arrivals="exp:1,exp:2", bandwidth=(1e5,), window=2)
    lags = base.with_options(lags=(0, 3))
    assert base.dropped_by(lags) == "runs fixed lags, not the arrivals setting: `arrivals`, `window`, " \
        "`bandwidth` are not used"
    dist = base.with_options(engine="distributed", nproc=3)
    assert dist.setting.window == 2 and "`window`" not in base.dropped_by(dist)
    assert base.dropped_by(base.with_options(seeds=2)) is None  # the same setting
    plain = SimulateConfig.from_options()  # fixed lags at their defaults: nothing of its own to drop
    assert plain.dropped_by(plain.with_options(arrivals="exp:1")) is None
    two = SimulateConfig.from_options(lags=(0, 2))
    assert "`lags`" in two.dropped_by(two.with_options(arrivals="exp:1"))


def test_two_setting_tables_are_one_line_naming_both() -> None:
    with pytest.raises(UsageError) as info:
        SimulateConfig.from_dict({"lags": {"lags": [0, 1]}, "arrivals": {"compute": "exp:1"}})
    assert info.value.field == "config" and "[lags] and [arrivals]" in info.value.message


def test_a_simulate_json_result_loads_as_its_config(tmp_path: Path) -> None:
    cfg = SimulateConfig.from_options(**TREES["lags"])
    (tmp_path / "r.json").write_text(json.dumps({"schema_version": 3, "config": cfg.to_dict(), "runs": []}))
    assert SimulateConfig.load(tmp_path / "r.json") == cfg


@pytest.mark.parametrize(("doc", "needle"), [
    ({"schema_version": 2, "config": {"workers": 4}, "staleness": {}, "bandwidth": {}},
     "is another command's JSON result (its keys: bandwidth, staleness), not a simulate result"),
    ({"schema_version": 1, "charpoly": []}, "is another command's JSON result (its keys: charpoly)"),
    ({"schema_version": 5, "runs": [], "summaries": []},
     "a simulate result without its 'config'"),
    ({"schema_version": 99, "config": {}, "runs": []}, "of schema_version 99; this naig reads 1 to 5"),
    ({"schema_version": True, "config": {}, "runs": []}, "of schema_version True"),
])
def test_another_commands_result_or_a_newer_one_is_named_as_such(tmp_path: Path, doc: dict,
                                                                   needle: str) -> None:
    """A staleness result said "workers = 4: unknown key", a spectrum one "schema_version = 1: unknown
    key", one without its config named a result field, and schema 99 ran (a review, 2026-12-07)."""
    (tmp_path / "r.json").write_text(json.dumps(doc))
    with pytest.raises(UsageError) as info:
        SimulateConfig.load(tmp_path / "r.json")
    assert info.value.field == "config" and needle in info.value.message and "\n" not in info.value.message
    assert info.value.value == str(tmp_path / "r.json")


def test_a_result_before_schema_4_names_naigs_gossip_gossip_adam(tmp_path: Path) -> None:
    """Until schema 3, ``gasloc`` was naig's asynchronous gossip: such a result reloads as what it ran."""
    cfg = SimulateConfig.from_options(arrivals="exp:1,exp:1", strategies=("gasloc", "diloco"), outer_lr=0.01)
    for version, expected in ((3, ("gossip-adam", "diloco")), (4, ("gasloc", "diloco")),
                              (SCHEMA_VERSION, ("gasloc", "diloco"))):
        doc = {"schema_version": version, "config": cfg.to_dict(), "runs": []}
        (tmp_path / "r.json").write_text(json.dumps(doc))
        assert SimulateConfig.load(tmp_path / "r.json").strategies == expected
    assert SCHEMA_VERSION == 5  # 5 added `warnings` only
    (tmp_path / "c.json").write_text(json.dumps(cfg.to_dict()))  # a config file: the name's current meaning
    assert SimulateConfig.load(tmp_path / "c.json").strategies == ("gasloc", "diloco")


@pytest.mark.parametrize(("change", "field", "needle"), [
    (dict(bandwidth=(1.0, 2.0)), "bandwidth", "lists 2 values but `arrivals` lists 4"),
    (dict(bandwidth=(1.0, 2.0, 3.0, 4.0, 5.0)), "bandwidth", "lists 5 values but `arrivals` lists 4"),
    (dict(uplink="const:1,const:2"), "uplink", "lists 2 values but `arrivals` lists 4"),
])
def test_a_per_worker_list_of_the_wrong_length_is_named(change: dict, field: str, needle: str) -> None:
    """K is the length of the arrivals list; the list that differs is at fault, whichever is longer."""
    with pytest.raises(UsageError) as e:
        ArrivalsSetting(compute="exp:1,exp:1,exp:2,exp:4", **change)
    assert e.value.field == field and needle in e.value.message


def test_with_set_is_a_line_of_the_config_file(tmp_path: Path) -> None:
    """``--set K=V`` gives the config the file line ``K = V`` gives, for a key of every part of the tree."""
    lines = ['arrivals.compute = "exp:1,exp:2"', "arrivals.local.steps = [3]",
             'arrivals.local.topology = "ring"',
             "rules.dc_lambda = 5.0", "sketch_seed = 9", 'strategies = ["gasloc", "hogwild"]', "steps = 4"]
    path = tmp_path / "run.toml"
    path.write_text("\n".join(lines) + "\n")
    via_set = SimulateConfig().with_set([line.replace(" = ", "=") for line in lines])
    assert via_set == SimulateConfig.load(path)
    commas = SimulateConfig().with_set(["arrivals.compute=exp:1,exp:2", "arrivals.local.steps=3",
                                        "arrivals.local.topology=ring", "rules.dc-lambda=5", "sketch_seed=9",
                                        "strategies=gasloc,hogwild", "steps=4"])
    assert commas == via_set  # comma lists and a bare scalar for a list key


def test_with_set_refuses_a_key_of_another_setting_and_names_the_value_as_typed() -> None:
    base = SimulateConfig.from_options(engine="distributed", nproc=3)
    with pytest.raises(UsageError, match="is a key of the arrivals setting") as err:
        base.with_set(["arrivals.window=2"])
    assert err.value.field == "set" and err.value.value == "arrivals.window=2"
    with pytest.raises(UsageError, match="timeout") as err:
        base.with_set(["distributed.timeout=1e3"])
    assert err.value.field == "set" and err.value.value == "distributed.timeout=1e3"
    with pytest.raises(UsageError, match="give it once"):
        base.with_set(["steps=3"], steps=4)
    assert base.with_set(["distributed.window=2"]).setting.window == 2


def test_every_set_key_is_in_the_docs_config_keys() -> None:
    """docs/simulate.md, Config keys, names every key of the tree (the --set help points there)."""
    from naig.simulate.config import SET_KEYS

    text = (Path(__file__).parents[1] / "docs" / "simulate.md").read_text()
    section = text[text.index("### Config keys"):text.index("## The protocols")]
    missing = [key for key in SET_KEYS if f"`{key}`" not in section]
    assert not missing, missing


def test_beta_without_a_rule_that_uses_it_is_noted_not_silently_ignored() -> None:
    """`--beta 5` with only hogwild ran without a word (other rules' options were noted)."""
    from naig.simulate.arrivals.local import LOCAL_METHODS
    from naig.simulate.config import GIBBS_RULES
    from naig.simulate.strategies import STRATEGIES
    from naig.simulate.strategies.naig import GibbsStrategy

    gibbs = {n for n, c in STRATEGIES.items() if issubclass(c, GibbsStrategy)}
    assert gibbs <= GIBBS_RULES and GIBBS_RULES - gibbs <= {m for m in LOCAL_METHODS if "naig" in m}
    notes = SimulateConfig.from_options(strategies=("hogwild",), beta=5.0).ignored_options()
    assert notes and "`beta` has no effect" in notes[0]
    assert SimulateConfig.from_options(strategies=("hogwild", "naig"), beta=5.0).ignored_options() == ()
    assert SimulateConfig.from_options(strategies=("hogwild",)).ignored_options() == ()
    for name, value in (("line", (2, 3, 5)), ("sketch_seed", 99)):  # the energy's Ψ_ℓ and its sketch
        notes = SimulateConfig.from_options(strategies=("hogwild", "sync"), **{name: value}).ignored_options()
        assert len(notes) == 1 and f"`{name}` has no effect" in notes[0]
        assert SimulateConfig.from_options(strategies=("naig",), **{name: value}).ignored_options() == ()
    assert SimulateConfig.from_options(strategies=("naig-exact",), sketch_seed=99).ignored_options() != ()


def test_the_warnings_known_before_training_are_the_rules_then_the_ignored_options() -> None:
    """One list, assembled in one place: the CLI prints it before training and puts it in --json."""
    c = SimulateConfig.from_options(strategies=("krum", "hogwild"), beta=5.0)
    rules, ignored = c.strategy_warnings(), c.ignored_options()
    assert len(rules) == 1 and rules[0].startswith("krum:") and "`beta` has no effect" in ignored[0]
    assert c.warnings() == (*rules, *ignored)
    assert SimulateConfig.from_options(strategies=("hogwild",)).warnings() == ()


def test_window_mode_and_optimizer_are_noted_when_every_method_keeps_its_own_rounds() -> None:
    """sync and the local-update methods ignore B, the protocol and the server optimizer: they ran
    without a word while the header showed them. Noted now; the note is true (same results), and a
    rule that uses them gets no note and other results."""
    from naig.simulate import run_experiment

    base = dict(arrivals="exp:1,exp:1,exp:2", steps=3, seeds=1, eval_every=0, data_bytes=50_000,
                batch_size=2, local_steps=(2,))
    def losses(cfg: SimulateConfig) -> list[float]:
        return [r.final_val_loss for r in run_experiment(cfg).runs]

    own = SimulateConfig.from_options(strategies=("diloco", "sync"), **base)
    given = own.with_options(window=3, mode="non-blocking")
    assert [n.split(" has")[0] for n in given.ignored_options()] == ["`window`", "`mode`"]
    assert own.ignored_options() == () and losses(given) == losses(own)
    local = SimulateConfig.from_options(strategies=("diloco",), **base)
    sgd = local.with_options(optimizer="sgd")  # sync steps the server optimizer: not with it
    assert [n.split(" has")[0] for n in sgd.ignored_options()] == ["`optimizer`"]
    assert losses(sgd) == losses(local)
    hog = SimulateConfig.from_options(strategies=("hogwild",), **{**base, "local_steps": None})
    assert hog.with_options(window=3, optimizer="sgd").ignored_options() == ()
    assert losses(hog.with_options(window=3, optimizer="sgd")) != losses(hog)


@pytest.mark.parametrize(("text", "needle"), [
    ('[rules]\nbeta = "x"\n', 'rules.beta = "x": '), ("steps = 0\n", "steps = 0: "),
    ('[arrivals]\ncompute = "exp:1"\n[arrivals.local]\nsteps = "q"\n', 'arrivals.local.steps = "q": '),
    ("workers = 4\n", "workers = 4: unknown key"),  # a staleness result's key (was "--workers 4")
    ('[config]\nsteps = "x"\n', 'config = {"steps": "x"}: unknown key'),  # a dict repr under --config
    ("[distributed]\nwindow = 1\n", "distributed.nproc: is needed"),
])
def test_a_refused_value_of_a_config_file_is_named_by_its_key_in_the_file(tmp_path: Path, text: str,
                                                                          needle: str) -> None:
    """It was worded as the option (``--beta``), which the file does not say."""
    path = tmp_path / "run.toml"
    path.write_text(text)
    with pytest.raises(UsageError) as info:
        SimulateConfig.load(path)
    assert info.value.field == "config" and info.value.value == str(path)
    assert info.value.message.startswith(needle), info.value.message


def test_learning_rates_that_look_alike_are_refused_before_training() -> None:
    """Runs and their logs are named with ``lr`` to 6 significant digits: 0.001 and 0.0010000001 were
    two runs of one name, the second failing on its log after training."""
    with pytest.raises(UsageError, match=r"look alike to 6 significant digits \(0.001\)") as info:
        SimulateConfig.from_options(lr=(1e-3, 1.0000001e-3, 3e-4))
    assert info.value.field == "lr"
    assert SimulateConfig.from_options(lr=(1e-3, 1.00001e-3)).lr == (1e-3, 1.00001e-3)  # 0.001, 0.00100001


@pytest.mark.parametrize("text", ['{"steps": 2, "steps": 3}', '{"rules": {"beta": 1, "beta": 2}}'])
def test_a_json_config_with_a_key_given_twice_is_refused_as_toml_is(tmp_path: Path, text: str) -> None:
    """json kept the last value silently (3 steps ran); TOML refuses a duplicate key."""
    (tmp_path / "c.json").write_text(text)
    with pytest.raises(UsageError, match="is not valid JSON: the key '(steps|beta)' is given twice") as err:
        SimulateConfig.load(tmp_path / "c.json")
    assert err.value.field == "config"
    (tmp_path / "c.toml").write_text("steps = 2\nsteps = 3\n")
    with pytest.raises(UsageError, match="is not valid TOML"):
        SimulateConfig.load(tmp_path / "c.toml")


def test_an_earlier_runs_logs_that_these_runs_replace_are_said_before_training(tmp_path: Path) -> None:
    """They were replaced without a word (a review, 2026-12-07); a cut run's partial log and other files
    are not said."""
    for name in ("naig-seed0-lr1e-05.csv", "naig-seed1-lr1e-05.partial.csv", "notes.csv",
                 "naig-seed5-lr1e-05.csv"):
        (tmp_path / name).write_text("step\n")
    cfg = SimulateConfig.from_options(strategies=("naig",), seeds=2, lr=(1e-5,), log_dir=str(tmp_path))
    assert cfg.earlier_logs() == ("`log_dir` holds 1 finished log(s) of these runs from an earlier run "
                                  "(naig-seed0-lr1e-05.csv): each is replaced when its run ends",)
    assert not [w for w in cfg.warnings() if "log_dir" in w]  # a function of the config, asked at any time
    (tmp_path / "naig-seed0-lr1e-05.csv").unlink()
    assert cfg.earlier_logs() == ()


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc")
@pytest.mark.parametrize("name", ["naig-seed2-lr1e-05.csv", "naig-seed2-lr1e-05.partial.csv"])
def test_a_folder_under_a_runs_log_name_is_refused_before_training(tmp_path: Path, name: str) -> None:
    """A run's log replaces a file of its name; a folder there failed that run after training."""
    (tmp_path / name).mkdir()
    (tmp_path / "naig-seed3-lr1e-05.csv").mkdir()  # seed 3 is not run: in the way of nothing
    with pytest.raises(UsageError, match=rf"{name} there is not a file") as info:
        SimulateConfig.from_options(strategies=("naig", "hogwild"), seeds=3, lr=(1e-5, 1e-3),
                                    log_dir=str(tmp_path))
    assert info.value.field == "log_dir"
    assert SimulateConfig.from_options(strategies=("hogwild",), seeds=3, lr=(1e-5,), log_dir=str(tmp_path))
    assert SimulateConfig.from_options(strategies=("naig",), seeds=2, lr=(1e-5,), log_dir=str(tmp_path))


def test_saving_gradients_never_overwrites_or_mixes_files(tmp_path: Path) -> None:
    """Two learning rates wrote one folder per rule and seed (the second run's files over the first's);
    a reused step folder kept an earlier run's worker7.safetensors beside a 4-worker run's files."""
    base = dict(strategies=("naig",), steps=5, seeds=2, save_grads=str(tmp_path), save_at=(3,))
    with pytest.raises(UsageError, match="several `lr`") as info:
        SimulateConfig.from_options(**base, lr=(1e-3, 3e-4))
    assert info.value.field == "save_grads"
    (tmp_path / "naig-seed1-step3").mkdir()
    (tmp_path / "naig-seed0-step3").mkdir()
    (tmp_path / "naig-seed0-step3" / "worker7.safetensors").write_bytes(b"old")
    (tmp_path / "naig-seed2-step3").mkdir()
    (tmp_path / "naig-seed2-step3" / "ref.safetensors").write_bytes(b"old")  # seed 2 is not run
    with pytest.raises(UsageError, match="naig-seed0-step3 there holds files of an earlier run") as info:
        SimulateConfig.from_options(**base)
    assert info.value.field == "save_grads"
    (tmp_path / "naig-seed0-step3" / "worker7.safetensors").unlink()  # an empty folder is taken
    assert SimulateConfig.from_options(**base).setting.save_grads == str(tmp_path)


@pytest.mark.parametrize("field", ["log_dir", "save_grads"])
def test_an_output_folder_that_cannot_be_written_is_refused_before_training(tmp_path: Path,
                                                                            field: str) -> None:
    """os.access says yes to root in /proc: the run trained, then failed to write (exit 1, no option
    named). The folder is now probed with a temporary file; a name over 255 bytes is refused too."""
    extra = {"save_at": (1,)} if field == "save_grads" else {}
    long = str(tmp_path / ("a" * 300))
    for path, needle in (("/proc/x", "/proc is not writable"), (long, "cannot be used")):
        with pytest.raises(UsageError, match=needle) as err:
            SimulateConfig.from_options(**{field: path}, **extra)
        assert err.value.field == field
    SimulateConfig.from_options(**{field: str(tmp_path / "out")}, **extra)  # a writable one: no probe left
    assert list(tmp_path.iterdir()) == []
