from pathlib import Path

import pytest
import torch

# The suite runs small models on a 2-core machine: one intra-op thread is faster for them and
# leaves the other core to the processes that cluster tests start.
torch.set_num_threads(1)

#: real processes and clusters: every test in it is slow (docs/testing.md)
E2E = Path(__file__).resolve().parent / "e2e"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test in tests/e2e/ that is not marked slow would slip into the quick loop (``-m "not
    slow"``): refuse to run rather than let it."""
    unmarked = [item.nodeid for item in items
                if item.path.is_relative_to(E2E) and item.get_closest_marker("slow") is None]
    if unmarked:
        raise pytest.UsageError("tests in tests/e2e/ must be marked slow (pytestmark = "
                                f"pytest.mark.slow): {', '.join(unmarked)}")
