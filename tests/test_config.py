"""Run settings: the one declaration, its checks, the fingerprint and the generated reference."""

import dataclasses
from typing import Any

import pytest
import torch

from dacflnode.algorithms.rounds import Mixing
from dacflnode.config import (
    DAEMON_DEFAULTS,
    DaemonSettings,
    RunConfig,
    Scope,
    config_from_mapping,
    docs,
    load_yaml_config,
    schema,
)
from dacflnode.config.fingerprint import fingerprint_data, run_fingerprint
from dacflnode.config.node import NodeSettings, TlsSettings
from dacflnode.errors import ConfigError


def test_defaults_follow_the_papers_table_1():
    cfg = RunConfig()
    assert (cfg.nodes, cfg.rounds, cfg.batch_size, cfg.local_epochs) == (10, 100, 20, 1)
    assert cfg.lr_decay == 0.995 and cfg.learning_rate == 0.001
    assert RunConfig(dataset="cifar10").learning_rate == 0.005


def test_yaml_accepts_kebab_and_snake_case_and_a_run_section(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("run:\n  batch-size: 32\n  algorithm: dacfl,cdsgd\n  time_varying: 10\n")
    cfg = load_yaml_config(path)
    assert cfg.batch_size == 32 and cfg.algorithm == ("dacfl", "cdsgd") and cfg.time_varying == 10


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"topology": "star"}, "topology"),
        ({"algorithm": "dacfl,sgd"}, "algorithm"),
        ({"nodes": 1}, "nodes"),
        ({"lr": -1}, "lr"),
        ({"batch_size": 0}, "batch_size"),
        ({"engine": "gpu"}, "engine"),
        ({"data_root": "/no/such/dir"}, "data_root"),
        ({"topology": "ring", "nodes": 2}, "nodes"),
    ],
)
def test_bad_values_name_their_field(values, field):
    with pytest.raises(ConfigError) as err:
        config_from_mapping(values).validate()
    assert err.value.field == field


def test_unknown_key_and_wrong_type_name_the_key():
    with pytest.raises(ConfigError) as err:
        config_from_mapping({"learning_rate": 0.1})
    assert err.value.field == "learning_rate"
    with pytest.raises(ConfigError) as err:
        config_from_mapping({"rounds": "many"})
    assert err.value.field == "rounds"


def test_custom_matrix_file_that_is_not_doubly_stochastic_names_mixing_matrix(tmp_path):
    path = tmp_path / "w.txt"
    path.write_text("0.5 0.5\n0.4 0.6\n")
    with pytest.raises(ConfigError) as err:
        config_from_mapping({"nodes": 2, "mixing_matrix": str(path)}).validate()
    assert err.value.field == "mixing_matrix"


# ---------------------------------------------------------------------------------------- schema
def test_a_field_declared_without_a_scope_fails_when_its_class_is_defined():
    with pytest.raises(TypeError, match=r"Broken\.rounds is not declared"):

        @schema.declared
        @dataclasses.dataclass
        class Broken:
            nodes: int = schema.setting(1, help="n", scope=Scope.RUN, group="run")
            rounds: int = 3


def test_every_setting_has_a_scope_help_and_a_default_of_its_type():
    for cls in (RunConfig, DaemonSettings):
        for d in schema.fields_of(cls):
            assert isinstance(d.setting.scope, Scope), d.name
            assert d.setting.help.strip(), d.name
            assert d.default is None or isinstance(d.default, d.base if not d.is_list else tuple)
            if d.setting.choices is not None and d.default is not None:
                defaults = d.default if d.is_list else (d.default,)
                assert set(defaults) <= set(d.setting.choices), d.name


def test_declared_defaults_are_the_dataclass_defaults():
    assert DAEMON_DEFAULTS.round_deadline == 600.0 and DAEMON_DEFAULTS.hello_timeout == 3600.0
    for d in schema.fields_of(RunConfig):
        assert getattr(RunConfig(), d.name) == d.default


@pytest.mark.parametrize(
    ("values", "field", "message"),
    [
        ({"topology": "star"}, "topology", "unknown topology 'star' (choose from dense, sparse"),
        ({"dataset": "imagenet"}, "dataset", "unknown data set 'imagenet' (choose from"),
        ({"fodac_variant": "x"}, "fodac_variant", "unknown variant 'x' (choose from lagged"),
        ({"lr_decay": 2}, "lr_decay", "must be <= 1, got 2.0"),
        ({"momentum": 1}, "momentum", "must be < 1, got 1.0"),
        ({"dirichlet_alpha": 0}, "dirichlet_alpha", "must be > 0, got 0.0"),
        ({"time_varying": -1}, "time_varying", "must be >= 0, got -1"),
        ({"mixing": "median"}, "mixing", "unknown mixing 'median' (choose from exact, clipped)"),
        ({"clip_radius": 0}, "clip_radius", "must be > 0, got 0.0"),
        ({"clip_fraction": -1}, "clip_fraction", "must be > 0, got -1.0"),
        ({"mixing": "clipped", "algorithm": "dacfl,fedavg"}, "mixing",
         "fedavg averages at a server and has no neighbour to clip"),
    ],
)
def test_declared_checks_say_what_is_wrong(values, field, message):
    with pytest.raises(ConfigError) as err:
        config_from_mapping(values).validate()
    assert err.value.field == field
    assert message in err.value.message


