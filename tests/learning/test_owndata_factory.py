"""Python sources: a package.module:function factory, and what it must return."""

import textwrap

import pytest
import torch

from dacflnode.errors import ConfigError
from dacflnode.learning.owndata import load_local_data

FACTORIES = '''
import torch
from torch.utils.data import TensorDataset

def pairs(classes, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(12, 1, 4, 4, generator=g)
    y = torch.arange(12) % len(classes)
    return (x, y), (x[:4], y[:4])

def datasets(data_root=None):
    x = torch.randn(6, 5)
    return TensorDataset(x, torch.arange(6) % 2), None

def raises():
    raise RuntimeError("no data on this device")

def wrong():
    return "train.csv"

def bad_labels():
    return (torch.zeros(3, 2), torch.tensor([0, 1, 7])), None

def float_labels():
    return (torch.zeros(3, 2), torch.tensor([0.0, 1.0, 1.0])), None

class Mixed(torch.utils.data.Dataset):
    def __len__(self):
        return 2

    def __getitem__(self, i):
        return torch.zeros(2 + i), i

def mixed_shapes():
    return Mixed(), None

def a_list():
    return [(torch.zeros(2), 0)], None

def seen_root(data_root, test_root):
    return (torch.zeros(2, 2), torch.tensor([0, 1])), None if test_root is None else \\
        (torch.zeros(1, 2), torch.tensor([int(data_root.endswith("node-1"))]))
'''


@pytest.fixture
def module(tmp_path, monkeypatch):
    (tmp_path / "own_factories.py").write_text(textwrap.dedent(FACTORIES))
    monkeypatch.syspath_prepend(str(tmp_path))
    return "own_factories"


def test_a_factory_of_tensor_pairs_gives_train_and_test(module):
    data = load_local_data("python", f"{module}:pairs", classes=["a", "b", "c"], seed=5)
    assert data.contract.form == "python" and data.contract.input_shape == (1, 4, 4)
    assert data.train_size == 12 and data.test_size == 4
    assert data.histogram == {"a": 4, "b": 4, "c": 4}
    again = load_local_data("python", f"{module}:pairs", classes=["a", "b", "c"], seed=5)
    assert torch.equal(data.train_x, again.train_x)  # the seed reaches the factory


def test_a_factory_of_datasets_without_a_test_set_holds_some_out(module):
    data = load_local_data("python", "/data/node-0", factory=f"{module}:datasets",
                           classes=["a", "b"], holdout=0.5)
    assert data.contract.input_shape == (5,)
    assert tuple(data.train_x.shape) == (3, 1, 1, 5) and data.test_size == 3


def test_the_factory_gets_the_device_paths(module):
    data = load_local_data("python", "/data/node-1", factory=f"{module}:seen_root",
                           classes=["a", "b"], test_root="/data/test")
    assert data.test_y.tolist() == [1]


@pytest.mark.parametrize(("name", "words"), [
    ("raises", "raised RuntimeError: no data on this device"),
    ("wrong", "returned str"),
    ("bad_labels", "outside 0..1"),
    ("float_labels", "expected integer class indices"),
    ("mixed_shapes", "every sample must have one shape"),
    ("a_list", "got list, expected a torch Dataset"),
    ("missing", "has no attribute 'missing'"),
])
def test_a_factory_that_fails_or_returns_the_wrong_thing_is_one_line_naming_it(
    module, name, words
):
    with pytest.raises(ConfigError) as err:
        load_local_data("python", f"{module}:{name}", classes=["a", "b"])
    assert err.value.field == "data_factory"
    assert f"{module}:{name}" in str(err.value) and words in str(err.value)
    assert "\n" not in str(err.value)


def test_an_unimportable_factory_module_is_an_error():
    with pytest.raises(ConfigError, match="cannot import 'no_such_module_here'"):
        load_local_data("python", "no_such_module_here:f", classes=["a"])
