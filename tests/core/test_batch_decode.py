"""The typed decoder (core/batch_decode.py) against ``decode_event``'s standard path: on valid
events of every type and thousands of random mutations of them, it gives an equal Event (same
values and types) or leaves the message to the standard path; never anything else."""

from __future__ import annotations

import importlib.util
import json
import math
import random
from typing import Any

import pytest

from cliffguard.core.batch_decode import BatchDecoder
from cliffguard.core.enums import EventType
from cliffguard.core.events import Event, SchemaError, decode_event, encode_event, make_event
from cliffguard.core.floats import to_json
from cliffguard.core.rank_arrays import summarize_losses
from tests.core.test_events import PAYLOADS, STEP, _hostile_messages

needs_msgspec = pytest.mark.skipif(importlib.util.find_spec("msgspec") is None, reason="msgspec not installed")

JUNK: list[Any] = [
    None, True, False, 0, 1, -1, 2**31, 2**31 - 1, -(2**31) - 1, 2**63, 2**63 - 1, -(2**63) - 1, 2**64, 2**70, 10**30,
    1.5, -0.0, 1.0, 1e308, 5e-324, "NaN", "Infinity", "-Infinity", "nan", "inf", "x", "", "ok", "full", "applied",
    "step", "\ud800", "é", "\x00", [], [1, 2], [1.5], [1, "a"], [True], [None], [2**70], {}, {"a": 1.0},
    {"a": "x"}, {"a": [{"b": None}]}, [[[]]],
]
"""Values a mutation puts in place of a field (every JSON kind, the edges of every bound)."""

NUMBER_TEXT = ["1e400", "-1e400", "-0", "1E2", "1.0", "2", "0.1e1", "123456789012345678901234567890", "1e-400",
               "18446744073709551616", "9223372036854775808", "-9223372036854775809"]
"""Numbers written straight into the text (spellings ``json.dumps`` never produces)."""


def _valid_events() -> list[dict[str, Any]]:
    """Wire dicts of valid events: every type, and the per-rank array shapes."""
    out = [make_event(t, "run-1", 5, data, rank=1, world=4).to_dict() for t, data in PAYLOADS.items()]
    losses = [2.5, 2.4, 9.0, math.nan]
    out += [
        make_event("step", "run-1", 7, {**STEP, "rank_losses": summarize_losses(losses)}, world=4).to_dict(),
        make_event("step", "r.2:x", 0, {**STEP, "rank_losses": summarize_losses([2.5]), "detail": True}).to_dict(),
        make_event("step", "run-1", 8, {**STEP, "loss": math.nan, "grad_norm": math.inf, "mfu": -math.inf}).to_dict(),
        make_event("heartbeat", "run-1", 9, {"state": "paused", "ranks": [0, 1, 2], "steps": [9, 9, 8],
                                             "ages_s": [0.5, 1.0, 99.0], "collectives": ["", "allreduce", ""]},
                   world=3).to_dict(),
        make_event("ranks", "run-1", 10, {"first_rank": 1, "steps": 10, **{
            k: [1.0, 2.0] for k in ("step_time_s", "data_wait_s", "comm_exposed_s", "mfu", "tokens_per_s",
                                    "loss_local")}, "mem_allocated": [1, 2], "mem_reserved": [3, 4]},
                   world=3).to_dict(),
        make_event(EventType.RUN_STARTED, "run-1", 0, {**PAYLOADS[EventType.RUN_STARTED],
                                               "capabilities": ["pause", "rollback"]}).to_dict(),
    ]
    return [to_json(e) for e in out]


def _paths(obj: Any, prefix: tuple = ()) -> list[tuple]:
    out = []
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for k, v in items:
        out.append((*prefix, k))
        out += _paths(v, (*prefix, k))
    return out


def _parent(obj: Any, path: tuple) -> Any:
    for k in path[:-1]:
        obj = obj[k]
    return obj


