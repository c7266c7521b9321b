"""What the end of ``simulate`` and the table of ``report`` say: the invariant line names a
largest per-round residual only where one was measured, and bytes are in the round log's
decimal units."""

import pytest

from dacflnode.cli.report import size
from dacflnode.cli.simulate import invariant_line
from dacflnode.daemon.round_log import size as log_size

LINE = "dacfl: invariant |Σx − Σtracked| / |Σtracked| over the nodes that finished: 3.54e-08"


def test_an_invariant_not_measured_per_round_is_the_final_one_alone():
    assert invariant_line("dacfl", {"final": 3.54e-08, "rounds": [None, None, None],
                                    "nodes": [4, 4, 4]}) == LINE


def test_an_invariant_measured_per_round_adds_the_largest_of_the_rounds_measured():
    line = invariant_line("dacfl", {"final": 3.54e-08, "rounds": [1e-8, 6.1e-08, None, 2e-8],
                                    "nodes": [4, 4, 3, 3]})
    assert line == f"{LINE} (max over the 3 rounds measured: 6.1e-08)"


@pytest.mark.parametrize("n", [26_624_000, 1_000_000, 3_400_000, 999_000_000])
def test_report_sizes_agree_with_the_round_logs_in_megabytes(n):
    shown, logged = size(n), log_size(n)
    assert shown.endswith(" MB") and logged.endswith(" MB")
    assert round(float(shown.split()[0]), 1) == float(logged.split()[0])


def test_report_sizes_below_a_megabyte_are_kilobytes_of_1000_bytes():
    assert size(805_900) == "805.9 kB" == log_size(805_900)
    assert size(None) == "—"
