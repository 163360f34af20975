"""The event and command contract between the agent (producer) and the controller.

One JSON object per Kafka message, UTF-8, key = run id. Every process reads and writes it
through this module (``core/``), so producer and consumers cannot drift apart.

Where each event fires in the training loop (Composer-style pseudocode)::

    agent.start()                               # RUN_STARTED (rank 0)
    for step in steps:
        batch = next(loader)                    #   data_wait_s measured here
        loss = model(batch); agent.after_forward(loss)
        loss.backward(); agent.after_backward() #   comm_exposed_s from the DDP hook
        if agent.before_optimizer_step():       #   the guard: skip when it trips
            optimizer.step()
        agent.after_step()                      # STEP (every rank), GRAD_HIST every hist_every
        agent.poll_commands()                   # COMMAND_ACK after each applied command,
                                                # VALIDATION for a validate command,
                                                # CHECKPOINT when one is written/verified,
                                                # DATA_FLAG when the data rules mark samples
    # every heartbeat_s on a side thread:       # HEARTBEAT (every rank, also while paused)
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
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from core.enums import AckStatus, CheckpointKind, CommandType, EventType, GuardDecision
from core.floats import WIRE_NONFINITE as _NONFINITE_IN
from core.floats import dumps
from core.policy import COMMAND_TTL_S

SCHEMA_VERSION = 1
MAX_EVENT_BYTES_DEFAULT = 1_000_000


class SchemaError(ValueError):
    """A message that does not fit the contract. ``field`` names the offending field."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


class UnknownVersion(SchemaError):
    """A major schema version this reader does not know."""


# ---------------------------------------------------------------------------------------------
# Field specs. A spec is (kind, required). Kinds: "float" (finite or the non-finite strings),
# "int", "str", "bool", "dict", "list", "float_map" (str -> float), "int_list", "float_list",
# "hist_layers", "enum:<EnumName>", and "any". Extra fields are tolerated (newer minor versions).
# ---------------------------------------------------------------------------------------------

_F, _I, _S, _B = "float", "int", "str", "bool"

DATA_SCHEMAS: dict[EventType, dict[str, tuple[str, bool]]] = {
    EventType.RUN_STARTED: {
        "n_params": (_I, True),
        "n_layers": (_I, True),
        "n_heads": (_I, True),
        "head_dim": (_I, True),
        "seq_len": (_I, True),
        "global_batch": (_I, True),
        "peak_flops": (_F, True),
        "peak_source": (_S, True),  # "table" | "config" | "calibration"
        "lr_schedule": ("dict", True),
        "world_size": (_I, True),
        "config": ("dict", False),
    },
    EventType.STEP: {
        "loss": (_F, True),
        "loss_local": (_F, True),
        "lr": (_F, True),
        "lr_scale": (_F, True),
        "grad_norm": (_F, True),
        "tokens": (_I, True),
        "step_time_s": (_F, True),
        "data_wait_s": (_F, True),
        "comm_exposed_s": (_F, True),
        "compute_s": (_F, True),
        "tokens_per_s": (_F, True),
        "mfu": (_F, True),
        "mem_allocated": (_I, True),
        "mem_reserved": (_I, True),
        "loss_scale": (_F, True),
        "skipped": (_B, True),
        "clipped_layers": (_I, True),
        "guard": ("enum:GuardDecision", True),
        "layer_grad_norms": ("float_map", False),
        "sample_range": ("int_list", False),  # [first, last+1) sample indices of this global batch
    },
    EventType.GRAD_HIST: {
        "edges": ("float_list", True),  # log2-spaced |g| bin edges, fixed for the run
        "layers": ("hist_layers", True),
    },
    EventType.HEARTBEAT: {
        "state": (_S, True),  # running | paused | held | validating | stopping
    },
    EventType.CHECKPOINT: {
        "kind": ("enum:CheckpointKind", True),
        "path": (_S, True),
        "bytes": (_I, True),
        "sha256": (_S, True),
        "seconds": (_F, True),
        "verified": (_B, True),
        "detail": (_S, False),
    },
    EventType.VALIDATION: {
        "cmd": (_S, False),  # command id answered; absent for periodic (val_every) validation
        "val_loss": (_F, True),
        "batches": (_I, True),
    },
    EventType.COMMAND_ACK: {
        "cmd": (_S, True),
        "cmd_type": (_S, False),
        "status": ("enum:AckStatus", True),
        "detail": (_S, False),
    },
    EventType.DATA_FLAG: {
        "sample_ids": ("int_list", True),
        "rule": (_S, True),
        "score": (_F, True),
    },
    EventType.RUN_FINISHED: {
        "final_loss": (_F, False),
        "steps": (_I, False),
    },
    EventType.RUN_FAILED: {
        "error": (_S, True),
    },
}

