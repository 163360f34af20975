"""The non-finite float codec (core/floats.py): wire strings, store kinds, strict JSON."""

import json
import math

from cliffguard.core.enums import Level
from cliffguard.core.floats import canonical_json, dumps, from_json, from_store_kind, store_kind, to_json


def test_wire_round_trip_is_recursive():
    value = {"a": math.nan, "b": [math.inf, -math.inf, 1.5], "c": {"d": Level.WARN}}
    wire = to_json(value)
    assert wire == {"a": "NaN", "b": ["Infinity", "-Infinity", 1.5], "c": {"d": "warn"}}
    back = from_json(wire)
    assert math.isnan(back["a"]) and back["b"][:2] == [math.inf, -math.inf] and back["c"]["d"] == "warn"


def test_dumps_is_strict_json():
    raw = dumps({"loss": math.nan})
    assert json.loads(raw, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c))) == {"loss": "NaN"}
    assert canonical_json({"b": 1, "a": 2}) == b'{"a":2,"b":1}'


def test_store_kind_round_trip():
    assert [store_kind(v) for v in (None, 1.0, math.nan, math.inf, -math.inf)] == [None, None, "nan", "inf", "-inf"]
    assert from_store_kind("inf") == math.inf and from_store_kind("-inf") == -math.inf
    assert math.isnan(from_store_kind("nan")) and math.isnan(from_store_kind(None))


def test_dumps_writes_the_same_bytes_with_or_without_non_finite_floats():
    from enum import StrEnum

    class Kind(StrEnum):
        A = "a"

    for obj in ({"a": 1.5, "b": [1, 2, (3, 4.25)], "c": Kind.A, Kind.A: "x", 3: None, "u": "é"},
                {"x": math.nan, "y": [math.inf, -math.inf], "z": {"w": (1.0, math.nan)}, "c": Kind.A}):
        slow = json.dumps(to_json(obj), separators=(",", ":"), allow_nan=False, ensure_ascii=False).encode()
        assert dumps(obj) == slow
