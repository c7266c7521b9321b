"""The own-data settings: the names an acceptance check relies on (dataset folder|table,
classes, label_column, data_root, test_root), their checks, the node: section of a peers file,
and a fingerprint in which the data contract replaces the data set's name."""

from __future__ import annotations

import dataclasses
import json

import pytest
import yaml

from dacflnode.config import DaemonSettings, RunConfig, config_from_mapping, load_yaml_config
from dacflnode.config.fingerprint import fingerprint_data, run_fingerprint
from dacflnode.errors import ConfigError
from dacflnode.learning.owndata import DataContract
from dacflnode.peers.file import load_peers

DAEMON = DaemonSettings(members=("a", "b"), edges=(("a", "b"),))


def test_a_config_file_names_the_source_its_classes_and_label_column(tmp_path):
    (tmp_path / "train").mkdir()
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({
        "dataset": "table", "classes": ["Setosa", "versicolor", 3], "label_column": "species",
        "data_root": str(tmp_path / "train"), "holdout": 0.25,
    }))
    cfg = load_yaml_config(path).validate()
    assert cfg.own_data and cfg.dataset == "table"
    assert cfg.classes == ("Setosa", "versicolor", "3")  # label values as strings, case kept
    assert cfg.label_column == "species" and cfg.holdout == 0.25


@pytest.mark.parametrize(
    ("values", "field", "message"),
    [
        ({"dataset": "folder"}, "classes", "needs the run's class list"),
        ({"dataset": "folder", "classes": "a,b,a"}, "classes", "'a' is listed twice"),
        ({"dataset": "table", "classes": "a,b"}, "label_column", "label column"),
        ({"dataset": "python", "classes": "a", "data_factory": "nomodule"}, "data_factory",
         "package.module:function"),
        ({"dataset": "folder", "classes": "a", "channels": 2}, "channels", "1 or 3"),
        ({"dataset": "folder", "classes": "a", "holdout": 1.0}, "holdout", "< 1"),
        ({"dataset": "folder", "classes": "a", "bad_files": "ignore"}, "bad_files", "fail, skip"),
        ({"dataset": "folder", "classes": "a", "test_root": "/no/such/dir"}, "test_root",
         "does not exist"),
    ],
)
def test_own_data_settings_are_checked_naming_the_key(values, field, message):
    with pytest.raises(ConfigError) as err:
        config_from_mapping(values).validate()
    assert err.value.field == field and message in err.value.message


def test_a_peers_files_node_section_holds_this_devices_data_paths(tmp_path):
    for name in ("train", "test"):
        (tmp_path / "dev" / name).mkdir(parents=True)
    path = tmp_path / "node-0.yaml"
    path.write_text(yaml.safe_dump({
        "node": {"id": "node-0", "listen": "127.0.0.1:7000", "data_root": "dev/train",
                 "test_root": "dev/test", "bad_files": "skip"},
        "neighbours": [{"id": "node-1", "address": "127.0.0.1:7001"}],
        "run": {"dataset": "folder", "classes": ["cat", "dog"], "nodes": 2},
    }))
    pf = load_peers(path)
    assert pf.run.data_root == str(tmp_path / "dev" / "train")  # relative to the file
    assert pf.run.test_root == str(tmp_path / "dev" / "test")
    assert pf.run.bad_files == "skip" and pf.node.share == 0


def test_a_data_path_in_both_sections_is_refused(tmp_path):
    (tmp_path / "d").mkdir()
    path = tmp_path / "node-0.yaml"
    path.write_text(yaml.safe_dump({
        "node": {"id": "node-0", "listen": "127.0.0.1:7000", "data_root": "d"},
        "neighbours": [{"id": "node-1", "address": "127.0.0.1:7001"}],
        "run": {"dataset": "folder", "classes": ["cat"], "nodes": 2, "data_root": "d"},
    }))
    with pytest.raises(ConfigError) as err:
        load_peers(path)
    assert err.value.field == "node.data_root" and "keep one" in err.value.message


def test_the_contract_replaces_the_data_sets_name_in_the_fingerprint():
    run = RunConfig(dataset="folder", classes=("cat", "dog"))
    three = DataContract("folder", ("cat", "dog"), (1, 28, 28)).to_json()
    rgb = DataContract("folder", ("cat", "dog"), (3, 28, 28)).to_json()
    assert fingerprint_data(run, DAEMON, three)["dataset"]["input_shape"] == [1, 28, 28]
    assert run_fingerprint(run, DAEMON, three) != run_fingerprint(run, DAEMON, rgb)
    assert run_fingerprint(run, DAEMON, three) == run_fingerprint(run, DAEMON, three)


