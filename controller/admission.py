"""The suspect-node list for launchers (issue 22, item 4: admission before a node joins).

``SuspectBoard`` publishes the store's suspect set (``controller/store/suspects.py`` ``standing``)
to the compacted topic ``<prefix>.suspects``, one signed entry per node keyed by the node
(``core/admission.py``): ``suspect`` for a node the store refuses (cause, reason, since, run,
incident, record id), ``cleared`` for a node with a record that is cleared or on probation. A
launcher (``cliffguard train``, ``cliffguard/admission.py``) reads it to its end before its node
joins torchrun's rendezvous and refuses to start on a suspect node.

When: once at start, every node with a record (a fresh or emptied topic is filled: the embedded
broker keeps nothing across a restart); then each pass sends only the nodes whose entry changed.
A pass runs every ``interval_s`` (``REFRESH_S``, 10 s: a clear or recheck from the CLI, which writes
the store directly, is published within that) and at once when ``wake`` is called: the service
wakes it after committing a batch that recorded or cleared a suspect. An entry is taken as
published only once the broker acknowledged it, so a broker that is away gets the changes when it
is back. A broker that restarted empty (the embedded one keeps nothing) learns a node again at its
next change, and every node within ``republish_s`` (10 min): a pass re-sends everything that often.

Entries are signed with the controller's command key (``core/signing.py``). One pass reads one
small table; the database transaction is never held open while talking to Kafka.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from sqlalchemy import Engine

from cliffguard.controller.store.db import session_scope
from cliffguard.controller.store.suspects import Standing, standing
from cliffguard.controller.suspects import REFRESH_S
from cliffguard.core.admission import cleared_entry, device_entry, encode_entry, suspect_entry
from cliffguard.core.kafka_config import KafkaConfig
from cliffguard.core.kafka_producers import RecoveringProducer
from cliffguard.core.signing import SigningKey

log = logging.getLogger(__name__)

REPUBLISH_S = 600.0
"""Every node's entry is sent again this often (a broker that restarted empty is filled again)."""


def entry_of(st: Standing, at: float) -> dict[str, Any]:
    """The node's entry: suspect when the store refuses it, cleared otherwise (cleared, probation),
    with the device slots of its open device-level records."""
    if st.refused and st.open is not None:
        rec = st.open
        return suspect_entry(st.node, cause=rec.cause, reason=rec.reason, since=rec.since, run=rec.run_id,
                             incident=rec.incident_id, record=rec.id, at=at)
    devices = [device_entry(r.device, cause=r.cause, reason=r.reason, since=r.since, run=r.run_id,
                            incident=r.incident_id, record=r.id) for r in st.devices if r.device is not None]
    return cleared_entry(st.node, at=at, devices=devices)


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return {k: v for k, v in a.items() if k != "at"} == {k: v for k, v in b.items() if k != "at"}


class SuspectBoard:
    def __init__(self, engine: Engine, kafka: KafkaConfig, key: SigningKey, *, interval_s: float = REFRESH_S,
                 republish_s: float = REPUBLISH_S, producer: Any = None) -> None:
        self.engine = engine
        self.kafka = kafka
        self.key = key
        self.interval_s = interval_s
        self.republish_s = republish_s
        self.topic = kafka.suspects_topic
        if producer is None:
            self._producer = RecoveringProducer(kafka, self._build, name="suspect-node list")
        else:  # a test's producer
            self._producer = RecoveringProducer(kafka, lambda: producer, name="suspect-node list", probe=lambda _k: True)
        self._published: dict[str, dict[str, Any]] = {}
        """node -> the entry the broker acknowledged last."""
        self._full_at = float("-inf")
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.sent = 0
        self.errors = 0
        self._down = False

    def _build(self) -> Any:
        from kafka import KafkaProducer

        return KafkaProducer(**self.kafka.client_kwargs(), client_id="cliffguard-suspects", acks="all",
                             linger_ms=0, retries=3, max_block_ms=5_000, bootstrap_timeout_ms=5_000)

    def publish_due(self, now: float | None = None) -> int:
        """One pass: send each node whose entry changed (every node at the first pass and every
        ``republish_s``); returns the entries the broker acknowledged. Raises on a store error."""
        with self._lock:
            now = time.time() if now is None else now
            with session_scope(self.engine) as s:
                nodes = standing(s)
            full = now - self._full_at >= self.republish_s
            due = {n: entry_of(st, now) for n, st in nodes.items()}
            if not full:
                due = {n: e for n, e in due.items() if n not in self._published or not _same(e, self._published[n])}
            if not due:
                return 0
            try:
                producer = self._producer.get()
                sends = [(n, e, producer.send(self.topic, key=n.encode(), value=encode_entry(e, self.key)))
                         for n, e in sorted(due.items())]
                producer.flush(timeout=self.kafka.request_timeout_ms / 1000)
            except Exception as exc:  # noqa: BLE001 - no broker now: the next pass sends them again
                self.errors += 1
                (log.info if self._down else log.warning)(
                    "suspect-node list not published (%d entries; retried every %.0f s): %s: %s", len(due),
                    self.interval_s, type(exc).__name__, exc)
                self._down = True
                if self._producer.current is not None:
                    self._producer.failed(self._producer.current, exc)
                return 0
            self._down = False
            done = 0
            failed: object = None
            for node, entry, fut in sends:
                if fut.is_done and fut.succeeded():
                    self._published[node] = entry
                    done += 1
                else:
                    failed = failed or (fut.exception if fut.is_done else "not confirmed")
            if failed is not None:
                self.errors += 1
                log.warning("suspect-node list: %d of %d entries not acknowledged (retried): %s",
                            len(sends) - done, len(sends), failed)
                self._producer.failed(producer, failed)
            elif full:
                self._full_at = now
            self.sent += done
            refused = sorted(n for n, e in due.items() if e["state"] == "suspect" and n in self._published)
            if refused:
                log.info("suspect-node list: published %d entries to %s (refused: %s)", done, self.topic,
                         ", ".join(refused[:10]) + (" ..." if len(refused) > 10 else ""))
            return done

    def wake(self) -> None:
        self._wake.set()

    def start(self) -> SuspectBoard:
        self._thread = threading.Thread(target=self._loop, name="cliffguard-suspects", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.publish_due()
            except Exception as exc:  # noqa: BLE001 - the store is busy or away: the next pass reads it again
                log.warning("suspect-node list pass failed: %s: %s", type(exc).__name__, exc)
            self._wake.wait(self.interval_s)
            self._wake.clear()

    def close(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self._producer.close(timeout=timeout)