def _mutate(event: dict[str, Any], rng: random.Random) -> bytes:
    """One random change of a valid event's wire dict (or its bytes)."""
    obj = json.loads(json.dumps(event))
    path = rng.choice(_paths(obj))
    parent, key = _parent(obj, path), path[-1]
    kind = rng.randrange(12)
    if kind <= 2:
        parent[key] = rng.choice(JUNK)
    elif kind == 3 and isinstance(parent, dict):
        del parent[key]
    elif kind == 4:
        target = rng.choice([obj, obj["data"], *[v for v in _walk_dicts(obj["data"])]])
        target[rng.choice(["extra", "loss", "v", "min", "p50", "ranks"])] = rng.choice(JUNK)
    elif kind == 5:
        obj["type"] = rng.choice([*(t.value for t in EventType), "nope", 1])
    elif kind == 6 and isinstance(parent[key], (int, float)) and not isinstance(parent[key], bool):
        v = parent[key]
        parent[key] = float(v) if isinstance(v, int) else (int(v) if math.isfinite(v) else v)
    elif kind == 7:  # a number in a spelling json.dumps never writes
        text = json.dumps(obj, separators=(",", ":"))
        nums = [m for m in _number_spans(text)]
        if nums:
            a, b = rng.choice(nums)
            return (text[:a] + rng.choice(NUMBER_TEXT) + text[b:]).encode()
    elif kind == 8:  # a repeated key: the last one counts
        text = json.dumps(obj, separators=(",", ":"))
        name = f'"{rng.choice([*(k for k in path if isinstance(k, str)), "type", "v"])}":'
        junk = rng.choice([*JUNK, *(t.value for t in EventType)])
        return text.replace(name, name + json.dumps(junk) + "," + name, 1).encode()
    raw = json.dumps(obj, separators=(",", ":"), indent=rng.choice([None, None, 1])).encode()
    if kind == 9:
        return raw[: rng.randrange(len(raw))]
    if kind == 10:
        i = rng.randrange(len(raw))
        return raw[:i] + bytes([rng.randrange(256)]) + raw[i + 1:]
    if kind == 11:
        i = rng.randrange(len(raw))
        return raw[:i] + rng.choice([b" ", b"\xff", b"\\u0000", b"\x00", b"\xc3\xa9", b",", b'"']) + raw[i:]
    return raw


def _walk_dicts(obj: Any) -> list[dict]:
    out = []
    if isinstance(obj, dict):
        out.append(obj)
        for v in obj.values():
            out += _walk_dicts(v)
    elif isinstance(obj, list):
        for v in obj:
            out += _walk_dicts(v)
    return out


def _number_spans(text: str) -> list[tuple[int, int]]:
    import re

    return [m.span(1) for m in re.finditer(r"[:\[,](-?\d[\d.eE+-]*)", text)]


def _typed(value: Any) -> Any:
    """``value`` with every leaf tagged by its exact type (1 != 1.0, NaN == NaN, a member != its value)."""
    if isinstance(value, dict):
        return ("dict", {k: _typed(v) for k, v in value.items()})
    if isinstance(value, list):
        return ("list", [_typed(v) for v in value])
    return (type(value).__name__, repr(value))


def _event_typed(ev: Event) -> Any:
    assert type(ev) is Event
    return _typed({name: getattr(ev, name) for name in Event.__slots__})


def _standard(raw: bytes) -> Any:
    """What the standard parser alone (no msgspec, no orjson) makes of ``raw``."""
    import cliffguard.core.events as events

    orjson, events._orjson_loads = events._orjson_loads, None
    try:
        return ("ok", _event_typed(decode_event(raw)))
    except SchemaError as exc:
        return (type(exc).__name__, exc.field, exc.reason)
    finally:
        events._orjson_loads = orjson


