"""Declared per-field checks for config dataclasses: a range or a choice stated once, on the field.

A field says what it accepts where it is declared, and ``check_declared`` (called first thing in
the dataclass's ``__post_init__``) tests every declared field in order, so a config built in code
is checked exactly like one built by the loader::

    @dataclass(kw_only=True, slots=True)
    class SpikeConfig:
        window: int = bounded(100, ge=8)
        sigma_floor_rel: float = bounded(0.01, ge=0, lt=1)
        on_timeout: str = one_of("resume", TIMEOUT_POLICIES)

        def __post_init__(self) -> None:
            check_declared(self)
            ...  # checks that relate two fields (a <= b) stay hand-written here

A failure raises ``ValueError("window: must be >= 8")``: the field name, a colon, the reason —
the form ``core.settings.build_config`` turns into ``ConfigError`` naming the field's source.
A value passes only when every bound holds, so NaN fails every bound. A field whose default is
``None`` is optional: ``None`` passes its check.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import MISSING
from typing import Any

CHECK = "cliffguard.declared_check"
"""Field metadata key: the field's ``Check``."""


@dataclasses.dataclass(frozen=True, slots=True)
class Check:
    """What a field accepts (``test``) and what its error says when it does not (``reason``)."""

    test: Callable[[Any], bool]
    reason: str
    optional: bool = False
    """``None`` passes (the field's default is ``None``)."""


def _field(default: Any, test: Callable[[Any], bool], reason: str) -> Any:
    check = Check(test, reason, optional=default is None)
    return dataclasses.field(default=default, metadata={CHECK: check})


def _interval(ge: Any, gt: Any, le: Any, lt: Any) -> str:
    """``>= 1``, ``> 0``, ``in [0, 1)``, ``in (0, 1]``...: the text today's messages use."""
    lo = ("[", ge) if ge is not None else ("(", gt) if gt is not None else None
    hi = ("]", le) if le is not None else (")", lt) if lt is not None else None
    if lo and hi:
        return f"in {lo[0]}{lo[1]}, {hi[1]}{hi[0]}"
    if lo:
        return f"{'>=' if lo[0] == '[' else '>'} {lo[1]}"
    if hi:
        return f"{'<=' if hi[0] == ']' else '<'} {hi[1]}"
    raise TypeError("bounded: give at least one of ge, gt, le, lt")


def bounded(
    default: Any = MISSING,
    *,
    ge: Any = None,
    gt: Any = None,
    le: Any = None,
    lt: Any = None,
    why: str = "",
    reason: str | None = None,
) -> Any:
    """A number field within bounds: ``bounded(64, ge=1)`` -> "must be >= 1";
    ``bounded(0.5, gt=0, le=1)`` -> "must be in (0, 1]". ``why`` is appended in parentheses;
    ``reason`` replaces the whole text where today's message words it otherwise."""
    if ge is not None and gt is not None or le is not None and lt is not None:
        raise TypeError("bounded: give one lower bound (ge or gt) and one upper bound (le or lt)")
    text = reason if reason is not None else f"must be {_interval(ge, gt, le, lt)}"
    if why:
        text = f"{text} ({why})"

    def test(value: Any) -> bool:
        return ((ge is None or value >= ge) and (gt is None or value > gt)
                and (le is None or value <= le) and (lt is None or value < lt))

    return _field(default, test, text)


def one_of(default: Any, choices: Iterable[Any], *, reason: str | None = None) -> Any:
    """A field that takes one of ``choices``: "must be one of a, b, c" (or ``reason``)."""
    allowed = tuple(choices)
    text = reason if reason is not None else f"must be one of {', '.join(str(c) for c in allowed)}"
    return _field(default, lambda value: value in allowed, text)


def non_empty(default: Any = MISSING, *, reason: str = "must not be empty") -> Any:
    """A string field that must not be empty: "must not be empty" (or ``reason``)."""
    return _field(default, bool, reason)


def declared_checks(cls: type) -> dict[str, Check]:
    """Field name -> its declared ``Check``, in declaration order."""
    return {f.name: f.metadata[CHECK] for f in dataclasses.fields(cls) if CHECK in f.metadata}


def check_declared(obj: Any) -> None:
    """Raise ``ValueError("field: reason")`` for the first declared field whose value fails."""
    for f in dataclasses.fields(obj):
        check = f.metadata.get(CHECK)
        if check is None:
            continue
        value = getattr(obj, f.name)
        if value is None and check.optional:
            continue
        if not check.test(value):
            raise ValueError(f"{f.name}: {check.reason}")
