"""``FieldsChecker`` (the prepared ``check_fields``) against the plain per-field algorithm."""

from __future__ import annotations

import itertools
import math

import pytest

from cliffguard.core.events import COMMAND_ARG_SCHEMAS, DATA_SCHEMAS
from cliffguard.core.schema import FieldsChecker, SchemaError, check_fields, check_value
from tests.core.test_events import ARGS, PAYLOADS

HOSTILE = [None, True, False, 0, 1, -1, 2**31, 2**70, 1.5, -0.0, math.inf, "NaN", "Infinity", "-Infinity", "nan",
           "x", "", "ok", "full", "applied", [], [1, 2], [1.5], [1, "a"], [True], [None], {}, {"a": 1.0}, {"a": "x"}]


def _reference(schema, obj, where):
    """The plain algorithm: every present field through ``check_value``."""
    if not isinstance(obj, dict):
        raise SchemaError(where, f"expected an object, got {type(obj).__name__}")
    out = dict(obj)
    for name, (kind, required) in schema.items():
        if name not in obj or obj[name] is None:
            if required:
                raise SchemaError(f"{where}.{name}", "missing")
            continue
        out[name] = check_value(kind, obj[name], f"{where}.{name}")
    return out


def _result(fn, *args):
    try:
        out = fn(*args)
    except SchemaError as exc:
        return ("error", exc.field, exc.reason)
    return ("ok", {k: (type(v), repr(v)) for k, v in out.items()})  # a float is not an int here, nor NaN != NaN


SCHEMAS = [(str(t), DATA_SCHEMAS[t], PAYLOADS[t]) for t in PAYLOADS] + [
    (f"args.{t}", COMMAND_ARG_SCHEMAS[t], ARGS[t]) for t in ARGS]


@pytest.mark.parametrize(("name", "schema", "valid"), SCHEMAS, ids=[s[0] for s in SCHEMAS])
def test_the_prepared_checker_accepts_normalises_and_rejects_as_the_plain_algorithm(name, schema, valid):
    checker = FieldsChecker(schema)
    assert _result(checker, valid, "data")[0] == "ok"
    cases = [valid, [], "x", None]
    for field, bad in itertools.product([*schema, "unknown"], HOSTILE):
        cases.append({**valid, field: bad})
    for field in schema:
        cases.append({k: v for k, v in valid.items() if k != field})
    for obj in cases:
        assert _result(checker, obj, "data") == _result(_reference, schema, obj, "data"), obj
    assert _result(check_fields, schema, cases[-1], "data") == _result(_reference, schema, cases[-1], "data")


def test_the_checker_returns_a_copy_and_leaves_the_input_alone():
    schema = DATA_SCHEMAS[next(iter(PAYLOADS))]
    valid = dict(PAYLOADS[next(iter(PAYLOADS))])
    before = dict(valid)
    out = FieldsChecker(schema)(valid, "data")
    assert out is not valid and valid == before
