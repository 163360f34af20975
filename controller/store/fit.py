"""Make validated event values fit their columns, so one odd event cannot wedge the controller.

The event schema checks types, not sizes. A value that a column cannot hold (a 200-character
``sha256`` in a VARCHAR(64), a step beyond 32-bit INTEGER, a NUL byte in text) makes PostgreSQL
reject the whole batch's transaction; the controller would then re-read and re-fail the same
batch forever. SQLite would accept them, so the two stores would also disagree. Such values are
clipped here instead (strings cut to the column length with NUL bytes removed, integers clamped
to the column's range) and a warning names the column.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from functools import cache
from types import MappingProxyType
from typing import Any

from sqlalchemy import BigInteger, Integer, String

log = logging.getLogger(__name__)

_INT32 = (-(2**31), 2**31 - 1)
INT64 = _INT64 = (-(2**63), 2**63 - 1)


@cache
def _limits(model: Any) -> dict[str, tuple[str, Any]]:
    out: dict[str, tuple[str, Any]] = {}
    for col in model.__table__.columns:
        t = col.type
        if isinstance(t, String):
            out[col.key] = ("str", t.length)
        elif isinstance(t, BigInteger):
            out[col.key] = ("int", _INT64)
        elif isinstance(t, Integer):
            out[col.key] = ("int", _INT32)
    return out


@cache
def int_limits(model: Any) -> Mapping[str, tuple[int, int]]:
    """Integer column -> (lowest, highest) value it holds, for ``model``'s table (read-only:
    ``controller/bounds.py`` asks for it with every event)."""
    return MappingProxyType({k: bound for k, (kind, bound) in _limits(model).items() if kind == "int"})


def fit_value(model: Any, key: str, value: Any) -> Any:
    """``value`` made storable in ``model``'s column ``key`` (unchanged when it already fits)."""
    limit = _limits(model).get(key)
    if limit is None or value is None:
        return value
    return _fit(model, key, limit, value)


def _fit(model: Any, key: str, limit: tuple[str, Any], value: Any) -> Any:
    kind, bound = limit
    if kind == "str" and isinstance(value, str):
        fitted = value.replace("\x00", "")
        if bound is not None and len(fitted) > bound:
            fitted = fitted[:bound]
    elif kind == "int" and isinstance(value, int) and not isinstance(value, bool):
        fitted = min(max(value, bound[0]), bound[1])
    else:
        return value
    if fitted != value:
        log.warning(
            "%s.%s: value clipped to fit the column (%r...)", model.__tablename__, key, str(value)[:40]
        )
    return fitted


def fit_row(model: Any, row: dict[str, Any]) -> dict[str, Any]:
    """Every value of ``row`` made storable in ``model``'s columns (a new dict)."""
    limits = _limits(model)
    out = dict(row)
    for k in limits.keys() & row.keys():  # the few sized columns, not every value of the row
        v = row[k]
        if v is not None:
            out[k] = _fit(model, k, limits[k], v)
    return out


@cache
def _value_checks(model: Any, columns: tuple[str, ...]) -> tuple[tuple[int, str, str, Any], ...]:
    """(position, column, kind, bound) of ``model``'s sized columns among ``columns``."""
    limits = _limits(model)
    return tuple((i, k, *limits[k]) for i, k in enumerate(columns) if k in limits)


def fit_values(model: Any, columns: tuple[str, ...], rows: list[list[Any]]) -> list[list[Any]]:
    """Every row (values in ``columns`` order) made storable in ``model``'s columns, changed in
    place. Column by column: one that fits as a whole (nearly always) costs a min/max or a join
    at C speed; only a column that does not is checked value by value, and only the values that
    do not fit go through ``_fit``."""
    for i, k, kind, bound in _value_checks(model, columns):
        if _column_fits(kind, bound, [v for row in rows if (v := row[i]) is not None]):
            continue
        for row in rows:
            v = row[i]
            if v is None:
                continue
            if kind == "int":
                if type(v) is int and bound[0] <= v <= bound[1]:
                    continue
            elif type(v) is str and (bound is None or len(v) <= bound) and "\x00" not in v:
                continue
            row[i] = _fit(model, k, (kind, bound), v)
    return rows


def _column_fits(kind: str, bound: Any, values: list[Any]) -> bool:
    """Whether no value needs ``_fit``: ints within ``bound``, or str within it without NUL. A
    value of another type makes the answer False (the caller's per-value check leaves it be)."""
    if not values:
        return True
    try:
        if kind == "int":
            return bound[0] <= min(values) and max(values) <= bound[1]
        return (bound is None or max(map(len, values)) <= bound) and "\x00" not in "".join(values)
    except TypeError:
        return False


def fit_rows(model: Any, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``fit_values`` for rows given as dicts, changed in place."""
    for row in rows:
        columns = tuple(row)
        values = [list(row.values())]
        fit_values(model, columns, values)
        row.update(zip(columns, values[0], strict=True))
    return rows
