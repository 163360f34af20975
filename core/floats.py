"""The non-finite float codec: one spelling on the wire (and in JSON), one in the store's columns.

JSON has no NaN or infinity, and a diverging run is exactly when they matter.

- **Wire / JSON**: a float that is NaN, +inf or -inf is written as the JSON *string* ``"NaN"``,
  ``"Infinity"`` or ``"-Infinity"`` (the spellings JavaScript's ``Number()`` and Python's
  ``float()`` both accept). Events, commands, alert payloads, detector state and the store's JSON
  columns all use it: ``to_json`` writes it, ``from_json`` reads it back.
- **Store columns**: SQLite turns a NaN REAL into NULL, so a row that holds a non-finite loss also
  carries its *kind* in a ``nonfinite`` column: ``"nan"``, ``"inf"`` or ``"-inf"``
  (``store_kind`` / ``from_store_kind``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from enum import StrEnum
from typing import Any

WIRE_NONFINITE: dict[str, float] = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
"""Wire spelling -> float."""

STORE_NONFINITE: dict[str, float] = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}
"""Store ``nonfinite`` column value -> float."""


def wire_spelling(value: float) -> str:
    """The wire string for a non-finite float (the caller has checked it is not finite)."""
    if math.isnan(value):
        return "NaN"
    return "Infinity" if value > 0 else "-Infinity"


def to_json(value: Any) -> Any:
    """``value`` with every non-finite float (recursively) replaced by its wire string and
    every StrEnum by its plain value, ready for ``json.dumps(..., allow_nan=False)``."""
    if isinstance(value, float):
        return value if math.isfinite(value) else wire_spelling(value)
    if isinstance(value, Mapping):
        return {str(k): to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    if isinstance(value, StrEnum):
        return str(value)
    return value


def from_json(value: Any) -> Any:
    """Undo ``to_json``'s non-finite strings, recursively (other strings are kept)."""
    if isinstance(value, str):
        return WIRE_NONFINITE.get(value, value)
    if isinstance(value, dict):
        return {k: from_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [from_json(v) for v in value]
    return value


def dumps(obj: Any) -> bytes:
    """Strict RFC 8259 JSON bytes, non-finite floats written as strings."""
    try:
        # Most payloads hold no non-finite float: the C encoder alone then writes the same bytes
        # (StrEnums as their values, tuples as lists) without ``to_json``'s copy of the payload,
        # which was most of the cost of encoding a histogram. It raises on a non-finite float.
        return _FAST.encode(obj).encode()
    except (ValueError, TypeError):
        return json.dumps(to_json(obj), separators=(",", ":"), allow_nan=False, ensure_ascii=False).encode()


_FAST = json.JSONEncoder(separators=(",", ":"), allow_nan=False, ensure_ascii=False)


def canonical_json(obj: Any) -> bytes:
    """``dumps`` with sorted keys: the bytes a signature is computed over."""
    return json.dumps(to_json(obj), sort_keys=True, separators=(",", ":"), allow_nan=False, ensure_ascii=False).encode()


def store_kind(value: float | None) -> str | None:
    """The store's ``nonfinite`` column value for ``value``: None when it is finite or absent."""
    if value is None or math.isfinite(value):
        return None
    if math.isnan(value):
        return "nan"
    return "inf" if value > 0 else "-inf"


def from_store_kind(kind: str | None, default: float = math.nan) -> float:
    """The float a ``nonfinite`` column value stands for (``default`` for an unknown kind)."""
    return STORE_NONFINITE.get(kind or "", default)
