"""A device's own data: image folders, tables and Python factories (docs/data.md).

* :mod:`.contract`: :class:`DataContract`, what every node's data agrees on.
* :mod:`.local`: :func:`load_local_data` and its result :class:`LocalData`.
* :mod:`.images`, :mod:`.tables`, :mod:`.factory`: the three sources.
* :mod:`.split`: one device folder per node from a built-in data set, a folder or a table.
"""

from __future__ import annotations

from dacflnode.learning.owndata.contract import FORMS, DataContract, model_input_shape
from dacflnode.learning.owndata.local import (
    BAD_FILE_POLICIES,
    IMAGE_NORMALIZATION,
    LocalData,
    histogram,
    holdout_split,
    load_local_data,
)

__all__ = [
    "BAD_FILE_POLICIES",
    "FORMS",
    "IMAGE_NORMALIZATION",
    "DataContract",
    "LocalData",
    "histogram",
    "holdout_split",
    "load_local_data",
    "model_input_shape",
]