def test_a_built_in_runs_fingerprint_hashes_no_own_data_setting():
    data = fingerprint_data(RunConfig(), DAEMON)
    own = {"classes", "label_column", "data_factory", "image_size", "channels", "resize",
           "holdout"}
    assert not own & set(data) and data["dataset"] == "fashion-mnist"
    # and an own-data run hashes no partition: each device brings its data, nothing is cut
    assert "partition" not in fingerprint_data(RunConfig(dataset="folder", classes=("a",)),
                                               DAEMON)


@pytest.mark.parametrize(("cfg", "model", "lr"), [
    (RunConfig(dataset="folder", classes=("a",)), "fmnist-cnn", 0.001),  # the paper's CNN, lr
    (RunConfig(dataset="folder", classes=("a",), channels=3, image_size=32), "cifar-cnn", 0.001),
    (RunConfig(dataset="table", classes=("a",), label_column="y"), "mlp", 0.05),  # an mlp's
])
def test_own_data_gets_a_default_model_and_rate_for_its_shape(cfg, model, lr):
    assert fingerprint_data(cfg, DAEMON)["model"] == model
    assert cfg.learning_rate == lr


# ------------------------------------------------------------------ a table's encoding settings
def test_a_run_file_lists_categories_as_text_in_order_and_the_table_policies(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({
        "dataset": "table", "classes": ["a"], "label_column": "y", "missing": "drop",
        "other_category": True, "scaling": "minmax",
        "categories": {"colour": ["red", "blue"], "grade": [3, 1, 2.5]},
    }))
    cfg = load_yaml_config(path).validate()
    assert cfg.categories == {"colour": ("red", "blue"), "grade": ("3", "1", "2.5")}
    assert (cfg.missing, cfg.other_category, cfg.scaling) == ("drop", True, "minmax")
    assert RunConfig().missing == "fail" and RunConfig().scaling == "standardize"
    # JSON (summary.json, replay) and back
    again = config_from_mapping(json.loads(json.dumps(cfg.to_json())))
    assert again.categories == cfg.categories


@pytest.mark.parametrize(
    ("categories", "message"),
    [
        (["red"], "expected a mapping"),
        ({"colour": "red"}, "expected a list of its values"),
        ({"colour": []}, "expected a list of its values"),
        ({"colour": ["red", "red"]}, "'red' is listed twice"),
        ({"colour": [["red"]]}, "must be text or a number"),
        ({"colour": ["<other>"]}, "other_category"),
        ({"y": ["a"]}, "label column 'y'"),
    ],
)
def test_bad_categories_are_refused_naming_the_setting(categories, message):
    with pytest.raises(ConfigError) as err:
        config_from_mapping({"dataset": "table", "classes": "a", "label_column": "y",
                             "categories": categories}).validate()
    assert err.value.field == "categories" and message in err.value.message


@pytest.mark.parametrize(("key", "value"), [("missing", "zero"), ("scaling", "robust")])
def test_the_table_policies_take_their_choices_only(key, value):
    with pytest.raises(ConfigError) as err:
        config_from_mapping({"dataset": "table", "classes": "a", "label_column": "y",
                             key: value}).validate()
    assert err.value.field == key


def test_the_encoding_settings_are_in_a_tables_fingerprint_only():
    table = RunConfig(dataset="table", classes=("a",), label_column="y")
    listed = dataclasses.replace(table, categories={"c": ("p", "q")})
    assert run_fingerprint(table, DAEMON) != run_fingerprint(listed, DAEMON)
    swapped = dataclasses.replace(table, categories={"c": ("q", "p")})
    assert run_fingerprint(listed, DAEMON) != run_fingerprint(swapped, DAEMON)
    assert {"categories", "missing", "scaling", "other_category"} <= set(
        fingerprint_data(table, DAEMON))
    assert not {"categories", "missing", "scaling", "other_category"} & set(
        fingerprint_data(RunConfig(), DAEMON))


def test_a_peers_file_written_with_categories_reads_back_equal(tmp_path):
    from dacflnode.peers.file import parse_peers
    from dacflnode.peers.yaml_form import dump_peers

    path = tmp_path / "node-0.yaml"
    path.write_text(yaml.safe_dump({
        "node": {"id": "node-0", "listen": "127.0.0.1:7000"},
        "neighbours": [{"id": "node-1", "address": "127.0.0.1:7001"}],
        "run": {"dataset": "table", "classes": ["a"], "label_column": "y", "nodes": 2,
                "categories": {"c": ["p", "q"]}, "missing": "mean"},
    }))
    pf = load_peers(path)
    again = parse_peers(yaml.safe_load(dump_peers(pf)), path)
    assert again.run.categories == {"c": ("p", "q")} and again.run.missing == "mean"
