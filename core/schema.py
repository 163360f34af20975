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

from cliffguard.core.floats import WIRE_NONFINITE


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
        if isinstance(value, float):
            return value
        if isinstance(value, int):
            try:
                return float(value)
            except OverflowError:
                raise SchemaError(where, "integer too large for a float") from None
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
    hit = _CHECKERS.get(id(schema))
    if hit is None or hit[0] is not schema:
        hit = _CHECKERS[id(schema)] = (schema, FieldsChecker(schema))
    return hit[1](obj, where)


_CHECKERS: dict[int, tuple[Mapping[str, tuple[Any, bool]], FieldsChecker]] = {}
"""Each schema's prepared checker (schemas are module-level tables, so this stays small)."""


_EXACT = (float, int, str, bool, dict)
"""Kinds whose value is already normalised when its type is exactly the kind (a float is its own
``float()``; ``bool`` is not an ``int`` here because the test is ``type(v) is kind``)."""


class FieldsChecker:
    """``check_fields`` for one schema, prepared once: the controller decodes every message with
    it, so the common case (each value already of its kind's exact type, an enum given by its
    value) costs a type test or a dict lookup per field. Anything else goes through
    ``check_value``, which normalises it or raises the same ``SchemaError`` as ever."""

    __slots__ = ("_plan",)

    def __init__(self, schema: Mapping[str, tuple[Any, bool]]) -> None:
        plan = []
        for name, (kind, required) in schema.items():
            if kind in _EXACT:
                fast: Any = kind
            elif isinstance(kind, type) and issubclass(kind, StrEnum):
                fast = {e.value: e for e in kind}
            elif isinstance(kind, tuple) and kind[0] == "list" and kind[1] in _EXACT:
                fast = ("list", kind[1])
            else:
                fast = None
            plan.append((name, kind, required, fast))
        self._plan = tuple(plan)

    def __call__(self, obj: Any, where: str) -> dict[str, Any]:
        if type(obj) is not dict:
            if not isinstance(obj, dict):
                raise SchemaError(where, f"expected an object, got {_got(obj)}")
        out = dict(obj)
        get = obj.get
        for name, kind, required, fast in self._plan:
            v = get(name)
            if v is None:
                if required:
                    raise SchemaError(f"{where}.{name}", "missing")
                continue
            tv = type(v)
            if tv is fast:
                continue
            if tv is str and type(fast) is dict:
                member = fast.get(v)
                if member is not None:
                    out[name] = member
                    continue
            elif tv is list and type(fast) is tuple:
                inner = fast[1]
                for x in v:
                    if type(x) is not inner:
                        break
                else:
                    out[name] = list(v)
                    continue
            out[name] = check_value(kind, v, f"{where}.{name}")
        return out
