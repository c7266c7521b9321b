"""The masked sum: exact integers for floats, masks that cancel exactly, vectors that hide."""

from __future__ import annotations

import os
import random
import sys
from fractions import Fraction

import pytest

from dacflnode.algorithms import secure_sum


@pytest.mark.parametrize("value", [0.0, -0.0, 1.0, -2.5, 0.1, 1e-300, 5e-324, -5e-324,
                                   sys.float_info.max, -sys.float_info.max, 123456.789])
def test_a_float_is_encoded_as_an_exact_integer(value):
    assert secure_sum.exact_value(secure_sum.exact_int(value)) == Fraction(value)


def test_a_non_finite_number_is_refused():
    with pytest.raises(ValueError, match="finite"):
        secure_sum.exact_int(float("nan"))


def secrets_for(ids):
    pair = {frozenset(p): os.urandom(32) for p in
            ((a, b) for i, a in enumerate(ids) for b in ids[i + 1:])}
    return {me: {o: pair[frozenset((me, o))] for o in ids if o != me} for me in ids}


def test_the_masks_cancel_in_the_sum_of_every_node_exactly():
    rng = random.Random(3)
    ids = ["a", "b", "c", "d"]
    values = {n: [rng.randrange(-10**600, 10**600) for _ in range(7)] for n in ids}
    secrets = secrets_for(ids)
    payloads = [secure_sum.masked(values[n], n, secrets[n], b"run") for n in ids]
    assert secure_sum.combine(payloads, 7) == [sum(values[n][k] for n in ids) for k in range(7)]


def test_a_masked_vector_shows_nothing_of_its_values():
    ids = ["a", "b", "c"]
    secrets = secrets_for(ids)
    values = [secure_sum.exact_int(0.25), 12]
    sent = secure_sum.masked(values, "a", secrets["a"], b"run")
    plain = secure_sum.masked(values, "a", {}, b"run")
    assert sent != plain
    for word in (plain[:secure_sum.WIDTH], plain[secure_sum.WIDTH:]):
        assert word not in sent
    # the same values with other secrets look unrelated
    again = secure_sum.masked(values, "a", secrets_for(ids)["a"], b"run")
    assert again != sent


def test_the_sum_of_some_nodes_only_does_not_add_up():
    ids = ["a", "b", "c"]
    secrets = secrets_for(ids)
    payloads = [secure_sum.masked([5], n, secrets[n], b"run") for n in ids]
    assert secure_sum.combine(payloads[:2], 1) != [10]


def test_a_payload_of_another_length_is_refused():
    with pytest.raises(ValueError, match="expected"):
        secure_sum.combine([b"\0" * 10], 1)
