"""The consumer edge's pure part: one message's bytes -> a typed ``Event`` or a ``DeadLetter``.

``classify`` takes one message (controller/edge.py's ``EdgeConsumer`` is the I/O around it) and
returns its validated ``Event``, or a ``DeadLetter`` saying why not. Reasons (a closed set, used as the DLQ count key):

- ``oversized`` — more than ``max_bytes`` (checked before anything is parsed)
- ``undecodable`` — no value, not UTF-8, not JSON, or JSON nested too deeply
- ``unknown_version`` — a ``v`` this reader does not know (a newer major version)
- ``schema_invalid`` — JSON that breaks the contract; ``detail`` names the field
- ``clock_skew`` — a ``ts`` outside the ``ClockWindow`` around the controller's clock: a forged
  far-future time would otherwise freeze the run's last step (events only move it forward in
  time) and mask heartbeat silence. The window is wide behind (an agent replays its spill after
  an outage, the controller re-reads a backlog) and narrow ahead (clock skew only).
- ``unsigned`` / ``bad_signature`` — with an agent secret configured (``core/keys.py``): no
  ``cliffguard.sig`` header, or one that is not the HMAC of the value under the event's run key.
  Checked after decoding (the key is the event's run's) and before anything else looks at it, so
  a forged event never reaches the rules, the run's steps or a validation baseline.
- ``out_of_range`` — an integer that does not fit where it is stored (``controller/bounds.py``).
- ``step_jump`` — a step too far from the run's newest accepted one (``controller/bounds.py``).

``classify_polled`` is ``classify`` for a whole poll, with the common case (the typed decoder of
core/batch_decode.py takes the message, no signatures, ``ts`` in the window) in a tight loop and
every other message through ``classify``, so each dead letter is worded in one place.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cliffguard.controller.bounds import OUT_OF_RANGE, STEP_JUMP, StepBounds, out_of_range
from cliffguard.core.batch_decode import BatchDecoder
from cliffguard.core.declared import bounded, check_declared
from cliffguard.core.events import Event, SchemaError, UnknownVersion, decode_event
from cliffguard.core.keys import EVENT_SIG_HEADER, EventVerifier
from cliffguard.core.slots import slot_builder

OVERSIZED = "oversized"
UNDECODABLE = "undecodable"
UNKNOWN_VERSION = "unknown_version"
SCHEMA_INVALID = "schema_invalid"
CLOCK_SKEW = "clock_skew"
UNSIGNED = "unsigned"
BAD_SIGNATURE = "bad_signature"
REASONS = (OVERSIZED, UNDECODABLE, UNKNOWN_VERSION, SCHEMA_INVALID, CLOCK_SKEW, UNSIGNED, BAD_SIGNATURE,
           OUT_OF_RANGE, STEP_JUMP)
DLQ_KEEP_BYTES = 64 * 1024
"""A dead letter's value beyond this is cut off in the DLQ (its first bytes say what it was)."""


@dataclass(frozen=True, slots=True)
class ClockWindow:
    """How far an event's ``ts`` may be from the controller's clock (see the module docstring)."""

    max_clock_skew_s: float = bounded(3600.0, gt=0)
    max_event_age_s: float = bounded(30 * 86400.0, gt=0)

    def __post_init__(self) -> None:
        check_declared(self)

    def bounds(self, now: float) -> tuple[float, float]:
        """(oldest, newest) ``ts`` inside the window around ``now``."""
        return now - self.max_event_age_s, now + self.max_clock_skew_s

    def violation(self, ts: float, now: float) -> str | None:
        """Why ``ts`` is outside the window around ``now``, or None when it is inside."""
        oldest, newest = self.bounds(now)
        if ts > newest:
            return f"ts: {ts!r} is more than {self.max_clock_skew_s:g} s ahead of the controller's clock ({now:.0f})"
        if ts < oldest:
            return f"ts: {ts!r} is more than {self.max_event_age_s:g} s behind the controller's clock ({now:.0f})"
        return None


@dataclass(frozen=True, slots=True)
class DeadLetter:
    reason: str
    detail: str
    topic: str
    partition: int
    offset: int
    raw: bytes
    key: bytes | None = None

    def headers(self) -> list[tuple[str, bytes]]:
        out = [
            ("cliffguard.reason", self.reason.encode()),
            ("cliffguard.detail", self.detail[:1000].encode()),
            ("cliffguard.topic", self.topic.encode()),
            ("cliffguard.partition", str(self.partition).encode()),
            ("cliffguard.offset", str(self.offset).encode()),
        ]
        if self.truncated:
            out += [("cliffguard.truncated", b"1"), ("cliffguard.original_size", str(len(self.raw)).encode())]
        return out

    @property
    def truncated(self) -> bool:
        return len(self.raw) > DLQ_KEEP_BYTES

    def dlq_value(self) -> bytes:
        """What goes to the DLQ: the original bytes, or their first ``DLQ_KEEP_BYTES``."""
        return self.raw[:DLQ_KEEP_BYTES]


@dataclass(frozen=True, slots=True)
class EdgeRecord:
    topic: str
    partition: int
    offset: int
    event: Event


