"""What ``dacflnode data check`` says of a table: each column's profile, and the settings that a
node would need to read it (:func:`check_plan`).

A node refuses a table whose text column the run's ``categories`` does not list, or whose
missing cells ``missing: fail`` does not allow. ``data check`` reports these as problems instead
(exit code 1, as for unreadable images) and loads the table as a node would once they are
fixed: with the categories found, and leaving incomplete rows out. It prints the ``categories:``
block to paste into the run file.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dacflnode.errors import ConfigError
from dacflnode.learning.owndata.tablescan import (
    VALUES_KEPT,
    TableScan,
    names_text,
    value_order,
)


@dataclass(frozen=True)
class CheckPlan:
    """How ``data check`` loads a scanned table: the ``categories`` and ``missing`` to load it
    with, what a node would refuse (``problems``), each column's profile (``columns``, JSON-able)
    and the ``categories`` block the run needs (``suggested``)."""

    categories: dict[str, tuple[str, ...]]
    missing: str
    problems: tuple[str, ...]
    columns: tuple[dict[str, Any], ...]
    suggested: dict[str, list[str]]


def check_plan(scan: TableScan, categories: Mapping[str, Sequence[str]] | None,
               other_category: bool, missing: str) -> CheckPlan:
    """The plan of ``data check`` for ``scan`` under the run's settings (see the module text).
    A text column with more than :data:`~.tablescan.VALUES_KEPT` values is refused outright: no
    category list fits it."""
    listed = {str(k): tuple(str(v) for v in vs) for k, vs in (categories or {}).items()}
    effective = dict(listed)
    problems: list[str] = []
    columns: list[dict[str, Any]] = []
    for name in scan.feature_names:
        cols = scan.of(name)
        if name not in listed and scan.numeric(name):
            lows = [c.low for c in cols if c.low is not None]
            highs = [c.high for c in cols if c.high is not None]
            columns.append({"name": name, "type": "numeric",
                            "min": min(lows) if lows else None,
                            "max": max(highs) if highs else None,
                            "missing": sum(c.missing for c in cols)})
            continue
        found, more = scan.values(name)
        if more and not (name in listed and other_category):
            raise ConfigError("categories", f"{scan.root}: column {name!r} holds over "
                              f"{VALUES_KEPT} distinct text values, too many to list in "
                              "categories: drop the column, or make it numbers")
        if name in listed:
            unknown = [v for v in found if v not in listed[name]]
            if unknown and not other_category:
                problems.append(f"column {name!r} has values that categories does not list: "
                                f"{names_text(unknown)}; a node refuses them: add them to "
                                "categories (below) or set other_category: true")
                effective[name] = listed[name] + tuple(unknown)
        else:
            problems.append(f"column {name!r} is text and categories does not list it; a node "
                            "refuses it: add its values to the run file (below)")
            effective[name] = found
        columns.append({"name": name, "type": "categorical", "categories": list(found),
                        "missing": sum(c.missing for c in cols)})
    labels_missing = sum(f.label_missing for f in scan.files)
    columns.append({"name": scan.label_column, "type": "label", "values": list(scan.labels),
                    "missing": labels_missing})
    load_missing = missing
    cells = sum(c["missing"] for c in columns)
    if missing == "fail" and cells:
        problems.append(f"{scan.incomplete} row(s) have missing cells ({_counts(columns)}); a "
                        "node with missing: fail refuses them: fill them, or set missing: drop "
                        "or mean (counted as dropped)")
        load_missing = "drop"
    elif missing == "mean" and labels_missing:
        problems.append(f"{labels_missing} row(s) have no label; a node refuses them (a label "
                        "cannot be filled): fill or remove them, or set missing: drop (counted "
                        "as dropped)")
        load_missing = "drop"
    suggested = {name: list(values) for name, values in effective.items()
                 if name in scan.feature_names}
    return CheckPlan(effective, load_missing, tuple(problems), tuple(columns), suggested)


def _counts(columns: Sequence[dict[str, Any]]) -> str:
    missing = sorted((c for c in columns if c["missing"]), key=lambda c: -int(c["missing"]))
    return names_text([f"{c['name']}: {c['missing']}" for c in missing], 5)


def values_text(values: Sequence[str], limit: int = 6) -> str:
    """A column's values for one table cell, cut with ``… and N more``."""
    return names_text(sorted(values, key=value_order), limit)
