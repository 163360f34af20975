"""Getting events off the training thread and onto Kafka without ever blocking or raising.

``Publisher.publish(draft)`` appends to a bounded in-memory queue and returns (microseconds; no
lock held beyond a deque append, no I/O, no encoding; the ``EventDraft``, agent/drafts.py, is not
even validated there: the thread builds it). A background thread owns the kafka-python
``KafkaProducer`` and does everything else::

    training thread ──publish──► deque (queue_max) ──► publisher thread
                                                          │ broker up, spill empty: send + flush per batch
                                                          │ broker down / spill non-empty: append to spill
                                                          ▼
                                   <prefix>.metrics (key = run id)   or   spill file (agent/spill.py)

Order: a run's events reach Kafka in publish order. While the broker is down, new events go
behind the older ones in the spill. Once it is back the spill is replayed oldest first (one
chunk per loop turn) while newer events wait in memory (or, past half of ``queue_max``, join
the spill's tail), and only then are events sent directly again. The producer keeps one request in flight per
connection, so a failed batch cannot be overtaken by a later batch of the same partition; the
failed records are spilled in order and the producer is discarded (a broker that lost its memory,
as Tansu does on restart, also forgets the producer id).

The link's states (down, replaying, live, closed) and the events that move it are declared in
agent/publisher_link.py; the publisher thread's loop acts on the current state and moves only
through that table.

Outage detection and return: a batch that is not acknowledged within ``send_timeout_s`` marks
the broker down. The thread then probes (new producer + topic check) with exponential backoff
from ``reconnect_min_s`` to ``reconnect_max_s``. On every (re)connect the metrics topic is
created if missing, with the configured partitions: a broker that restarted empty gets it back
before anything is replayed.

Drops are never silent. An event is dropped only when the in-memory queue is full (the thread
is far behind) or the spill is full (``spill_max_bytes``: the broker has been away long enough
to fill it); the newest events are the ones dropped, so the spill stays a gap-free prefix. Each
drop is counted (``stats()['dropped']``); the first drop logs a warning, and again every 1000 more; and every ``heartbeat`` event passing through the publisher is
stamped with ``data["dropped_events"]`` (cumulative for this publisher) and
``data["spill_pending"]`` so the controller sees the loss as soon as the broker is reachable.

A crash of the publisher thread (a bug, a full disk) is logged with its traceback, counted in
``stats()['crashes']`` / ``last_error`` and the thread restarts itself after a backoff; the batch
it held is retried (dropped, counted, after three crashes in a row on it). Nothing is raised
into the caller of ``publish``.

``close(timeout)`` stops taking events and flushes: the queue and the spill go to Kafka if the
broker is reachable before the deadline; whatever is left is written to the spill file, which
the next publisher with the same ``spill_path`` replays first. One spill file per process: give
each rank its own ``spill_path``.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import struct
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from cliffguard.agent.acked_tail import AckedTail, LostLog
from cliffguard.agent.drafts import EventDraft
from cliffguard.agent.kafka_client import discard_producer, ensure_topic
from cliffguard.agent.publisher_config import PublisherConfig, kafka_producer, topic_id_of
from cliffguard.agent.publisher_link import Link, LinkEvent, LinkState
from cliffguard.agent.spill import SpillFile
from cliffguard.core import kafka_log
from cliffguard.core.enums import EventType
from cliffguard.core.events import encode_event
from cliffguard.core.kafka_config import KafkaConfig
from cliffguard.core.keys import EventSigner

log = logging.getLogger(__name__)

_KEYLEN = struct.Struct(">H")

IDLE_WAIT_S = 1.0
"""Longest sleep of an idle, connected publisher thread; ``publish`` wakes it at once."""


_ROUTINE = frozenset({EventType.STEP, EventType.RANKS, EventType.HEARTBEAT, EventType.GRAD_HIST})


def _urgent(event: EventDraft) -> bool:
    """Whether the controller acts on this event at once: not routine telemetry, or a step the
    guard did not pass (the spike and rollback rules' input)."""
    if event.type not in _ROUTINE:
        return True
    return event.type == EventType.STEP and event.data.get("guard", "ok") != "ok"


def _pack(key: bytes, value: bytes) -> bytes:
    return _KEYLEN.pack(len(key)) + key + value


def _unpack(payload: bytes) -> tuple[bytes, bytes]:
    (n,) = _KEYLEN.unpack_from(payload)
    return payload[2 : 2 + n], payload[2 + n :]


ProducerFactory = Callable[[], Any]
"""Builds a connected producer (``send``/``flush``/``partitions_for``/``close``) or raises."""


Record = tuple[bytes, bytes]  # (key, value)


class Publisher:
    """The agent's Kafka sink (see the module docstring for every guarantee)."""

    def __init__(
        self,
        kafka: KafkaConfig,
        config: PublisherConfig | None = None,
        *,
        producer_factory: ProducerFactory | None = None,
        signer: EventSigner | None = None,
    ) -> None:
        self.kafka = kafka
        self.signer = signer
        """Signs each record's value as it is sent (live or replayed), so the spill keeps plain
        records; None sends unsigned (a controller with an agent secret dead-letters them)."""
        self.config = config or PublisherConfig()
        self.topic = kafka.metrics_topic
        self._producer_factory = producer_factory or functools.partial(kafka_producer, kafka, self.config)
        self._queue: deque[EventDraft] = deque()
        self._first_at = 0.0  # when the queue last went from empty to not: the batch window's start
        self._urgent = False  # an event that must not wait for the window is queued
        self._queue_max = self.config.queue_max
        self._wake = threading.Event()
        self._closing = threading.Event()
        self._deadline = float("inf")
        self._thread: threading.Thread | None = None
        self._spill: SpillFile | None = None
        self._producer: Any = None
        self._link = Link()
        """Down, replaying, live or closed (agent/publisher_link.py: the declared moves)."""
        self._next_probe = 0.0
        self._backoff = self.config.reconnect_min_s
        self._held: list[Record] = []
        self._held_crashes = 0
        self._tail = AckedTail(self.config.resend_window_s, self.config.resend_max_bytes)
        self._resend: deque[Record] = deque()  # acknowledged, then lost with the broker's log
        self._resent = 0
        self._log_losses = 0
        # publish() runs on several threads (training loop, heartbeat thread); drops are rare,
        # so their counters take a lock and the common path takes none.
        self._drop_lock = threading.Lock()
        self._dropped_queue = 0
        self._dropped_closed = 0
        self._dropped_spill = 0
        self._dropped_crash = 0
        self._dropped_logged = 0
        self._sent = 0
        self._spilled = 0
        self._replayed = 0
        self._errors = 0
        self._crashes = 0
        self.last_error = ""

    # -- the training thread's side -------------------------------------------------------------

    def start(self) -> Publisher:
        kafka_log.install()  # kafka-python's closed-socket race: one line, not a traceback
        if self._thread is None:
            self._spill = SpillFile(self.config.spill_path, self.config.spill_max_bytes,
                                    fsync_interval_s=self.config.fsync_interval_s)
            self._thread = threading.Thread(target=self._run, name="cliffguard-publisher", daemon=True)
            self._thread.start()
        return self

    def publish(self, event: EventDraft) -> None:
        """Hand a draft to the publisher thread, which builds, validates and encodes it (the
        training thread does neither). Never blocks, never raises."""
        if self._closing.is_set():
            with self._drop_lock:
                self._dropped_closed += 1
            return
        queue = self._queue
        if len(queue) >= self._queue_max:
            with self._drop_lock:
                self._dropped_queue += 1
            return
        queue.append(event)
        if len(queue) == 1:
            self._first_at = time.monotonic()
            self._wake.set()
        if _urgent(event):
            self._urgent = True
            self._wake.set()

    def close(self, timeout: float = 10.0) -> None:
        """Stop taking events; deliver what is queued or spilled until ``timeout``; then spill the rest."""
        if self._closing.is_set():
            return
        self._deadline = time.monotonic() + timeout
        self._closing.set()
        self._wake.set()
        if self._thread is not None:
            # The thread honours the deadline itself; the grace covers one probe or flush in flight.
            self._thread.join(timeout + self.config.send_timeout_s + 3.0)
            if self._thread.is_alive():
                log.error("publisher thread did not stop within %.1fs; %d events may be lost", timeout, len(self._queue))
        s = self.stats()
        log.info("publisher closed: sent=%d spilled=%d replayed=%d dropped=%d left in spill=%d",
                 s["sent"], s["spilled"], s["replayed"], s["dropped"], s["spill_pending"])

    @property
    def link(self) -> Link:
        """The link's state and its latest moves (read it; only the publisher thread moves it)."""
        return self._link

    def dropped(self) -> int:
        return self._dropped_queue + self._dropped_closed + self._dropped_spill + self._dropped_crash

    def stats(self) -> dict[str, Any]:
        spill = self._spill
        return {
            "queued": len(self._queue),
            "sent": self._sent,
            "spilled": self._spilled,
            "replayed": self._replayed,
            "dropped": self.dropped(),
            "dropped_queue_full": self._dropped_queue,
            "dropped_spill_full": self._dropped_spill,
            "dropped_after_close": self._dropped_closed,
            "errors": self._errors,
            "crashes": self._crashes,
            "broker_up": self._link.up,
            "spill_pending": spill.pending_records if spill is not None else 0,
            "spill_bytes": spill.pending_bytes if spill is not None else 0,
            "spill_corrupt": spill.corrupt_records if spill is not None else 0,
            "spill_write_errors": spill.write_errors if spill is not None else 0,
            "log_losses": self._log_losses,
            "resent": self._resent,
            "resend_pending": len(self._resend),
            "last_error": self.last_error,
        }

    # -- the publisher thread ------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            try:
                self._loop()
                break
            except Exception as exc:  # noqa: BLE001 - reported, never raised into training
                self._crashes += 1
                self._errors += 1
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.exception("publisher thread crashed (%d so far); restarting", self._crashes)
                self._held_crashes += 1
                if self._held_crashes >= 3 and self._held:
                    self._dropped_crash += len(self._held)
                    log.error("dropping %d events that crashed the publisher 3 times", len(self._held))
                    self._held = []
                if self._producer is not None:
                    discard_producer(self._producer)
                    self._producer = None
                self._link.move(LinkEvent.CRASHED)
                if self._closing.is_set() and time.monotonic() >= self._deadline:
                    break
                time.sleep(min(0.05 * 2 ** self._crashes, 2.0))
        self._shutdown()

    def _loop(self) -> None:
        spill = self._spill
        assert spill is not None
        while True:
            closing = self._closing.is_set()
            if not self._held and self._gathering(closing):
                continue
            if not self._held:
                self._held = self._take()
            if closing and time.monotonic() >= self._deadline:
                self._spill_records(self._held + self._take(len(self._queue)))
                self._held = []
                return
            link = self._link
            if link.state is LinkState.DOWN:
                # Park everything on disk before a probe that may take up to send_timeout_s.
                while self._held:
                    self._spill_records(self._held)
                    self._held = self._take()
                if time.monotonic() >= self._next_probe:
                    self._connect()
            if link.state is LinkState.REPLAYING:
                if self._resend:
                    self._resend_chunk()
                elif len(spill):
                    self._replay_chunk()
                if link.state is LinkState.REPLAYING and not len(spill) and not self._resend:
                    link.move(LinkEvent.SPILL_DRAINED)
            if self._held:
                if link.state is LinkState.LIVE:
                    self._send_live(self._held)
                    self._held = []
                elif link.state is LinkState.DOWN or len(self._queue) >= self._queue_max // 2:
                    self._spill_records(self._held)
                    self._held = []
                # else: the broker is back and the spill is replaying; these wait in memory
                # behind it rather than compete for the spill's room.
            self._held_crashes = 0
            self._report_drops()
            backlog = len(spill) or self._resend
            if closing and not self._queue and (not backlog or not link.up and self._next_probe >= self._deadline):
                return
            if not self._queue and (not backlog or not link.up):
                # Up: nothing to do until publish (or close) sets the event.
                wait = IDLE_WAIT_S if link.up else max(0.0, min(self._next_probe - time.monotonic(), 0.2))
                self._wake.clear()
                if not self._queue:
                    self._wake.wait(wait)

    def _gathering(self, closing: bool) -> bool:
        """Let the current batch window fill (live sending only); True when it waited."""
        if closing or self._link.state is not LinkState.LIVE or len(self._spill or ()) or self._resend:
            return False
        queued = len(self._queue)
        if not queued or queued >= self.config.max_batch or self._urgent:
            return False
        remaining = self._first_at + self.config.linger_s - time.monotonic()
        if remaining <= 0:
            return False
        self._wake.clear()  # set again by an urgent publish or close
        if not self._urgent:
            self._wake.wait(remaining)
        return True

    def _take(self, limit: int | None = None) -> list[Record]:
        """Pop up to ``max_batch`` events off the queue and encode them (heartbeats get stamped)."""
        queue = self._queue
        self._urgent = False  # before popping: an urgent event queued from now on sets it again
        out: list[Record] = []
        for _ in range(min(len(queue), limit if limit is not None else self.config.max_batch)):
            draft = queue.popleft()
            try:
                event = draft.build()
                if event.type == EventType.HEARTBEAT:
                    event = dataclasses.replace(event, data={
                        **event.data, "dropped_events": self.dropped(), "spill_pending": len(self._spill or ())})
                out.append((event.run.encode(), encode_event(event)))
            except Exception as exc:  # noqa: BLE001 - one unencodable event must not stop the rest
                self._errors += 1
                self._dropped_crash += 1
                self.last_error = f"cannot build or encode {draft.type} event: {exc}"
                log.error("dropping an event that cannot be encoded: %s", exc)
        return out

    def _connect(self) -> None:
        producer = None
        try:
            producer = self._producer_factory()
            if self.config.create_topic:
                ensure_topic(self.kafka, self.topic, self.config.send_timeout_s)
            if not producer.partitions_for(self.topic):
                raise RuntimeError(f"topic {self.topic} has no partitions")
        except Exception as exc:  # noqa: BLE001 - any failure means "not reachable yet"
            if producer is not None:
                discard_producer(producer)
            if self._backoff == self.config.reconnect_min_s:
                log.warning("broker %s not reachable (%s); spilling to %s", self.kafka.bootstrap, exc,
                            self.config.spill_path)
            self._next_probe = time.monotonic() + self._backoff
            self._backoff = min(self._backoff * 2, self.config.reconnect_max_s)
            return
        self._producer = producer
        lost = self._tail.check_topic(topic_id_of(producer, self.topic))
        if lost is not None:
            self._log_lost(lost)
        self._link.move(LinkEvent.CONNECTED)
        self._backoff = self.config.reconnect_min_s
        pending = len(self._spill or ())
        if pending:
            log.info("broker %s reachable; replaying %d spilled events", self.kafka.bootstrap, pending)

    def _mark_down(self, reason: str) -> None:
        self._errors += 1
        self.last_error = reason
        log.warning("broker %s unreachable (%s); spilling to %s", self.kafka.bootstrap, reason, self.config.spill_path)
        if self._producer is not None:
            discard_producer(self._producer)
            self._producer = None
        self._link.move(LinkEvent.SEND_FAILED)
        self._backoff = self.config.reconnect_min_s
        self._next_probe = time.monotonic() + self._backoff

    def _send(self, records: list[Record]) -> list[bool]:
        """Send and flush; per record, whether the broker acknowledged it."""
        producer = self._producer
        futures = []
        error = ""
        signer = self.signer
        try:
            for key, value in records:
                if signer is None:
                    futures.append(producer.send(self.topic, key=key, value=value))
                else:
                    futures.append(producer.send(self.topic, key=key, value=value, headers=signer.headers(value)))
        except Exception as exc:  # noqa: BLE001 - metadata timeout, buffer full: broker trouble
            error = f"send: {type(exc).__name__}: {exc}"
        try:
            producer.flush(timeout=self.config.send_timeout_s + 1.0)
        except Exception as exc:  # noqa: BLE001
            error = error or f"flush: {type(exc).__name__}: {exc}"
        ok = [f.is_done and f.succeeded() for f in futures] + [False] * (len(records) - len(futures))
        if any(ok) and self._tail.enabled:
            self._remember(records, futures, ok, producer)
        if not all(ok):
            failure = next((f.exception for f in futures if f.is_done and f.failed()), None)
            self._mark_down(error or f"{type(failure).__name__}: {failure}")
        return ok

    def _remember(self, records: list[Record], futures: list[Any], ok: list[bool], producer: Any) -> None:
        """Keep what the broker acknowledged, with where it landed (agent/acked_tail.py)."""
        acked = []
        for record, fut, good in zip(records, futures, ok, strict=False):
            meta = getattr(fut, "value", None) if good else None
            offset = getattr(meta, "offset", None)
            if isinstance(offset, int):
                acked.append((record, getattr(meta, "partition", 0), offset))
        lost = self._tail.add(acked, topic_id_of(producer, self.topic))
        if lost is not None:
            self._log_lost(lost)
            if self._link.state in (LinkState.LIVE, LinkState.REPLAYING):
                self._link.move(LinkEvent.LOG_LOST)

    def _log_lost(self, lost: LostLog) -> None:
        self._log_losses += 1
        self._resend.extend(lost.records)
        log.warning("the broker lost its log (%s): sending again the %d events it acknowledged in the last %.0f s%s",
                    lost.why, len(lost.records), lost.oldest_age_s,
                    f"; {lost.trimmed} acknowledged before that had left the window (resend_window_s="
                    f"{self.config.resend_window_s:g}) and are lost if no consumer had read them" if lost.trimmed else "")

    def _resend_chunk(self) -> None:
        chunk = [self._resend[i] for i in range(min(len(self._resend), self.config.max_batch))]
        ok = self._send(chunk)
        done = next((i for i, good in enumerate(ok) if not good), len(ok))
        for _ in range(done):
            self._resend.popleft()
        self._resent += done
        self._sent += done

    def _send_live(self, records: list[Record]) -> None:
        ok = self._send(records)
        self._sent += sum(ok)
        self._spill_records([r for r, good in zip(records, ok, strict=True) if not good])

    def _replay_chunk(self) -> None:
        spill = self._spill
        assert spill is not None
        records = [_unpack(p) for p in spill.peek(self.config.max_batch)]
        ok = self._send(records)
        # Only the leading run of successes is consumed, so the spill stays in order; a later
        # success past a failure is re-sent (a duplicate the consumer drops by event id).
        done = next((i for i, good in enumerate(ok) if not good), len(ok))
        spill.consume(done)
        self._replayed += done
        self._sent += done

    def _spill_records(self, records: list[Record]) -> None:
        spill = self._spill
        assert spill is not None
        written = spill.append_many([_pack(key, value) for key, value in records])
        self._spilled += written
        self._dropped_spill += len(records) - written

    def _report_drops(self) -> None:
        dropped = self.dropped()
        if dropped != self._dropped_logged:
            if self._dropped_logged == 0 or dropped - self._dropped_logged >= 1000:
                log.warning("publisher dropped %d events so far (queue full %d, spill full %d); see stats()",
                            dropped, self._dropped_queue, self._dropped_spill)
                self._dropped_logged = dropped

    def _shutdown(self) -> None:
        leftover = list(self._resend) + self._held + self._take(len(self._queue))
        self._resend.clear()
        self._held = []
        if leftover and self._spill is not None:
            try:
                self._spill_records(leftover)  # for the next start to replay
            except Exception as exc:  # noqa: BLE001
                self._dropped_crash += len(leftover)
                log.error("could not spill %d events at close: %s", len(leftover), exc)
        if self._producer is not None:
            try:
                self._producer.close(timeout=max(0.0, min(2.0, self._deadline - time.monotonic())))
            except Exception:  # noqa: BLE001
                discard_producer(self._producer)
            self._producer = None
        self._link.move(LinkEvent.SHUT_DOWN)
        if self._spill is not None:
            if len(self._spill):
                log.warning("publisher: %d events left in %s (kept; a later start does not replay another start's file)",
                            len(self._spill), self.config.spill_path)
            self._spill.close()

