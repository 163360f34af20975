"""The soak's independent witness: a plain reader of the metrics and commands topics.

No consumer group and nothing of the controller's: ``assign`` every partition, read from the
beginning, and when a topic's id changes (the broker re-created it) or its partitions go missing
and come back, assign again and read it from the beginning once more. Every event id, run, step
and type it sees is kept (the first sighting, and how often it was seen), with the few payload
fields the invariants need: a step's ``lr_scale`` and ``skipped``, an ack's command, type and
status. Commands are kept by id with their type, run and timestamps. Decoding is ``json.loads``:
the witness trusts nothing the product decodes.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from cliffguard.core.kafka_config import KafkaConfig
from cliffguard.core.topic_watch import TopicIdWatch

log = logging.getLogger(__name__)

STEP_FIELDS = ("lr_scale", "skipped", "guard")
ACK_FIELDS = ("cmd", "cmd_type", "status")


def event_record(obj: dict[str, Any], seen_at: float) -> dict[str, Any]:
    """What the witness keeps of one event (pure)."""
    data = obj.get("data") if isinstance(obj.get("data"), dict) else {}
    keep = (
        STEP_FIELDS if obj.get("type") == "step" else ACK_FIELDS if obj.get("type") == "command.ack" else ()
    )
    return {
        "id": obj.get("id"),
        "type": obj.get("type"),
        "run": obj.get("run"),
        "rank": obj.get("rank"),
        "step": obj.get("step"),
        "ts": obj.get("ts"),
        "seen_at": seen_at,
        **{k: data.get(k) for k in keep},
    }


def command_record(obj: dict[str, Any], seen_at: float) -> dict[str, Any]:
    return {
        "id": obj.get("id"),
        "type": obj.get("type"),
        "run": obj.get("run"),
        "issued_at": obj.get("issued_at"),
        "expires_at": obj.get("expires_at"),
        "seen_at": seen_at,
    }


@dataclass
class Seen:
    """Everything the witness saw, by id (first sighting) with a count of sightings."""

    events: dict[str, dict[str, Any]] = field(default_factory=dict)
    commands: dict[str, dict[str, Any]] = field(default_factory=dict)
    sightings: dict[str, int] = field(default_factory=dict)
    undecodable: int = 0
    recreations: int = 0
    errors: int = 0

    def add(self, topic_kind: str, raw: bytes | None, seen_at: float) -> None:
        try:
            obj = json.loads(raw or b"")
        except ValueError:
            self.undecodable += 1
            return
        if not isinstance(obj, dict) or not isinstance(obj.get("id"), str):
            self.undecodable += 1
            return
        key = f"{topic_kind}:{obj['id']}"
        self.sightings[key] = self.sightings.get(key, 0) + 1
        book = self.events if topic_kind == "metrics" else self.commands
        if obj["id"] not in book:
            book[obj["id"]] = (event_record if topic_kind == "metrics" else command_record)(obj, seen_at)


class Witness:
    """Tails ``<prefix>.metrics`` and ``<prefix>.commands`` on a thread until ``stop``."""

    def __init__(self, kafka: KafkaConfig, poll_s: float = 0.2) -> None:
        self.kafka = kafka
        self.poll_s = poll_s
        self.topics = {kafka.metrics_topic: "metrics", kafka.commands_topic: "commands"}
        self.seen = Seen()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-witness", daemon=True)
        self._consumer: Any = None
        self._watches = {t: TopicIdWatch(t) for t in self.topics}
        self._assigned: set[Any] = set()
        self._behind: int | None = None
        self._behind_at = 0.0

    def start(self) -> Witness:
        self._thread.start()
        return self

    def _new_consumer(self) -> Any:
        from kafka import KafkaConsumer

        return KafkaConsumer(
            **self.kafka.client_kwargs(),
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            client_id="soak-witness",
            metadata_max_age_ms=2_000,
            reconnect_backoff_max_ms=1_000,
            fetch_max_wait_ms=200,
        )

    def _assign(self, restart: bool) -> None:
        """Assign every partition of both topics; ``restart``: read them all from the beginning."""
        from kafka import TopicPartition

        tps = set()
        for topic in self.topics:
            tps |= {
                TopicPartition(topic, p) for p in sorted(self._consumer.partitions_for_topic(topic) or ())
            }
        if tps != self._assigned or restart:
            self._consumer.assign(sorted(tps))
            if tps:
                self._consumer.seek_to_beginning(*sorted(tps))
            self._assigned = tps

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if self._consumer is None:
                    self._consumer = self._new_consumer()
                    self._assign(restart=True)
                polled = self._consumer.poll(timeout_ms=int(self.poll_s * 1000))
                recreated = [t for t, w in self._watches.items() if w.changed(self._consumer)]
                if recreated:
                    with self._lock:
                        self.seen.recreations += len(recreated)
                    self._assign(restart=True)
                    continue  # what was polled came from stale positions; read again from 0
                now = time.time()
                with self._lock:
                    for tp, records in polled.items():
                        for rec in records:
                            self.seen.add(self.topics[tp.topic], rec.value, now)
                self._assign(restart=False)  # partitions that (re)appeared since
                if now - self._behind_at >= 1.0:
                    self._measure_lag(now)
            except Exception as exc:  # noqa: BLE001 - the broker comes and goes; keep reading
                with self._lock:
                    self.seen.errors += 1
                log.debug("witness: %s: %s", type(exc).__name__, exc)
                self._stop.wait(0.5)
        if self._consumer is not None:
            try:
                self._consumer.close()
            except Exception:  # noqa: BLE001
                pass

    def _measure_lag(self, now: float) -> None:
        """On the witness thread (a consumer is not shared between threads): records behind the ends."""
        ends = self._consumer.end_offsets(sorted(self._assigned)) if self._assigned else {}
        behind = sum(max(0, end - self._consumer.position(tp)) for tp, end in ends.items())
        self._behind, self._behind_at = (behind if ends else None), now

    def caught_up(self, since: float) -> bool:
        """True once a lag measured after ``since`` (epoch s) found every partition read to its end."""
        return self._behind == 0 and self._behind_at > since

    def snapshot(self) -> Seen:
        with self._lock:
            return Seen(
                dict(self.seen.events),
                dict(self.seen.commands),
                dict(self.seen.sightings),
                self.seen.undecodable,
                self.seen.recreations,
                self.seen.errors,
            )

    def stop(self) -> Seen:
        self._stop.set()
        self._thread.join(15)
        return self.snapshot()
