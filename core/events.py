"""The event and command contract between the agent (producer) and the controller.

One JSON object per Kafka message, UTF-8, key = run id. Every process reads and writes it
through this module (``core/``), so producer and consumers cannot drift apart.

Where each event fires in the training loop (Composer-style pseudocode)::

    agent.start()                               # RUN_STARTED (rank 0)
    for step in steps:
        batch = next(loader)                    #   data_wait_s measured here; the data watch takes
                                                #   the batch (DATA_STATS every `every` steps, from its thread)
        loss = model(batch); agent.after_forward(loss)
        loss.backward(); agent.after_backward() #   comm_exposed_s from the DDP hook
        if agent.before_optimizer_step():       #   the guard: skip when it trips
            optimizer.step()
        agent.after_step()                      # STEP (rank 0: run-level, with every rank's loss
                                                # summary; every rank while a DETAIL command asks),
                                                # RANKS every ranks_every, GRAD_HIST every hist_every
        agent.poll_commands()                   # COMMAND_ACK after each applied command,
                                                # VALIDATION for a validate command,
                                                # CHECKPOINT when one is written/verified,
                                                # DATA_FLAG when the data rules mark samples
    # every heartbeat_s on a side thread:       # HEARTBEAT (each node's local rank 0, carrying its
                                                # ranks' steps and ages; also while paused)
    agent.close()                               # RUN_FINISHED, or RUN_FAILED on an exception

Versioning: ``v`` is the schema's *major* version (an int). Minor revisions only add optional
fields, which readers ignore, so a newer minor is tolerated; an unknown major is rejected
(into the DLQ by the controller).

Non-finite floats are written with the wire spelling of ``core/floats.py`` (``"NaN"``,
``"Infinity"``, ``"-Infinity"``); decoding turns them back into floats for every field the schema
types as a float. The output is strict RFC 8259 JSON, readable by any consumer. The enums live in
``core/enums.py``.
"""

from __future__ import annotations

import json
import math
import re
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cliffguard.core.enums import CommandType, EventType
from cliffguard.core.floats import WIRE_NONFINITE as _NONFINITE_IN
from cliffguard.core.floats import dumps
from cliffguard.core.payloads import COMMAND_ARGS, EVENT_PAYLOADS, FieldSpec, schema_of
from cliffguard.core.policy import COMMAND_TTL_S
from cliffguard.core.rank_arrays import check_loss_summary, check_node_heartbeat, check_ranks
from cliffguard.core.schema import FieldsChecker, SchemaError, UnknownVersion, check_fields, check_value
from cliffguard.core.slots import slot_builder

SCHEMA_VERSION = 1
MAX_EVENT_BYTES_DEFAULT = 1_000_000
MAX_STEP = 2**31 - 1
"""The largest step the wire accepts: the store's step columns are 32-bit integers on
PostgreSQL, and a larger value must reach the DLQ, never the state machine or SQL."""
MAX_WORLD = 1_000_000
"""The largest world size the wire accepts (far above any real job)."""


DATA_SCHEMAS: dict[EventType, dict[str, FieldSpec]] = {t: schema_of(p) for t, p in EVENT_PAYLOADS.items()}
"""Each event type's ``data`` table, derived from its TypedDict in ``core/payloads.py``."""
COMMAND_ARG_SCHEMAS: dict[CommandType, dict[str, FieldSpec]] = {t: schema_of(p) for t, p in COMMAND_ARGS.items()}
"""Each command type's ``args`` table."""

_ID_RE = re.compile(r"^[0-9a-f]{32}$")
_RUN_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
id_matches = _ID_RE.match
"""Whether a string is a valid event/command id (truthy when it is)."""


def new_id() -> str:
    return uuid.uuid4().hex


def check_run_id(run: object) -> None:
    """Raise ``SchemaError("run", ...)`` (a ``ValueError``) unless ``run`` is a valid run id.

    The one rule for run ids: every envelope is checked with it, and so is the agent's config, so
    a run whose events would all be rejected is refused when it starts."""
    if not isinstance(run, str) or not _RUN_RE.match(run):
        raise SchemaError("run", f"expected a run id of 1-128 characters [A-Za-z0-9._:-] "
                                 f"starting with a letter or digit, got {run!r}")
    if run in _NONFINITE_IN:
        # "NaN"/"Infinity" is how a non-finite float is written on the wire: never a real run id.
        raise SchemaError("run", f"{run!r} is the encoding of a non-finite number, not a run id")


def _check_envelope_common(obj: Any) -> None:
    if not isinstance(obj, dict):
        raise SchemaError("$", f"expected a JSON object, got {type(obj).__name__}")
    v = obj.get("v")
    if isinstance(v, bool) or not isinstance(v, int):
        raise SchemaError("v", "missing or not an integer schema version")
    if v != SCHEMA_VERSION:
        raise UnknownVersion("v", f"unknown major schema version {v} (this reader knows {SCHEMA_VERSION})")
    ident = obj.get("id")
    if not isinstance(ident, str) or not id_matches(ident):
        raise SchemaError("id", "expected 32 lowercase hex characters")
    check_run_id(obj.get("run"))


