"""A secret per pair of nodes: both ends derive it, a third cannot, a bad key is refused."""

import pytest

from dacflnode.security.pair_keys import PairKeys


def test_two_nodes_derive_the_same_secret_and_a_third_another():
    a, b, c = PairKeys(), PairKeys(), PairKeys()
    assert a.secret_with(b.public, b"run") == b.secret_with(a.public, b"run")
    assert a.secret_with(b.public, b"run") != c.secret_with(b.public, b"run")
    assert a.secret_with(b.public, b"run") != a.secret_with(b.public, b"other run")


def test_a_public_key_of_another_size_is_refused():
    with pytest.raises(ValueError, match="32"):
        PairKeys().secret_with(b"short", b"run")