HIST_LAYER_SCHEMA: dict[str, tuple[str, bool]] = {
    "counts": ("int_list", True),
    "zeros": (_I, True),
    "nonfinite": (_I, True),
    "p50": (_F, True),
    "p99": (_F, True),
    "max": (_F, True),
    "norm": (_F, True),
    "underflow": (_F, True),
    "numel": (_I, False),
}

COMMAND_ARG_SCHEMAS: dict[CommandType, dict[str, tuple[str, bool]]] = {
    CommandType.PAUSE: {"reason": (_S, False)},
    CommandType.RESUME: {"reason": (_S, False)},
    CommandType.VALIDATE: {"batches": (_I, False)},
    CommandType.ROLLBACK: {
        "to_step": (_I, True),
        "lr_scale": (_F, True),
        "skip_data": ("int_list", False),  # [first, last+1) sample indices to skip, or absent
    },
    CommandType.SET_LR_SCALE: {"lr_scale": (_F, True)},
    CommandType.CHECKPOINT_NOW: {"kind": ("enum:CheckpointKind", False)},
    CommandType.STOP: {"reason": (_S, False)},
}

_ENUMS: dict[str, type[StrEnum]] = {
    "GuardDecision": GuardDecision,
    "CheckpointKind": CheckpointKind,
    "AckStatus": AckStatus,
}

_ID_RE = re.compile(r"^[0-9a-f]{32}$")
_RUN_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")


def new_id() -> str:
    return uuid.uuid4().hex


def _check(kind: str, value: Any, where: str) -> Any:
    """Validate one value against a kind; return it normalised (non-finite strings -> floats)."""
    if kind == "any":
        return value
    if kind == _F:
        if isinstance(value, bool):
            raise SchemaError(where, "expected a number, got a boolean")
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str) and value in _NONFINITE_IN:
            return _NONFINITE_IN[value]
        raise SchemaError(where, f"expected a number, got {type(value).__name__}")
    if kind == _I:
        if isinstance(value, bool) or not isinstance(value, int):
            raise SchemaError(where, f"expected an integer, got {type(value).__name__}")
        return value
    if kind == _S:
        if not isinstance(value, str):
            raise SchemaError(where, f"expected a string, got {type(value).__name__}")
        return value
    if kind == _B:
        if not isinstance(value, bool):
            raise SchemaError(where, f"expected true/false, got {type(value).__name__}")
        return value
    if kind == "dict":
        if not isinstance(value, dict):
            raise SchemaError(where, f"expected an object, got {type(value).__name__}")
        return value
    if kind == "list":
        if not isinstance(value, list):
            raise SchemaError(where, f"expected a list, got {type(value).__name__}")
        return value
    if kind in ("int_list", "float_list"):
        if not isinstance(value, list):
            raise SchemaError(where, f"expected a list, got {type(value).__name__}")
        inner = _I if kind == "int_list" else _F
        return [_check(inner, v, f"{where}[{i}]") for i, v in enumerate(value)]
    if kind == "float_map":
        if not isinstance(value, dict):
            raise SchemaError(where, f"expected an object, got {type(value).__name__}")
        return {k: _check(_F, v, f"{where}.{k}") for k, v in value.items()}
    if kind == "hist_layers":
        if not isinstance(value, dict):
            raise SchemaError(where, f"expected an object, got {type(value).__name__}")
        return {k: _check_fields(HIST_LAYER_SCHEMA, v, f"{where}.{k}") for k, v in value.items()}
    if kind.startswith("enum:"):
        enum = _ENUMS[kind[5:]]
        try:
            return enum(value)
        except ValueError:
            allowed = ", ".join(e.value for e in enum)
            raise SchemaError(where, f"{value!r} is not one of: {allowed}") from None
    raise AssertionError(f"unknown field kind {kind}")