def _reject_constant(name: str) -> Any:
    raise SchemaError("$", f"bare {name} is not JSON; non-finite floats are sent as strings")


_DECODER = json.JSONDecoder(parse_constant=_reject_constant)
"""Built once: ``json.loads`` with a keyword builds a decoder per call."""


def _parse_json(raw: bytes | str) -> Any:
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
    except UnicodeDecodeError as exc:
        raise SchemaError("$", f"not UTF-8: {exc.reason} at byte {exc.start}") from None

    try:
        return _DECODER.decode(text)
    except json.JSONDecodeError as exc:
        raise SchemaError("$", f"invalid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except RecursionError:
        raise SchemaError("$", "JSON nested too deeply") from None


# ---------------------------------------------------------------------------------------------
# Events
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Event:
    """One agent event. ``data`` is already validated against ``DATA_SCHEMAS[type]``."""

    type: EventType
    run: str
    step: int
    data: dict[str, Any]
    rank: int = 0
    world: int = 1
    ts: float = field(default_factory=time.time)
    id: str = field(default_factory=new_id)
    v: int = SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        return {
            "v": self.v,
            "id": self.id,
            "type": str(self.type),
            "run": self.run,
            "rank": self.rank,
            "world": self.world,
            "step": self.step,
            "ts": self.ts,
            "data": self.data,
        }


def make_event(
    type: EventType | str,
    run: str,
    step: int,
    data: Mapping[str, Any],
    *,
    rank: int = 0,
    world: int = 1,
    ts: float | None = None,
    id: str | None = None,
) -> Event:
    """Build and validate an event (raises SchemaError naming the field); a fresh ``id`` unless given."""
    etype = EventType(type)
    ev = Event(
        type=etype,
        run=run,
        step=step,
        data=dict(data),
        rank=rank,
        world=world,
        ts=time.time() if ts is None else ts,
        id=id or new_id(),
    )
    return event_from_dict(ev.to_dict())


def _check_step(value: Any, path: str) -> int:
    step = check_value(int, value, path)
    if not 0 <= step <= MAX_STEP:
        raise SchemaError(path, f"must be in [0, {MAX_STEP}]")
    return step


_EVENT_TYPES: dict[str, EventType] = {t.value: t for t in EventType}
_DATA_CHECKERS = {t: FieldsChecker(s) for t, s in DATA_SCHEMAS.items()}


def event_from_dict(obj: Any) -> Event:
    _check_envelope_common(obj)
    t = obj.get("type")
    etype = _EVENT_TYPES.get(t) if isinstance(t, str) else None
    if etype is None:
        raise SchemaError("type", f"unknown event type {t!r}")
    rank, world = obj.get("rank"), obj.get("world")
    if type(rank) is not int:  # the exact type is the common case; check_value says what is wrong
        rank = check_value(int, rank, "rank")
    if type(world) is not int:
        world = check_value(int, world, "world")
    if not 1 <= world <= MAX_WORLD:
        raise SchemaError("world", f"must be in [1, {MAX_WORLD}]")
    if not 0 <= rank < world:
        raise SchemaError("rank", f"rank {rank} outside world of {world}")
    step = obj.get("step")
    if type(step) is not int or not 0 <= step <= MAX_STEP:
        step = _check_step(step, "step")
    ts = obj.get("ts")
    if type(ts) is not float:
        ts = check_value(float, ts, "ts")
    if not math.isfinite(ts):
        raise SchemaError("ts", "must be finite")
    data = _DATA_CHECKERS[etype](obj.get("data"), "data")
    check_arrays(etype, data, world)
    return Event(
        type=etype, run=obj["run"], step=step, data=data, rank=rank, world=world, ts=ts, id=obj["id"], v=obj["v"]
    )


def check_arrays(etype: EventType, data: dict[str, Any], world: int) -> None:
    """Per-rank arrays (core/rank_arrays.py): bounded and consistent with the envelope's world."""
    check = ARRAY_CHECKS.get(etype)
    if check is not None:
        check(data, world)


def _check_step_arrays(data: dict[str, Any], world: int) -> None:
    summary = data.get("rank_losses")
    if summary is not None:
        check_loss_summary(summary, world, "data.rank_losses")


ARRAY_CHECKS: dict[EventType, Callable[[dict[str, Any], int], None]] = {
    EventType.RANKS: check_ranks,
    EventType.HEARTBEAT: lambda data, world: check_node_heartbeat(data, world, MAX_STEP),
    EventType.STEP: _check_step_arrays,
}
"""The event types whose data holds per-rank arrays, and their check (``check_arrays``)."""


build_event = slot_builder(Event)
"""``build_event(type, run, step, data, rank, world, ts, id, v)``: an ``Event`` of values already
validated (core/batch_decode.py), without the frozen dataclass ``__init__`` (core/slots.py)."""


def encode_event(event: Event) -> bytes:
    return dumps(event.to_dict())


def decode_event(raw: bytes | str, max_bytes: int | None = None) -> Event:
    """Bytes from Kafka -> a validated Event, or SchemaError naming what is wrong. The
    controller tries the typed decoder of core/batch_decode.py first; this decides, and words,
    every message that one leaves."""
    if max_bytes is not None and len(raw) > max_bytes:
        raise SchemaError("$", f"message of {len(raw)} bytes exceeds the limit of {max_bytes}")
    obj = _fast_parse(raw)
    if obj is not None:
        try:
            return event_from_dict(obj)
        except SchemaError:
            pass  # the standard parser below decides, and words, every rejection
    return event_from_dict(_parse_json(raw))


_UNSET: Any = object()
_orjson_loads: Any = _UNSET  # looked up on the first decode: the agent side never imports it


def _find_orjson() -> Any:
    try:
        from orjson import loads
    except ImportError:  # optional (the controller extra): the standard parser alone gives the same events
        return None
    return loads

_DIGITS_ONLY = bytes(48 if 48 <= i <= 57 else 32 for i in range(256))  # b"0"-"9" kept, the rest blank
_LONG_NUMBER = b"0" * 19


def _fast_parse(raw: bytes | str) -> Any:
    """``raw`` parsed by orjson when that is sure to read it as the standard parser would, else
    None. orjson rejects more (bare NaN, lone surrogates, 1e400: then None and the standard
    parser decides) and reads one thing differently: an integer beyond 64 bits becomes a float
    (above 2**64 - 1, or below -2**63: 19 digits are enough for that one). Such an integer has 19
    or more digits in a row, which a message from ``encode_event`` never holds outside a string
    (floats are written with at most 17), so any run of 19 digits sends the message to the
    standard parser, whose integers ``controller/bounds.py`` range-checks."""
    global _orjson_loads
    if _orjson_loads is _UNSET:
        _orjson_loads = _find_orjson()
    if _orjson_loads is None or type(raw) is not bytes or _LONG_NUMBER in raw.translate(_DIGITS_ONLY):
        return None
    try:
        return _orjson_loads(raw)
    except ValueError:  # orjson.JSONDecodeError
        return None


# ---------------------------------------------------------------------------------------------
# Commands
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Command:
    """A controller command. ``sig`` is set by ``core.signing.sign_command``."""

    type: CommandType
    run: str
    args: dict[str, Any]
    issued_at: float
    expires_at: float
    id: str = field(default_factory=new_id)
    sig: str = ""
    v: int = SCHEMA_VERSION

    def unsigned_dict(self) -> dict[str, Any]:
        return {
            "v": self.v,
            "id": self.id,
            "run": self.run,
            "type": str(self.type),
            "args": self.args,
            "issued_at": self.issued_at,
            "expires_at": self.expires_at,
        }

    def to_dict(self) -> dict[str, Any]:
        return {**self.unsigned_dict(), "sig": self.sig}


def make_command(
    type: CommandType | str,
    run: str,
    args: Mapping[str, Any] | None = None,
    *,
    ttl_s: float = COMMAND_TTL_S,
    now: float | None = None,
) -> Command:
    """Build and validate an unsigned command that expires ``ttl_s`` after issue."""
    issued = time.time() if now is None else now
    cmd = Command(type=CommandType(type), run=run, args=dict(args or {}), issued_at=issued, expires_at=issued + ttl_s)
    return command_from_dict(cmd.to_dict())


def command_from_dict(obj: Any) -> Command:
    _check_envelope_common(obj)
    try:
        ctype = CommandType(obj.get("type"))
    except ValueError:
        raise SchemaError("type", f"unknown command type {obj.get('type')!r}") from None
    args = check_fields(COMMAND_ARG_SCHEMAS[ctype], obj.get("args", {}), "args")
    if args.get("to_step", 0) > MAX_STEP:  # below 0 is the trainer's to refuse (agent/dispatch.py)
        raise SchemaError("args.to_step", f"must be <= {MAX_STEP}")
    issued = check_value(float, obj.get("issued_at"), "issued_at")
    expires = check_value(float, obj.get("expires_at"), "expires_at")
    if not (math.isfinite(issued) and math.isfinite(expires)):
        raise SchemaError("expires_at", "timestamps must be finite")
    sig = obj.get("sig", "")
    if not isinstance(sig, str):
        raise SchemaError("sig", "expected a string")
    return Command(
        type=ctype, run=obj["run"], args=args, issued_at=issued, expires_at=expires, id=obj["id"], sig=sig, v=obj["v"]
    )


def encode_command(cmd: Command) -> bytes:
    return dumps(cmd.to_dict())


def decode_command(raw: bytes | str, max_bytes: int | None = None) -> Command:
    if max_bytes is not None and len(raw) > max_bytes:
        raise SchemaError("$", f"message of {len(raw)} bytes exceeds the limit of {max_bytes}")
    return command_from_dict(_parse_json(raw))