def _messages(n: int, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    valid = _valid_events()
    out = [json.dumps(e, separators=(",", ":")).encode() for e in valid]
    out += [_mutate(rng.choice(valid), rng) for _ in range(n)]
    return out


@needs_msgspec
@pytest.mark.parametrize("seed", [1, 2])
def test_the_typed_decoder_accepts_only_what_the_standard_path_accepts_and_gives_an_equal_event(seed):
    decoder = BatchDecoder()
    messages = _messages(2500, seed)
    fast_ok = 0
    for raw in messages:
        ev = decoder.fast(raw)
        ref = _standard(raw)
        if ev is not None:
            fast_ok += 1
            assert ref == ("ok", _event_typed(ev)), raw
    # the test can fail: the fast path took the valid events and many mutations, and refused many
    assert fast_ok >= 300 and sum(_standard(m)[0] != "ok" for m in messages) >= 1000


@needs_msgspec
def test_decode_and_decode_event_give_the_standard_parsers_outcome():
    """Every message: the same Event, or the same error type, field and reason (the DLQ detail),
    from ``BatchDecoder.decode`` (msgspec, then ``decode_event``) and from ``decode_event``
    (orjson when installed) as from the standard parser alone."""
    messages = _messages(2500, 3) + _hostile_messages()

    def outcome(ev):
        if isinstance(ev, SchemaError):
            return (type(ev).__name__, ev.field, ev.reason)
        return ("ok", _event_typed(ev))

    def decoded(raw):
        try:
            return decode_event(raw)
        except SchemaError as exc:
            return exc

    reference = [_standard(m) for m in messages]
    assert [outcome(ev) for ev in BatchDecoder().decode(messages)] == reference
    assert [outcome(decoded(m)) for m in messages] == reference


@needs_msgspec
def test_every_event_type_and_the_array_shapes_take_the_typed_path():
    """All but those holding a non-finite float: rare (a diverging run), left to the standard path."""
    decoder = BatchDecoder()
    valid = _valid_events()
    for e in valid:
        raw = json.dumps(e).encode()
        if b'"NaN"' in raw or b"Infinity" in raw:
            assert decoder.fast(raw) is None
        else:
            assert decoder.fast(raw) == decode_event(raw), e["type"]
    assert {e["type"] for e in valid} == {t.value for t in EventType}


@needs_msgspec
@pytest.mark.parametrize(("change", "why"), [
    ({"rank": 4}, "rank outside the world"),
    ({"run": "NaN"}, "a run id that spells a non-finite number"),
    ({"run": "-x"}, "a run id against its pattern"),
    ({"id": "A" * 32}, "an id against its pattern"),
    ({"data": {**PAYLOADS[EventType.STEP], "loss": "NaN"}}, "a non-finite float (the standard path converts it)"),
    ({"data": {**PAYLOADS[EventType.STEP], "newer_minor": 1}}, "an unknown field (kept by the standard path)"),
    ({"data": {**PAYLOADS[EventType.STEP], "detail": None}}, "null for an optional field"),
    ({"data": {**PAYLOADS[EventType.STEP], "rank_losses": {**summarize_losses([1.0]), "argmax": 3}}},
     "an array check of core/rank_arrays.py"),
    ({"extra": 1}, "an unknown envelope field"),
])
def test_what_the_typed_path_leaves_to_the_standard_one(change, why):
    base = make_event("step", "run-1", 5, PAYLOADS[EventType.STEP], world=2).to_dict()
    raw = json.dumps(to_json({**base, **change})).encode()
    assert BatchDecoder().fast(raw) is None, why


@needs_msgspec
@pytest.mark.parametrize("second", ["ranks", "run.finished", "step"])
def test_a_repeated_type_is_read_as_the_standard_parser_reads_it(second):
    """The last ``type`` counts for the standard parser; msgspec picks the Struct by the tag."""
    raw = encode_event(make_event("step", "run-1", 5, STEP)).replace(b'"type":"step"',
                                                                     b'"type":"step","type":"%s"' % second.encode())
    ev = BatchDecoder().fast(raw)
    assert ev is None or _standard(raw) == ("ok", _event_typed(ev))


@needs_msgspec
def test_integer_bounds_send_a_value_outside_them_the_standard_way():
    decoder = BatchDecoder(lambda t: {"tokens": (0, 100)} if t == EventType.STEP else {}, (-5, 5000))
    assert decoder.bounded and not BatchDecoder().bounded

    def raw(**data):
        return encode_event(make_event("step", "run-1", 5, {**STEP, "tokens": 50, "mem_allocated": 7,
                                                           "mem_reserved": 7, **data}))

    assert decoder.fast(raw(tokens=100)) is not None
    assert decoder.fast(raw(tokens=101)) is None and decode_event(raw(tokens=101)).data["tokens"] == 101
    assert decoder.fast(raw(mem_reserved=5001)) is None  # the default bound
    assert decoder.fast(raw(sample_range=[0, 5001])) is None  # the items of a top-level list too
    assert decoder.fast(raw(rank_losses={**summarize_losses([1.0]), "argmin": 0})) is not None  # nested: not bounded


def without_msgspec(monkeypatch) -> BatchDecoder:
    """A decoder built as where msgspec is not installed."""
    import cliffguard.core.batch_decode as batch_decode

    monkeypatch.setattr(batch_decode, "_find_msgspec", lambda: None)
    return BatchDecoder()


def test_without_msgspec_nothing_takes_the_typed_path(monkeypatch):
    decoder = without_msgspec(monkeypatch)
    raw = encode_event(make_event("step", "run-1", 5, STEP))
    assert not decoder.available and decoder.fast(raw) is None
    assert decoder.decode([raw, b"{"])[0] == decode_event(raw)
    assert isinstance(decoder.decode([raw, b"{"])[1], SchemaError)


@needs_msgspec
def test_decode_gives_events_and_errors_in_order():
    good = encode_event(make_event("step", "run-1", 5, STEP))
    nan = encode_event(make_event("step", "run-1", 6, {**STEP, "loss": math.nan}))
    out = BatchDecoder().decode([good, b"null", nan, "text is not bytes"])
    assert out[0] == decode_event(good) and math.isnan(out[2].data["loss"])
    assert isinstance(out[1], SchemaError) and out[1].field == "$"
    assert isinstance(out[3], SchemaError)
