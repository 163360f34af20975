"""The controller's fast event decoder: msgspec's C parser validates a message in one pass.

``decode_event`` (core/events.py) parses a message and then checks it field by field in Python,
which cost more than the Kafka client's own work per message. Here each event type's envelope
and ``data`` are msgspec Structs built from the same tables (``DATA_SCHEMAS``, derived from
core/payloads.py), tagged by ``type``, so one call parses, types and range-checks the envelope
and its data in compiled code. What is left in Python per message: ``rank < world``, the run id's
non-finite spelling, the per-rank array checks of core/rank_arrays.py, and building the ``Event``.

The rule: ``fast`` gives an ``Event`` only when ``decode_event`` would give an equal one, and
None for everything else, which the caller hands to ``decode_event`` to decide and word. msgspec
refuses more than the contract does (a non-finite float written as ``"NaN"``, an unknown field of
a newer minor version, ``null`` for an optional field, ``1e400``, a lone surrogate): those go the
standard way, as does every message the contract rejects. It never accepts more: integers are
exact (no float for ``int``, no bool), a float field takes an integer as ``float()`` does, a
repeated key keeps the last value, and strings are UTF-8 checked (tests/core/test_batch_decode.py
compares both on thousands of mutated and hostile messages).

``int_bounds``: the range each integer field of ``data`` (top level, and the items of a top-level
list) must fit where the caller stores it; a value outside sends the message the standard way.
The controller passes its store's limits (controller/bounds.py), so an event from ``fast`` needs
no ``out_of_range`` check.

msgspec is optional (the controller extra): without it ``available`` is False and ``fast`` always
gives None, so the same events come out of ``decode_event`` alone.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from enum import StrEnum
from typing import Annotated, Any, Literal, Union

from cliffguard.core.enums import EventType
from cliffguard.core.events import (
    ARRAY_CHECKS,
    DATA_SCHEMAS,
    MAX_STEP,
    MAX_WORLD,
    SCHEMA_VERSION,
    Event,
    SchemaError,
    build_event,
    check_run_id,
    decode_event,
    id_matches,
)
from cliffguard.core.payloads import FieldSpec

IntBounds = Callable[[EventType], Mapping[str, tuple[int, int]]]
"""Event type -> {data field: (lowest, highest)}; a field not named there gets ``default_bound``."""

_Convert = Callable[[Any], Any]
_MAX_RUNS_REMEMBERED = 100_000
"""Run ids whose check is remembered (the set starts again when full)."""


def _find_msgspec() -> Any:
    try:
        import msgspec
    except ImportError:  # optional (the controller extra): decode_event alone gives the same events
        return None
    return msgspec


class BatchDecoder:
    """Typed decoding of events (see the module docstring). Build one per consumer and call
    ``fast`` (or ``decode`` for a list) per message; each call is independent."""

    def __init__(self, int_bounds: IntBounds | None = None, default_bound: tuple[int, int] | None = None) -> None:
        self._ms = _find_msgspec()
        self._runs: set[str] = set()
        self.available = self._ms is not None
        self.bounded = int_bounds is not None
        """True when every integer of an event from ``fast`` fits ``int_bounds``."""
        if not self.available:
            return
        ms = self._ms
        self._errors = (ms.DecodeError, RecursionError)  # ValidationError is a DecodeError
        envelopes, self._by_class = [], {}
        for etype, schema in DATA_SCHEMAS.items():
            bounds = None if int_bounds is None else (int_bounds(etype), default_bound)
            data_type, convert = self._struct(f"_{etype.name.title()}Data", schema, bounds)
            env = ms.defstruct(f"_{etype.name.title()}Envelope", [
                ("v", Literal[SCHEMA_VERSION]),
                ("id", str),  # the patterns are checked in ``fast``: msgspec's call of ``re`` costs more
                ("run", str),
                ("rank", Annotated[int, ms.Meta(ge=0)]),
                ("world", Annotated[int, ms.Meta(ge=1, le=MAX_WORLD)]),
                ("step", Annotated[int, ms.Meta(ge=0, le=MAX_STEP)]),
                # finite: 1e400 is refused by the parser, and no JSON number parses to NaN
                ("ts", Annotated[float, ms.Meta(ge=-sys.float_info.max, le=sys.float_info.max)]),
                ("data", data_type),
            ], tag_field="type", tag=etype.value, forbid_unknown_fields=True, gc=False)
            envelopes.append(env)
            self._by_class[env] = (etype, convert, ARRAY_CHECKS.get(etype))
        self._decode = ms.json.Decoder(Union[tuple(envelopes)]).decode  # noqa: UP007 - a runtime union

    def _struct(self, name: str, schema: Mapping[str, FieldSpec],
                bounds: tuple[Mapping[str, tuple[int, int]], tuple[int, int] | None] | None) -> tuple[Any, _Convert]:
        """A Struct for one payload table, and the function turning a decoded one into the dict
        ``check_fields`` would return (absent optional fields left out, nested payloads as dicts)."""
        ms = self._ms
        fields, optional = [], []
        for field, (kind, required) in schema.items():
            bound = None if bounds is None else bounds[0].get(field, bounds[1])
            ann, conv = self._annotation(f"{name}_{field}", kind, bound)
            if required:
                fields.append((field, ann))
            else:
                fields.append((field, ann | ms.UnsetType, ms.UNSET))  # absent: left out of the dict
            if conv is not None or not required:
                optional.append((field, conv))
        struct = ms.defstruct(name, fields, kw_only=True, forbid_unknown_fields=True, gc=False)
        asdict, unset, plan = ms.structs.asdict, ms.UNSET, tuple(optional)

        def convert(value: Any) -> dict[str, Any]:
            out = asdict(value)
            for field, conv in plan:
                sub = out[field]
                if sub is unset:
                    del out[field]
                elif conv is not None:
                    out[field] = conv(sub)
            return out

        return struct, convert

    def _annotation(self, name: str, kind: Any, bound: tuple[int, int] | None) -> tuple[Any, _Convert | None]:
        """A payload kind (``core.payloads.schema_of``) -> (msgspec annotation, converter or None)."""
        if kind is int:
            return (int if bound is None else Annotated[int, self._ms.Meta(ge=bound[0], le=bound[1])]), None
        if kind in (float, str, bool) or (isinstance(kind, type) and issubclass(kind, StrEnum)):
            return kind, None
        if kind is dict:
            return dict[str, Any], None
        if isinstance(kind, dict):  # a nested payload
            return self._struct(name, kind, None)
        if isinstance(kind, tuple) and kind[0] == "list":  # the items of a top-level list are bounded too
            inner, conv = self._annotation(name, kind[1], bound)
            return list[inner], (None if conv is None else lambda v: [conv(x) for x in v])
        if isinstance(kind, tuple) and kind[0] == "map":
            inner, conv = self._annotation(name, kind[1], None)
            return dict[str, inner], (None if conv is None else lambda v: {k: conv(x) for k, x in v.items()})
        raise AssertionError(f"unknown field kind {kind!r}")

    def fast(self, raw: Any) -> Event | None:
        """``raw`` -> its Event when the fast path is sure of it, else None (``decode_event`` decides)."""
        if not self.available or type(raw) is not bytes:
            return None
        try:
            env = self._decode(raw)
        except self._errors:
            return None
        run, world = env.run, env.world
        if env.rank >= world or not id_matches(env.id):
            return None
        if run not in self._runs:  # the run id rule (core/events.py), once per run
            try:
                check_run_id(run)
            except SchemaError:
                return None
            if len(self._runs) >= _MAX_RUNS_REMEMBERED:
                self._runs.clear()
            self._runs.add(run)
        etype, convert, check = self._by_class[type(env)]
        data = convert(env.data)
        if check is not None:
            try:
                check(data, world)
            except SchemaError:
                return None
        return build_event(etype, run, env.step, data, env.rank, world, env.ts, env.id, env.v)

    def decode(self, raws: list[bytes]) -> list[Event | SchemaError]:
        """Each message -> its Event, or the ``SchemaError`` ``decode_event`` raises for it."""
        fast = self.fast
        out: list[Event | SchemaError] = []
        for raw in raws:
            ev = fast(raw)
            if ev is None:
                try:
                    ev = decode_event(raw)
                except SchemaError as exc:
                    ev = exc
            out.append(ev)
        return out