def _check_fields(schema: Mapping[str, tuple[str, bool]], obj: Any, where: str) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise SchemaError(where, f"expected an object, got {type(obj).__name__}")
    out = dict(obj)  # unknown fields survive: a newer minor version may add them
    for name, (kind, required) in schema.items():
        if name not in obj or obj[name] is None:
            if required:
                raise SchemaError(f"{where}.{name}", "missing")
            continue
        out[name] = _check(kind, obj[name], f"{where}.{name}")
    return out


def _check_envelope_common(obj: Any) -> None:
    if not isinstance(obj, dict):
        raise SchemaError("$", f"expected a JSON object, got {type(obj).__name__}")
    v = obj.get("v")
    if isinstance(v, bool) or not isinstance(v, int):
        raise SchemaError("v", "missing or not an integer schema version")
    if v != SCHEMA_VERSION:
        raise UnknownVersion("v", f"unknown major schema version {v} (this reader knows {SCHEMA_VERSION})")
    ident = obj.get("id")
    if not isinstance(ident, str) or not _ID_RE.match(ident):
        raise SchemaError("id", "expected 32 lowercase hex characters")
    run = obj.get("run")
    if not isinstance(run, str) or not _RUN_RE.match(run):
        raise SchemaError("run", "expected a run id of 1-128 characters [A-Za-z0-9._:-]")
    if run in _NONFINITE_IN:
        # "NaN"/"Infinity" is how a non-finite float is written on the wire: never a real run id.
        raise SchemaError("run", f"{run!r} is the encoding of a non-finite number, not a run id")


def _parse_json(raw: bytes | str) -> Any:
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
    except UnicodeDecodeError as exc:
        raise SchemaError("$", f"not UTF-8: {exc.reason} at byte {exc.start}") from None

    def _reject_constant(name: str) -> Any:
        raise SchemaError("$", f"bare {name} is not JSON; non-finite floats are sent as strings")

    try:
        return json.loads(text, parse_constant=_reject_constant)
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
) -> Event:
    """Build and validate an event (raises SchemaError naming the field)."""
    etype = EventType(type)
    ev = Event(
        type=etype,
        run=run,
        step=step,
        data=dict(data),
        rank=rank,
        world=world,
        ts=time.time() if ts is None else ts,
    )
    return event_from_dict(ev.to_dict())


def event_from_dict(obj: Any) -> Event:
    _check_envelope_common(obj)
    try:
        etype = EventType(obj.get("type"))
    except ValueError:
        raise SchemaError("type", f"unknown event type {obj.get('type')!r}") from None
    rank = _check(_I, obj.get("rank"), "rank")
    world = _check(_I, obj.get("world"), "world")
    if world < 1 or not 0 <= rank < world:
        raise SchemaError("rank", f"rank {rank} outside world of {world}")
    step = _check(_I, obj.get("step"), "step")
    if step < 0:
        raise SchemaError("step", "must be >= 0")
    ts = _check(_F, obj.get("ts"), "ts")
    if not math.isfinite(ts):
        raise SchemaError("ts", "must be finite")
    data = _check_fields(DATA_SCHEMAS[etype], obj.get("data"), "data")
    return Event(
        type=etype, run=obj["run"], step=step, data=data, rank=rank, world=world, ts=ts, id=obj["id"], v=obj["v"]
    )


def encode_event(event: Event) -> bytes:
    return dumps(event.to_dict())


def decode_event(raw: bytes | str, max_bytes: int | None = None) -> Event:
    """Bytes from Kafka -> a validated Event, or SchemaError naming what is wrong."""
    if max_bytes is not None and len(raw) > max_bytes:
        raise SchemaError("$", f"message of {len(raw)} bytes exceeds the limit of {max_bytes}")
    return event_from_dict(_parse_json(raw))


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
    args = _check_fields(COMMAND_ARG_SCHEMAS[ctype], obj.get("args", {}), "args")
    issued = _check(_F, obj.get("issued_at"), "issued_at")
    expires = _check(_F, obj.get("expires_at"), "expires_at")
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