def test_the_clip_radius_is_absolute_or_a_fraction_of_the_initial_models_norm():
    initial = torch.tensor([3.0, 4.0])  # norm 5
    assert RunConfig().mixing_rule(initial) == Mixing()
    assert RunConfig(mixing="clipped").mixing_rule(initial) == Mixing("clipped", 0.5)
    assert (RunConfig(mixing="clipped", clip_fraction=0.2).mixing_rule(initial)
            == Mixing("clipped", 1.0))
    assert (RunConfig(mixing="clipped", clip_radius=7.0, clip_fraction=0.2)
            .mixing_rule(initial) == Mixing("clipped", 7.0))
    with pytest.raises(ConfigError, match="set clip_radius"):
        RunConfig(mixing="clipped").mixing_rule(torch.zeros(2))


@pytest.mark.parametrize("value", ["nan", "inf", True, [1]])
def test_numbers_must_be_finite_numbers(value):
    with pytest.raises(ConfigError) as err:
        config_from_mapping({"lr_decay": value})
    assert err.value.field == "lr_decay"


def test_yaml_errors_name_the_dotted_key_and_the_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("run:\n  rounds: many\n")
    with pytest.raises(ConfigError) as err:
        load_yaml_config(path)
    assert err.value.field == "run.rounds" and str(path) in err.value.message
    path.write_text("colour: red\n")
    with pytest.raises(ConfigError) as err:
        load_yaml_config(path)
    assert err.value.field == "colour" and str(path) in err.value.message


# ------------------------------------------------------------------------------------ fingerprint
def _changed(d: schema.Declared, current: Any) -> Any:
    """A value of ``d``'s type different from ``current``."""
    if d.setting.choices is not None:
        taken = set(current) if d.is_list else {current}
        other = next(c for c in d.setting.choices if c not in taken)
        return (other,) if d.is_list else other
    if d.is_list:
        return (*current, ("x", "y") if d.item is not str else "x")
    if d.base is bool:
        return not current
    if d.base is int:
        return (current or 0) + 1
    if d.base is float:
        return (current or 0.25) * 0.5 + 0.0625
    return f"{current}-other"


#: Configurations under which every conditional run setting counts.
CONTEXTS = [
    RunConfig(),
    RunConfig(partition="dirichlet"),
    RunConfig(partition="shards"),
    RunConfig(topology="random-regular"),
    RunConfig(topology="erdos-renyi"),
    RunConfig(topology="sparse"),
    RunConfig(time_varying=2),
    RunConfig(dataset="synthetic"),
    RunConfig(dataset="folder", classes=("a", "b")),
    RunConfig(dataset="table", classes=("a", "b"), label_column="y"),
    RunConfig(dataset="python", classes=("a", "b"), data_factory="m:f"),
    RunConfig(mixing="clipped"),
    RunConfig(mixing="clipped", clip_radius=2.0),
    RunConfig(compression="int8"),
    RunConfig(schedule="async", topology="ring"),
]


def test_the_fingerprint_follows_every_run_setting_and_no_node_setting():
    daemon = DaemonSettings(members=("a", "b"), edges=(("a", "b"),))
    for d in schema.fields_of(RunConfig):
        counted = False
        for run in CONTEXTS:
            changed: dict[str, Any] = {d.name: _changed(d, getattr(run, d.name))}
            other = dataclasses.replace(run, **changed)
            moved = run_fingerprint(run, daemon) != run_fingerprint(other, daemon)
            relevant = d.setting.relevant is None or d.setting.relevant(run)
            if d.setting.scope is Scope.NODE:
                assert not moved, f"{d.name} is node-local but changes the fingerprint"
            elif relevant:
                assert moved, f"{d.name} is shared but does not change the fingerprint"
                counted = True
            else:
                assert not moved, f"{d.name} changes the fingerprint where it cannot matter"
        assert counted or d.setting.scope is Scope.NODE, d.name
    base = RunConfig()
    for d in schema.fields_of(DaemonSettings):
        changes: dict[str, Any] = {d.name: _changed(d, getattr(daemon, d.name))}
        other_daemon = dataclasses.replace(daemon, **changes)
        moved = run_fingerprint(base, daemon) != run_fingerprint(base, other_daemon)
        assert moved == (d.setting.scope is Scope.RUN), d.name


