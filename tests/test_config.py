import pytest

from dacflnode.config import RunConfig, config_from_mapping, load_yaml_config
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
