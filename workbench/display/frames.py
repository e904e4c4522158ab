"""One missing-value convention for every inspect object's `to_frame()`: pandas' `NA`.

A column of ints with a gap is `Int64` (not floats with NaN), of floats `Float64`, of flags
`boolean`, of texts `string`, each with `<NA>` where a value is missing (None or NaN); any other
column (lists, dicts) keeps its objects with `pd.NA` in the gaps. Infinities stay values.

>>> frame([{"rank": 1, "ok": True}, {"rank": None, "ok": None}], ["rank", "ok"]).dtypes.tolist()
[Int64Dtype(), BooleanDtype]
"""

from __future__ import annotations

import math
from numbers import Integral, Real
from typing import Any


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or (
        type(value).__name__ in ("NAType", "NaTType"))


def _dtype(values: list[Any]) -> str:
    """The nullable dtype of a column's present values ("object" where none fits)."""
    if not values:
        return "object"
    if all(type(v).__name__ in ("bool", "bool_") for v in values):
        return "boolean"
    if all(isinstance(v, Integral) and type(v).__name__ not in ("bool", "bool_") for v in values):
        return "Int64"
    if all(isinstance(v, Real) and type(v).__name__ not in ("bool", "bool_") for v in values):
        return "Float64"
    if all(isinstance(v, str) for v in values):
        return "string"
    return "object"


def frame(records: list[dict[str, Any]], columns: list[str],
          dtypes: dict[str, str] | None = None) -> Any:
    """A DataFrame of `records` (dicts) with `columns`, each in its nullable dtype, `pd.NA` for
    every missing value: the dtype `dtypes` gives a column (so a column with nothing in it is
    still typed), else read from the records' own values, before pandas casts them."""
    import pandas as pd  # optional: deferred, only frames need pandas

    data = {}
    for column in columns:
        cells = [r.get(column) for r in records]
        dtype = (dtypes or {}).get(column) or _dtype([v for v in cells if not _missing(v)])
        if dtype == "object":
            data[column] = pd.Series([pd.NA if _missing(v) else v for v in cells], dtype=object)
        else:
            data[column] = pd.Series([None if _missing(v) else v for v in cells],
                                     dtype=object).astype(dtype)
    return pd.DataFrame(data, columns=columns)
