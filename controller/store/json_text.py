"""JSON text written fast: orjson (where installed) for what it writes faithfully, else the standard encoder.

Rule states and JSON columns (run state, node heartbeat arrays, alert evidence) are written with
every batch, and the standard encoder's float formatting is most of their cost. orjson formats
floats several times faster, but it writes a NaN or an infinity as ``null`` and a tuple as a list,
and refuses an integer beyond 64 bits or a non-text key. ``orjson_text`` therefore returns its
text only when that text reads back equal to the value; otherwise None, and the caller encodes
the standard way (so what reads back from the store is what it was before).
"""

from __future__ import annotations

import json
from typing import Any

_ORJSON: Any = None  # (dumps, loads) once looked up; False without orjson (optional: the controller extra)


def orjson_text(obj: Any) -> str | None:
    """``obj`` as orjson writes it, if that reads back equal to ``obj``; else None."""
    global _ORJSON
    if _ORJSON is None:
        try:
            from orjson import dumps, loads
        except ImportError:
            _ORJSON = False
        else:
            _ORJSON = (dumps, loads)
    if _ORJSON is False:
        return None
    dumps, loads = _ORJSON
    try:
        raw = dumps(obj)
    except TypeError:  # orjson.JSONEncodeError
        return None
    return raw.decode() if loads(raw) == obj else None


def column_json(obj: Any) -> str:
    """The stores' JSON column serializer: ``json.dumps`` as SQLAlchemy's default, faster where
    ``orjson_text`` can (a value that reads back the same either way)."""
    fast = orjson_text(obj)
    return fast if fast is not None else json.dumps(obj)
