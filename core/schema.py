"""Validation of decoded JSON against the payload tables of ``core/payloads.py``.

``check_fields`` returns a normalised copy (non-finite wire strings turned into floats, enum
values into enum members) or raises ``SchemaError`` naming the offending field by its path
(``data.layers.h.0.attn.counts[3]``), so a bad message is dead-lettered with a reason a person
can act on.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from core.floats import WIRE_NONFINITE


class SchemaError(ValueError):
    """A message that does not fit the contract. ``field`` names the offending field."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


class UnknownVersion(SchemaError):
    """A major schema version this reader does not know."""


def _got(value: Any) -> str:
    return type(value).__name__


def check_value(kind: Any, value: Any, where: str) -> Any:
    """Validate one value against a kind from ``core.payloads.schema_of``; return it normalised."""
    if kind is float:
        if isinstance(value, bool):
            raise SchemaError(where, "expected a number, got a boolean")
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str) and value in WIRE_NONFINITE:
            return WIRE_NONFINITE[value]
        raise SchemaError(where, f"expected a number, got {_got(value)}")
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise SchemaError(where, f"expected an integer, got {_got(value)}")
        return value
    if kind is str:
        if not isinstance(value, str):
            raise SchemaError(where, f"expected a string, got {_got(value)}")
        return value
    if kind is bool:
        if not isinstance(value, bool):
            raise SchemaError(where, f"expected true/false, got {_got(value)}")
        return value
    if kind is dict:
        if not isinstance(value, dict):
            raise SchemaError(where, f"expected an object, got {_got(value)}")
        return value
    if isinstance(kind, dict):  # a nested payload
        return check_fields(kind, value, where)
    if isinstance(kind, tuple) and kind[0] == "list":
        if not isinstance(value, list):
            raise SchemaError(where, f"expected a list, got {_got(value)}")
        return [check_value(kind[1], v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(kind, tuple) and kind[0] == "map":
        if not isinstance(value, dict):
            raise SchemaError(where, f"expected an object, got {_got(value)}")
        return {k: check_value(kind[1], v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(kind, type) and issubclass(kind, StrEnum):
        try:
            return kind(value)
        except ValueError:
            allowed = ", ".join(e.value for e in kind)
            raise SchemaError(where, f"{value!r} is not one of: {allowed}") from None
    raise AssertionError(f"unknown field kind {kind!r}")


def check_fields(schema: Mapping[str, tuple[Any, bool]], obj: Any, where: str) -> dict[str, Any]:
    """Validate an object against {field: (kind, required)}; unknown fields survive (a newer
    minor version may add them)."""
    if not isinstance(obj, dict):
        raise SchemaError(where, f"expected an object, got {_got(obj)}")
    out = dict(obj)
    for name, (kind, required) in schema.items():
        if name not in obj or obj[name] is None:
            if required:
                raise SchemaError(f"{where}.{name}", "missing")
            continue
        out[name] = check_value(kind, obj[name], f"{where}.{name}")
    return out
