"""The controller's consumer edge: Kafka bytes in, typed events (or dead letters) out.

``controller/edge_classify.py`` is the pure part (``classify``, ``classify_polled``, the dead
letters and their reasons).

``EdgeConsumer`` is the thin I/O around it: a consumer group on ``<prefix>.metrics`` with
auto-commit off (the controller stores offsets with its state and commits them itself). Each dead
letter is produced to ``<prefix>.dlq`` before ``poll`` returns: the value is the original bytes
untouched, the key the original key, and the metadata rides in headers (``cliffguard.reason``,
``cliffguard.detail``, ``cliffguard.topic``, ``cliffguard.partition``, ``cliffguard.offset``).
A dead letter's value is cut to its first ``DLQ_KEEP_BYTES`` when larger (an oversized message
of many MB would otherwise exceed what the DLQ producer and the broker take, and be lost); the
headers then say ``cliffguard.truncated: 1`` and ``cliffguard.original_size``, and
``dlq_truncated`` counts them. The consumer fetches up to ``max_fetch_bytes`` per partition so a
message far over ``max_bytes`` still arrives to be dead-lettered: a fetch limit below a message's
size stalls the partition on it for good (nothing is returned and nothing is raised).
A recreated metrics topic (new topic id, offsets from 0 again: e.g. a broker that restarted
empty) is noticed by its topic id in the metadata; the batch polled at the stale positions is
dropped and ``on_recreated(topic, topic_id)`` hands the decision to the owner, which keeps the
offsets (``controller/service.py`` decides what a re-created or truncated topic means, in one
place). Without an owner, the edge reads the new topic from its beginning itself.
Nothing a message contains can make ``poll`` raise; failures to reach the DLQ are logged and
counted (``dlq_send_errors``), and the dead letter is still returned so the caller can count it.
The DLQ producer is dropped after a send the broker did not acknowledge and built again for the
next dead letter (``core/kafka_producers.py``: a restarted broker forgets producer ids). The log
says so once per reason per minute, with counts (controller/dead_letter_log.py).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from cliffguard.controller.bounds import StepBounds, int_bounds
from cliffguard.controller.dead_letter_log import DeadLetterLog
from cliffguard.controller.edge_classify import (
    DLQ_KEEP_BYTES,
    ClockWindow,
    DeadLetter,
    EdgeBatch,
    classify_polled,
)
from cliffguard.controller.kafka_net import net_client_kwargs
from cliffguard.controller.poll_watch import PollWatch
from cliffguard.controller.store.fit import INT64
from cliffguard.core.batch_decode import BatchDecoder
from cliffguard.core.kafka_config import KafkaConfig
from cliffguard.core.kafka_producers import RecoveringProducer
from cliffguard.core.keys import EventVerifier
from cliffguard.core.topic_watch import TopicIdWatch, topic_id_of

log = logging.getLogger(__name__)

class _Rebalance:
    """Adapts two plain callables to kafka-python's ConsumerRebalanceListener."""

    def __init__(self, on_assigned: Callable[[list[tuple[str, int]]], None] | None,
                 on_revoked: Callable[[list[tuple[str, int]]], None] | None) -> None:
        self.on_assigned = on_assigned
        self.on_revoked = on_revoked

    def listener(self) -> Any:
        from kafka import ConsumerRebalanceListener

        outer = self

        class _L(ConsumerRebalanceListener):
            def on_partitions_revoked(self, revoked):  # noqa: D401 - kafka-python's API
                if outer.on_revoked is not None:
                    outer.on_revoked(sorted((tp.topic, tp.partition) for tp in revoked))

            def on_partitions_assigned(self, assigned):
                if outer.on_assigned is not None:
                    outer.on_assigned(sorted((tp.topic, tp.partition) for tp in assigned))

        return _L()