_edge_record = slot_builder(EdgeRecord)
"""``EdgeRecord(topic, partition, offset, event)`` without the frozen ``__init__`` (core/slots.py)."""


@dataclass(slots=True)
class EdgeBatch:
    records: list[EdgeRecord] = field(default_factory=list)
    dead: list[DeadLetter] = field(default_factory=list)
    next_offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    """Per (topic, partition): the offset after the last message in this batch (good or dead)."""


def header(headers: Any, name: str) -> bytes | None:
    """The value of header ``name`` in kafka-python's ``[(str, bytes)]`` (None when absent)."""
    for k, v in headers or ():
        if k == name:
            return v
    return None


def classify(raw: bytes | None, *, topic: str, partition: int, offset: int, max_bytes: int,
             key: bytes | None = None, clock: tuple[ClockWindow, float] | None = None,
             signature: tuple[EventVerifier, bytes | None] | None = None,
             steps: StepBounds | None = None, decoder: BatchDecoder | None = None) -> Event | DeadLetter:
    """One message -> its validated Event, or a DeadLetter with the reason. Never raises.
    ``clock``: (window, now) to check the event's ``ts`` against; None skips the check.
    ``signature``: (verifier, the ``cliffguard.sig`` header) to check; None skips the check.
    ``steps``: the runs' step bounds, moved by each accepted event; None skips the check.
    ``decoder``: tried before ``decode_event`` (core/batch_decode.py), which decides whatever it leaves."""
    origin = (topic, partition, offset, raw or b"", key)
    if raw is None:
        return DeadLetter(UNDECODABLE, "$: message has no value", *origin)
    if len(raw) > max_bytes:
        return DeadLetter(OVERSIZED, f"$: message of {len(raw)} bytes exceeds the limit of {max_bytes}", *origin)
    event = None if decoder is None else decoder.fast(raw)
    checked = event is not None and decoder.bounded  # its integers already fit their storage
    try:
        if event is None:
            event = decode_event(raw)
    except UnknownVersion as exc:
        return DeadLetter(UNKNOWN_VERSION, str(exc), *origin)
    except SchemaError as exc:
        reason = UNDECODABLE if exc.field == "$" else SCHEMA_INVALID
        return DeadLetter(reason, str(exc), *origin)
    except Exception as exc:  # noqa: BLE001 - a decoder bug must not kill the consumer
        return DeadLetter(SCHEMA_INVALID, f"$: {type(exc).__name__}: {exc}", *origin)
    if signature is not None:
        bad = signature[0].check(event.run, raw, signature[1])
        if bad is not None:
            return DeadLetter(bad, f"$: {bad.replace('_', ' ')} event for run {event.run!r}", *origin)
    if clock is not None:
        why = clock[0].violation(event.ts, clock[1])
        if why is not None:
            return DeadLetter(CLOCK_SKEW, why, *origin)
    why = None if checked else out_of_range(event)
    if why is not None:
        return DeadLetter(OUT_OF_RANGE, why, *origin)
    if steps is not None:
        why = steps.check(event)
        if why is not None:
            return DeadLetter(STEP_JUMP, why, *origin)
    return event


def classify_polled(batch: EdgeBatch, polled: Mapping[Any, list[Any]], *, max_bytes: int, decoder: BatchDecoder,
                    clock: tuple[ClockWindow, float], verifier: EventVerifier | None = None,
                    steps: StepBounds | None = None) -> None:
    """``classify`` of every message of one ``KafkaConsumer.poll`` ({partition: [record]}), into
    ``batch``, in order. The common case (``decoder`` takes the message, no signatures to check,
    ``ts`` inside the window) is a tight loop here: ``decoder`` bounds every integer as
    ``out_of_range`` would (it is built with ``int_bounds``), and any other message goes through
    ``classify``, which decides and words every dead letter."""
    window, now = clock
    # with signatures to check, classify does it all (with the decoder)
    fast = decoder.fast if verifier is None and decoder.bounded else None
    oldest, newest = window.bounds(now)
    records, dead, next_offsets = batch.records, batch.dead, batch.next_offsets
    for tp, messages in polled.items():
        topic, partition = tp.topic, tp.partition
        for msg in messages:
            raw, offset = msg.value, msg.offset
            event = fast(raw) if fast is not None and raw is not None and len(raw) <= max_bytes else None
            if event is not None and oldest <= event.ts <= newest:
                why = None if steps is None else steps.check(event)
                if why is None:
                    records.append(_edge_record(topic, partition, offset, event))
                else:
                    dead.append(DeadLetter(STEP_JUMP, why, topic, partition, offset, raw, msg.key))
                continue
            sig = None if verifier is None else (verifier, header(msg.headers, EVENT_SIG_HEADER))
            out = classify(raw, topic=topic, partition=partition, offset=offset, max_bytes=max_bytes,
                           key=msg.key, clock=clock, signature=sig, steps=steps,
                           decoder=decoder if fast is None else None)  # else it already failed, or ts did
            if type(out) is DeadLetter:
                dead.append(out)
            else:
                records.append(_edge_record(topic, partition, offset, out))
        if messages:
            next_offsets[(topic, partition)] = messages[-1].offset + 1