def test_the_fingerprint_hashes_effective_values():
    daemon = DaemonSettings()
    assert run_fingerprint(RunConfig(), daemon) == run_fingerprint(
        RunConfig(lr=0.001, model="fmnist-cnn"), daemon
    )
    assert fingerprint_data(RunConfig(dataset="cifar10"), daemon)["lr"] == 0.005


# ---------------------------------------------------------------------------------------- docs
def test_the_committed_configuration_reference_is_current():
    assert docs.DOC_PATH.read_text() == docs.render(), "run: python -m dacflnode.config.docs"


def test_the_docs_check_fails_on_a_stale_file_and_the_writer_fixes_it(tmp_path):
    path = tmp_path / "configuration.md"
    path.write_text("old\n")
    assert docs.main(["--check", "--path", str(path)]) == 1
    assert docs.main(["--path", str(path)]) == 0
    assert docs.main(["--check", "--path", str(path)]) == 0


def test_the_reference_lists_every_setting_with_its_scope():
    text = docs.render()
    for cls, prefix in ((RunConfig, ""), (DaemonSettings, ""), (NodeSettings, ""),
                        (TlsSettings, "tls.")):
        for d in schema.fields_of(cls):
            row = next(line for line in text.splitlines()
                       if line.startswith(f"| `{prefix}{d.name}` |"))
            assert f"| {d.setting.scope.value}" in row and d.setting.help in row


def test_a_files_own_section_takes_values_of_the_declared_type_only():
    exact = {"id": "a", "share": 2, "insecure": True, "tls": {"ca": "ca.crt"}}
    node = schema.from_mapping(NodeSettings, exact, exact=True)
    assert (node.id, node.share, node.insecure) == ("a", 2, True)
    assert node.tls == TlsSettings(ca="ca.crt")
    for key, value, message in [
        ("insecure", "yes", "expected true or false, got 'yes'"),
        ("share", "2", "expected an integer, got '2'"),
        ("share", True, "expected an integer, got True"),
        ("control_token", 12345, "expected a string, got int"),
        ("tls", ["ca.crt"], "expected a mapping, got a list of 1"),
    ]:
        with pytest.raises(ConfigError, match=message) as err:
            schema.from_mapping(NodeSettings, {key: value}, exact=True)
        assert err.value.field == key
    with pytest.raises(ConfigError) as err:
        schema.from_mapping(NodeSettings, {"control_token": 1234567890123456789}, exact=True)
    assert "1234567890123456789" not in str(err.value)  # a secret is never echoed
    with pytest.raises(ConfigError, match="expected a string, got int") as err:
        schema.from_mapping(NodeSettings, {"tls": {"key": 5}}, exact=True)
    assert err.value.field == "tls.key"
    # the run settings' own coercion (command-line strings) is unchanged
    assert config_from_mapping({"resize": "yes", "rounds": "3"}).rounds == 3


@pytest.mark.parametrize("spec", ["none", "fp16", "bf16", "int8", "topk:0.01", "randk:0.5"])
def test_every_documented_compression_is_accepted(spec):
    assert RunConfig(compression=spec).validate().compression == spec


@pytest.mark.parametrize(("spec", "says"), [
    ("zip", "unknown compression"), ("topk", "needs the fraction"), ("topk:0", "(0, 1]"),
    ("randk:abc", "a number"), ("int8:4", "takes no parameter")])
def test_a_bad_compression_is_one_clear_error(spec, says):
    with pytest.raises(ConfigError, match="compression") as caught:
        RunConfig(compression=spec).validate()
    assert says in str(caught.value)


def test_compression_is_refused_with_clipped_mixing_and_with_fedavg():
    with pytest.raises(ConfigError, match="CHOCO-Gossip, not mixing clipped"):
        RunConfig(compression="int8", mixing="clipped").validate()
    with pytest.raises(ConfigError, match="fedavg"):
        RunConfig(compression="int8", algorithm=("dacfl", "fedavg")).validate()


def test_the_consensus_step_defaults_to_the_compressors_and_can_be_set():
    assert RunConfig().consensus_gamma() is None
    assert RunConfig(compression="int8").consensus_gamma() == 1.0
    topk = RunConfig(compression="topk:0.01").consensus_gamma()
    assert topk is not None and topk < 0.1
    assert RunConfig(compression="topk:0.01", consensus_step=0.3).consensus_gamma() == 0.3
    assert RunConfig(compression="int8").mixing_rule(None).rule == "choco"