class EdgeConsumer:
    """Consumer group on the metrics topic; decodes, dead-letters, hands back typed batches."""

    def __init__(
        self,
        kafka: KafkaConfig,
        group_id: str,
        *,
        max_bytes: int = 1_000_000,
        on_assigned: Callable[[list[tuple[str, int]]], None] | None = None,
        on_revoked: Callable[[list[tuple[str, int]]], None] | None = None,
        consumer_overrides: dict[str, Any] | None = None,
        max_poll_records: int = 2_000,
        on_recreated: Callable[[str, object], None] | None = None,
        clock_window: ClockWindow | None = None,
        clock: Callable[[], float] = time.time,
        event_verifier: EventVerifier | None = None,
        step_bounds: StepBounds | None = None,
        max_fetch_bytes: int = 64 * 1_048_576,
    ) -> None:
        from kafka import KafkaProducer

        self.kafka = kafka
        self.group_id = group_id
        self.max_bytes = max_bytes
        self.clock_window = clock_window or ClockWindow()
        self._clock = clock
        self.event_verifier = event_verifier
        self.step_bounds = step_bounds
        # the store's integer limits (controller/bounds.py) are checked by the decoder itself
        self._decoder = BatchDecoder(int_bounds, INT64)
        self.topic = kafka.metrics_topic
        self.dead_count_by_reason: Counter[str] = Counter()
        self.dlq_send_errors = 0
        self.dlq_truncated = 0
        self.topic_recreations = 0
        self._dead_log = DeadLetterLog()
        self._topic_watch = TopicIdWatch(self.topic)
        self._on_recreated = on_recreated
        self.commit_errors = 0
        kw: dict[str, Any] = {
            **kafka.client_kwargs(),
            "group_id": group_id,
            "client_id": f"cliffguard-edge-{group_id}",
            "enable_auto_commit": False,
            # A broker that forgot the group's offsets (or a first start) reads from the start:
            # losing events is worse than re-reading them (ingest is idempotent by event id).
            "auto_offset_reset": "earliest",
            "max_poll_records": max_poll_records,
            # Let oversized messages through to classify(), which dead-letters them: a message
            # larger than the fetch limit is never returned and stalls its partition.
            "max_partition_fetch_bytes": max(max_fetch_bytes, max_bytes * 2),
            "fetch_max_bytes": max(52_428_800, max_fetch_bytes, max_bytes * 2),
            **net_client_kwargs(),  # a big fetch read under GIL contention is no livelock (controller/kafka_net.py)
            **(consumer_overrides or {}),
        }
        self._consumer_kw = kw
        self._listener = _Rebalance(on_assigned, on_revoked)
        self.rebuilds = 0
        self._consumer = self._new_consumer()
        self.poll_watch = PollWatch(self._wake_network).start()
        dlq_kwargs = {**kafka.client_kwargs(), "client_id": f"cliffguard-dlq-{group_id}", "acks": "all",
                      "max_request_size": max(1_048_576, max_bytes + 65_536, DLQ_KEEP_BYTES * 2),
                      "max_block_ms": 5_000, "bootstrap_timeout_ms": 5_000}
        # rebuilt after a send the broker did not acknowledge (core/kafka_producers.py)
        self._dlq = RecoveringProducer(kafka, lambda: KafkaProducer(**dlq_kwargs), name="dead-letter producer")

    def _new_consumer(self) -> Any:
        from kafka import KafkaConsumer

        consumer = KafkaConsumer(**self._consumer_kw)
        consumer.subscribe([self.topic], listener=self._listener.listener())
        return consumer

    def rebuild(self, why: str) -> list[tuple[str, int]]:
        """Close the consumer and subscribe a fresh one on the same settings: kafka-python's group
        state can wedge after a broker restart met a stopped process (controller/progress.py), and
        a new client is the one state it surely recovers from. The old one leaves without
        committing (the store holds the offsets that count); its partitions are returned, revoked:
        the new consumer's assignment seeks to the store's offsets."""
        old, held = self._consumer, self.assignment()
        log.warning("rebuilding the metrics consumer of group %s: %s", self.group_id, why)
        try:
            old.close(autocommit=False, timeout_ms=2_000)
        except Exception as exc:  # noqa: BLE001 - a wedged client may not close cleanly; the new one matters
            log.warning("the old metrics consumer did not close cleanly: %s: %s", type(exc).__name__, exc)
        self._consumer = self._new_consumer()
        self.rebuilds += 1
        return held

    def group_wedged(self) -> str | None:
        """Why a seek cannot help this consumer, if kafka-python says so: its group coordinator is
        unknown (the seed 2 wedge: marked dead, never looked up again). Read from its coordinator's
        internals; None when they are not there (the stuck watch then seeks first)."""
        coordinator = getattr(self._consumer, "_coordinator", None)
        try:
            if coordinator is not None and coordinator.coordinator() is None:
                return "its group coordinator is unknown"
        except Exception:  # noqa: BLE001 - an internals change: say nothing, the seek goes first
            return None
        return None

    def _wake_network(self) -> bool:
        """Wake kafka-python's network thread (controller/poll_watch.py); False when its internals
        are not there to wake."""
        net = getattr(getattr(self._consumer, "_client", None), "_net", None)
        wakeup = getattr(net, "wakeup", None)
        if wakeup is None:
            return False
        wakeup()
        return True

    def poll(self, timeout_s: float = 1.0) -> EdgeBatch:
        batch = EdgeBatch()
        self.poll_watch.entered(timeout_s)
        try:
            polled = self._consumer.poll(timeout_ms=int(timeout_s * 1000))
        except Exception as exc:  # noqa: BLE001 - broker trouble: report, return empty, try again
            log.warning("edge poll failed: %s: %s", type(exc).__name__, exc)
            return batch
        finally:
            self.poll_watch.left()
        if self._topic_watch.changed(self._consumer):
            # Offsets restart at 0 in a recreated topic (a broker that came back empty): positions
            # from the old one would skip its first messages. The batch read at them is dropped.
            self.topic_recreations += 1
            if self._on_recreated is not None:
                self._on_recreated(self.topic, self._topic_watch.last_seen)
            else:
                log.warning("%s was recreated; reading it from the beginning", self.topic)
                assigned = self._consumer.assignment()
                if assigned:
                    self._consumer.seek_to_beginning(*assigned)
            return batch
        classify_polled(batch, polled, max_bytes=self.max_bytes, decoder=self._decoder,
                        clock=(self.clock_window, self._clock()), verifier=self.event_verifier, steps=self.step_bounds)
        if batch.dead:
            self._send_dead(batch.dead)
        self._dead_log.flush()
        return batch

    def _send_dead(self, dead: list[DeadLetter]) -> None:
        futures = []
        try:
            producer = self._dlq.get()
        except Exception as exc:  # noqa: BLE001 - no broker now: counted, as every unsent dead letter
            producer = None
            log.error("could not send %d dead letters to %s: %s", len(dead), self.kafka.dlq_topic, exc)
            self.dlq_send_errors += len(dead)
        self._dead_log.note(dead)
        for d in dead:
            self.dead_count_by_reason[d.reason] += 1
            if d.truncated:
                self.dlq_truncated += 1
            if producer is None:
                continue
            try:
                futures.append(producer.send(self.kafka.dlq_topic, key=d.key, value=d.dlq_value(),
                                             headers=d.headers()))
            except Exception as exc:  # noqa: BLE001
                self.dlq_send_errors += 1
                log.error("could not send a dead letter to %s: %s", self.kafka.dlq_topic, exc)
        if producer is None:
            return
        try:
            producer.flush(timeout=self.kafka.request_timeout_ms / 1000)
        except Exception as exc:  # noqa: BLE001
            log.error("dead letters not confirmed by %s: %s", self.kafka.dlq_topic, exc)
        failed = [f for f in futures if not (f.is_done and f.succeeded())]
        self.dlq_send_errors += len(failed)  # the sends that raised are counted already
        if failed or len(futures) < len(dead):
            why = next((f.exception for f in failed if f.is_done), None) or "not confirmed"
            self._dlq.failed(producer, why)

    def topic_id(self) -> object:
        """The metrics topic's id in the consumer's metadata (None when unknown)."""
        return topic_id_of(self._consumer, self.topic)

    def seek(self, topic: str, partition: int, offset: int) -> None:
        from kafka import TopicPartition

        self._consumer.seek(TopicPartition(topic, partition), offset)

    def position(self, topic: str, partition: int) -> int | None:
        """The consumer's next offset for the partition (None when it has none yet)."""
        from kafka import TopicPartition

        try:
            return self._consumer.position(TopicPartition(topic, partition), timeout_ms=2000)
        except Exception as exc:  # noqa: BLE001 - unknown: the caller looks again later
            log.warning("could not read the position of %s[%d]: %s", topic, partition, exc)
            return None

    def log_bounds(self, tps: list[tuple[str, int]]) -> dict[tuple[str, int], tuple[int, int]]:
        """(first, end) offset of each partition, from the broker (empty on failure)."""
        from kafka import TopicPartition

        parts = [TopicPartition(t, p) for t, p in tps]
        try:
            first = self._consumer.beginning_offsets(parts)
            end = self._consumer.end_offsets(parts)
        except Exception as exc:  # noqa: BLE001 - a broker hiccup: the caller keeps its offsets
            log.warning("could not read the log bounds of %s: %s", tps, exc)
            return {}
        return {(tp.topic, tp.partition): (first[tp], end[tp]) for tp in parts}

    def broker_forgot_group(self, tps: list[tuple[str, int]]) -> bool | None:
        """Does the broker hold no committed offset for any of these partitions? (None: unknown)

        Offsets are committed to Kafka after every batch (best effort), so a broker that has none
        for partitions this group already read has lost its state: it restarted empty, or the
        topic was deleted and created again."""
        from kafka import TopicPartition

        try:
            return all(self._consumer.committed(TopicPartition(t, p)) is None for t, p in tps)
        except Exception as exc:  # noqa: BLE001 - unknown: the caller keeps its offsets
            log.warning("could not read committed offsets of %s: %s", tps, exc)
            return None

    def seek_to_beginning(self, topic: str, partition: int) -> None:
        from kafka import TopicPartition

        self._consumer.seek_to_beginning(TopicPartition(topic, partition))

    def pause(self, tps: list[tuple[str, int]]) -> None:
        """Stop fetching these partitions (``poll`` returns nothing of them) without leaving the group."""
        from kafka import TopicPartition

        mine = self._consumer.assignment()
        parts = [TopicPartition(t, p) for t, p in tps if TopicPartition(t, p) in mine]
        if parts:
            self._consumer.pause(*parts)

    def resume(self, tps: list[tuple[str, int]]) -> None:
        from kafka import TopicPartition

        mine = self._consumer.assignment()
        parts = [TopicPartition(t, p) for t, p in tps if TopicPartition(t, p) in mine]
        if parts:
            self._consumer.resume(*parts)

    def committed_offsets(self, tps: list[tuple[str, int]]) -> dict[tuple[str, int], int | None]:
        """The group's committed offset of each partition at the broker (empty on failure)."""
        from kafka import TopicPartition

        try:
            return {(t, p): self._consumer.committed(TopicPartition(t, p)) for t, p in tps}
        except Exception as exc:  # noqa: BLE001 - only a warning depends on it
            log.warning("could not read committed offsets of %s: %s", tps, exc)
            return {}

    def connected(self) -> bool:
        """Whether the client holds a connection to a broker (for /readyz). kafka-python has no
        public call for it once the bootstrap connection is closed, so its client is asked."""
        client = getattr(self._consumer, "_client", None)
        try:
            if client is not None:
                nodes = [getattr(b, "node_id", getattr(b, "nodeId", None)) for b in client.cluster.brokers()]
                return any(client.connected(n) for n in nodes if n is not None)
            return bool(self._consumer.bootstrap_connected())
        except Exception:  # noqa: BLE001 - an internals change: report unknown as not connected
            return False

    def assignment(self) -> list[tuple[str, int]]:
        return sorted((tp.topic, tp.partition) for tp in self._consumer.assignment())

    def commit_offsets(self, offsets: dict[tuple[str, int], int]) -> bool:
        """Commit to Kafka too (best effort: the store holds the offsets that count)."""
        from kafka import TopicPartition
        from kafka.structs import OffsetAndMetadata

        if not offsets:
            return True
        try:
            self._consumer.commit({TopicPartition(t, p): OffsetAndMetadata(o, "", -1) for (t, p), o in offsets.items()})
            return True
        except Exception as exc:  # noqa: BLE001
            self.commit_errors += 1
            log.warning("offset commit to Kafka failed (the store has them): %s", exc)
            return False

    def close(self) -> None:
        self.poll_watch.close()
        self._dead_log.flush(final=True)
        for closer in (self._consumer.close, lambda: self._dlq.close(timeout=5)):
            try:
                closer()
            except Exception:  # noqa: BLE001 - close the other one anyway
                log.exception("closing the edge consumer")
