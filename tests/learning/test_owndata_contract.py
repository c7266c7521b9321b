"""The data contract: canonical JSON and a one-line difference naming what differs."""

import pytest

from dacflnode.learning.owndata import DataContract, model_input_shape


def test_equal_contracts_give_equal_json_and_round_trip():
    a = DataContract("folder", ("cat", "dog"), (1, 28, 28))
    b = DataContract("folder", ["cat", "dog"], [1, 28, 28])  # type: ignore[arg-type]
    assert a.to_json() == b.to_json()
    assert a.to_json() == (
        '{"classes":["cat","dog"],"feature_names":[],"input_shape":[1,28,28],"kind":"folder"}'
    )
    assert DataContract.from_json(a.to_json()) == a
    table = DataContract("table", ("0", "1"), (3,), ("x", "y", "z"))
    assert DataContract.from_json(table.to_json()) == table


@pytest.mark.parametrize("text", [
    "not json", "[]", '{"kind":"folder"}',
    '{"kind":"folder","classes":[1],"input_shape":[1],"feature_names":[]}',
    '{"kind":"folder","classes":["a"],"input_shape":[true],"feature_names":[]}',
    '{"kind":"disk","classes":["a"],"input_shape":[1],"feature_names":[]}',
])
def test_from_json_refuses_anything_but_a_contract(text):
    with pytest.raises(ValueError):
        DataContract.from_json(text)


def test_difference_names_the_classes_of_both_sides():
    mine = DataContract("folder", ("a", "b", "c"), (1, 28, 28))
    theirs = DataContract("folder", ("a", "b"), (1, 28, 28))
    assert mine.difference(theirs, "node-3") == (
        "node-3 has classes ['a', 'b'], this run ['a', 'b', 'c']"
    )
    assert mine.difference(mine, "node-3") is None


def test_difference_names_the_input_shape_and_the_feature_names():
    mine = DataContract("folder", ("a",), (1, 28, 28))
    assert mine.difference(DataContract("folder", ("a",), (3, 28, 28)), "node-1") == (
        "node-1 has input shape 3x28x28, this run 1x28x28"
    )
    t1 = DataContract("table", ("a",), (2,), ("x", "y"))
    t2 = DataContract("table", ("a",), (2,), ("y", "x"))
    assert t1.difference(t2, "node-2") == (
        "node-2 has feature names ['y', 'x'], this run ['x', 'y']"
    )


def test_class_order_is_part_of_the_contract():
    a = DataContract("folder", ("a", "b"), (1, 8, 8))
    b = DataContract("folder", ("b", "a"), (1, 8, 8))
    assert a != b and a.difference(b) is not None


def test_contract_refuses_repeated_or_no_classes():
    with pytest.raises(ValueError, match="repeat"):
        DataContract("folder", ("a", "a"), (1, 8, 8))
    with pytest.raises(ValueError, match="at least one class"):
        DataContract("folder", (), (1, 8, 8))


def test_a_table_row_is_built_as_a_one_by_one_image_of_f_channels_wide():
    assert model_input_shape((5,)) == (1, 1, 5)
    assert model_input_shape((3, 32, 32)) == (3, 32, 32)
