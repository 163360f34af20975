"""``ControllerService``: the consumer loop around the pure parts.

::

    poll (EdgeConsumer: decode, DLQ) ──► one SQL transaction per batch (BatchProcessor)
                                          derived rows · run state · incidents/transitions
                                          command + alert outbox rows · DLQ counts · offsets
                                     └──► after commit: wake the command outbox; commit offsets to Kafka
    every tick_s ──► one transaction: heartbeat-loss verdicts and command timeouts for owned runs
    every request_poll_s ──► one transaction per pending operator request: sign + audit + outbox
                             rows, or a rejection (``controller.operator.decide_request``)

Exactly-once effect: offsets live in the store with the state they produced. On every partition
assignment (start included) the consumer seeks to the stored offsets and the runs of those
partitions are reloaded from the store; on revocation their cached state is dropped. A batch whose
partition another instance already advanced is refused (``StaleBatch``) and re-read from the store's
offset. A batch that fails is rolled back and re-read; if the same batch fails three times, its
events are applied one by one and an event that fails alone is counted as a dead letter
(``processing_error``) and skipped, so one poisonous event cannot stop the service.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from sqlalchemy import Engine

from controller.alerts import AlertDeliverer, AlertsConfig
from controller.batch import BatchContext, BatchProcessor, BatchResult, StaleBatch
from controller.bounds import StepBounds
from controller.config import ControllerConfig
from controller.edge import DeadLetter, EdgeBatch, EdgeConsumer
from controller.operator import RequestPass, decide_pending_requests
from controller.outbox import CommandOutbox
from controller.recovery_types import RecoveryConfig
from controller.runstate import DetectorFactory, RunTable, default_detector_factory
from controller.store.db import session_scope
from controller.store.dlq import count_dead_letter
from controller.store.offsets import load_offsets, save_offsets
from controller.store.retention import RetentionConfig
from core.kafka_config import KafkaConfig
from core.keys import EventVerifier
from core.signing import SigningKey

log = logging.getLogger(__name__)

MAX_BATCH_FAILURES = 3


class ControllerService:
    def __init__(
        self,
        config: ControllerConfig,
        kafka: KafkaConfig,
        store_engine: Engine,
        secret: SigningKey,
        alerts: AlertsConfig | None = None,
        *,
        event_verifier: EventVerifier | None = None,
        recovery: RecoveryConfig | None = None,
        retention: RetentionConfig | None = None,
        detector_factory: DetectorFactory | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.kafka = kafka
        self.engine = store_engine
        self.alerts = alerts or AlertsConfig()
        self.clock = clock
        self.event_verifier = event_verifier
        """Checks each event's signature (``core/keys.py``); None: events are not checked."""
        self.step_bounds = StepBounds(config.max_step_jump)
        """Each run's step bounds (``controller/bounds.py``); ``rewound(run)`` after a reload."""
        self.runs = RunTable(detector_factory or default_detector_factory())
        ctx = BatchContext(group_id=config.group_id, commands_topic=kafka.commands_topic, secret=secret,
                           recovery=recovery or RecoveryConfig(), alerts=self.alerts,
                           retention=retention or RetentionConfig())
        self.processor = BatchProcessor(ctx, self.runs)
        self.outbox = CommandOutbox(store_engine, kafka, batch=config.outbox_batch,
                                    interval_s=config.outbox_interval_s, retry_s=config.outbox_retry_s)
        self.deliverer: AlertDeliverer | None = None
        self.edge: EdgeConsumer | None = None
        self._last_tick = 0.0
        self._last_requests = 0.0
        self._check_bounds: set[tuple[str, int]] = set()
        self._recreated = False
        self._failures = 0
        self.stats = {"batches": 0, "events": 0, "dead": 0, "commands": 0, "alerts": 0, "stale": 0, "errors": 0,
                      "requests_accepted": 0, "requests_rejected": 0}

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> ControllerService:
        self.edge = EdgeConsumer(self.kafka, self.config.group_id, max_bytes=self.config.max_event_bytes,
                                 on_assigned=self._on_assigned, on_revoked=self._on_revoked,
                                 on_recreated=self._on_recreated,
                                 consumer_overrides=self.config.consumer_overrides(),
                                 max_poll_records=self.config.max_poll_records,
                                 clock_window=self.config.clock_window(),
                                 event_verifier=self.event_verifier,
                                 step_bounds=self.step_bounds)
        self.outbox.start()
        if self.alerts.endpoints:
            self.deliverer = AlertDeliverer(self.engine, self.alerts)
            self.deliverer.start()
        log.info("controller %s consuming %s", self.config.group_id, self.kafka.metrics_topic)
        return self

    def run_forever(self, stop_event: threading.Event) -> None:
        if self.edge is None:
            self.start()
        try:
            while not stop_event.is_set():
                self.step_once()
        finally:
            self.close()

    def close(self) -> None:
        for name, closer in (("edge", self.edge and self.edge.close), ("outbox", self.outbox.close),
                             ("alerts", self.deliverer and self.deliverer.close)):
            if not closer:
                continue
            try:
                closer()
            except Exception:  # noqa: BLE001 - close the others anyway
                log.exception("closing the controller's %s", name)
        self.edge = None

    # -- rebalance ----------------------------------------------------------------------------

    def _on_assigned(self, tps: list[tuple[str, int]]) -> None:
        assert self.edge is not None
        with session_scope(self.engine) as s:
            stored = load_offsets(s, self.config.group_id, self.kafka.metrics_topic)
            parts = {p for _, p in tps}
            self.runs.drop_partitions(parts)
            n = self.runs.load_partitions(s, parts)
        for topic, part in tps:
            if part in stored:
                self.edge.seek(topic, part, stored[part])
        # Checked on the consumer thread at the next step: this callback runs on kafka-python's
        # IO thread, where the blocking offset queries of that check are not allowed.
        self._check_bounds.update(tps)
        log.info("assigned %s: seek to stored offsets %s, %d runs reloaded", tps,
                 {p: stored[p] for p in parts if p in stored}, n)

    def _drop_offsets_beyond_the_log(self, tps: list[tuple[str, int]], stored: dict[int, int]) -> dict[int, int]:
        """Stored offsets past a partition's end, on a broker that no longer has this group's
        committed offsets, belong to a topic that no longer exists (deleted and created again, or
        a broker that restarted empty). Seeking there would skip the new topic's messages and the
        batch fence would refuse every batch from offset 0 on, so such a partition restarts at
        its first offset, in the store too."""
        bounds_of = getattr(self.edge, "log_bounds", None)
        forgot = getattr(self.edge, "broker_forgot_group", None)
        mine = [(t, p) for t, p in tps if p in stored]
        # Some brokers (Tansu) report a low end offset for a log written in batches, so "past the
        # end" alone is not proof; a broker that also lost this group's committed offsets is.
        if not mine or bounds_of is None or forgot is None or forgot(mine) is not True:
            return stored
        bounds = bounds_of(mine)
        reset = {(t, p): first for (t, p), (first, end) in bounds.items() if stored[p] > end}
        if reset:
            self._reset_stored_offsets(reset)
            stored = {**stored, **{p: o for (_, p), o in reset.items()}}
        return stored

    def _on_recreated(self, topic: str) -> None:
        """The edge saw the topic's id change and reads it from the start: so must the store."""
        self._recreated = True

    def _settle_offsets(self) -> None:
        """Offset checks that need blocking broker queries, done on the consumer thread."""
        assert self.edge is not None
        if self._recreated:
            tps = [(t, p) for t, p in self.edge.assignment() if t == self.kafka.metrics_topic]
            bounds = getattr(self.edge, "log_bounds", lambda _tps: {})(tps)
            if bounds:  # no assignment yet: the check after the next assignment covers it
                self._recreated = False
                self._reset_stored_offsets({tp: first for tp, (first, _end) in bounds.items()})
                for (topic, part), (first, _end) in bounds.items():
                    self.edge.seek(topic, part, first)
        if self._check_bounds:
            tps = sorted(self._check_bounds & set(self.edge.assignment()))
            self._check_bounds.clear()
            with session_scope(self.engine) as s:
                stored = load_offsets(s, self.config.group_id, self.kafka.metrics_topic)
            settled = self._drop_offsets_beyond_the_log(tps, stored)
            for topic, part in tps:
                if part in settled and settled[part] != stored.get(part):
                    self.edge.seek(topic, part, settled[part])

    def _reset_stored_offsets(self, offsets: dict[tuple[str, int], int]) -> None:
        log.warning("offsets stored for %s lie beyond the log (topic re-created?); restarting at %s",
                    sorted(offsets), offsets)
        self.stats["offset_resets"] = self.stats.get("offset_resets", 0) + len(offsets)
        with session_scope(self.engine) as s:
            save_offsets(s, self.config.group_id, offsets, now=self.clock())

    def _on_revoked(self, tps: list[tuple[str, int]]) -> None:
        self.runs.drop_partitions({p for _, p in tps})

    def _reseek(self, partitions: list[tuple[str, int]] | None = None) -> None:
        """Go back to the store's offsets (after a rollback) and reload those runs' state."""
        assert self.edge is not None
        tps = partitions if partitions is not None else self.edge.assignment()
        parts = {p for _, p in tps}
        if partitions is None:
            self.runs.clear()
        self.runs.drop_partitions(parts)
        with session_scope(self.engine) as s:
            stored = load_offsets(s, self.config.group_id, self.kafka.metrics_topic)
            self.runs.load_partitions(s, parts)
        stored = self._drop_offsets_beyond_the_log(tps, stored)
        for topic, part in tps:
            if part in stored:
                self.edge.seek(topic, part, stored[part])

    # -- the loop -----------------------------------------------------------------------------

    def step_once(self) -> BatchResult | None:
        """One poll, its transaction, and a tick when due. Never raises for bad input."""
        assert self.edge is not None, "start() first"
        self._settle_offsets()
        batch = self.edge.poll(self.config.poll_timeout_s)
        res = None
        if batch.next_offsets:
            res = self._process(batch)
        now = self.clock()
        if now - self._last_tick >= self.config.tick_s:
            self._last_tick = now
            try:
                with session_scope(self.engine) as s:
                    tick = self.processor.tick(s, now)
                self._after_commit(tick)
            except Exception:  # noqa: BLE001
                self.stats["errors"] += 1
                log.exception("tick failed; run state reloaded from the store")
                self.runs.clear()
        if now - self._last_requests >= self.config.request_poll_s:
            self._last_requests = now
            self.decide_requests()
        return res

    def decide_requests(self) -> RequestPass:
        """Decide the pending operator requests; the commands accepted are sent at once."""
        ctx = self.processor.ctx
        done = decide_pending_requests(self.engine, secret=ctx.secret, commands_topic=ctx.commands_topic,
                                       ttl_s=ctx.recovery.policy.command_ttl_s, clock=self.clock)
        self.stats["requests_accepted"] += done.accepted
        self.stats["requests_rejected"] += done.rejected
        self.stats["errors"] += done.errors
        if done.accepted:
            self._after_commit(BatchResult(commands=done.accepted))
        return done

    def _process(self, batch: EdgeBatch) -> BatchResult | None:
        assert self.edge is not None
        try:
            with session_scope(self.engine) as s:
                res = self.processor.process(s, batch, self.clock())
        except StaleBatch as exc:
            self.stats["stale"] += 1
            log.warning("stale batch, re-reading from the store's offset: %s", exc)
            self._reseek([(exc.topic, exc.partition)])
            return None
        except Exception:  # noqa: BLE001 - roll back, re-read, and isolate a poisonous event
            self.stats["errors"] += 1
            self._failures += 1
            log.exception("batch failed (%d in a row); rolled back, re-reading", self._failures)
            self.runs.clear()
            if self._failures >= MAX_BATCH_FAILURES:
                self._failures = 0
                return self._process_one_by_one(batch)
            self._reseek()
            return None
        self._failures = 0
        self.stats["batches"] += 1
        self.stats["events"] += res.events
        self.stats["dead"] += res.dead
        self._after_commit(res)
        self.edge.commit_offsets(batch.next_offsets)
        return res

    def _process_one_by_one(self, batch: EdgeBatch) -> BatchResult:
        """Apply a failing batch message by message, in offset order; skip what fails alone."""
        total = BatchResult()
        items = sorted([*batch.records, *batch.dead], key=lambda x: (x.topic, x.partition, x.offset))
        for item in items:
            nxt = {(item.topic, item.partition): item.offset + 1}
            if isinstance(item, DeadLetter):
                with session_scope(self.engine) as s:
                    count_dead_letter(s, item.topic, item.reason, item.detail)
                    save_offsets(s, self.config.group_id, nxt)
                total.dead += 1
                continue
            try:
                with session_scope(self.engine) as s:
                    res = self.processor.process(s, EdgeBatch(records=[item], next_offsets=nxt), self.clock())
                self._after_commit(res)
                total.events += 1
            except Exception as exc:  # noqa: BLE001
                self.runs.clear()
                log.exception("event %s of run %s fails on its own: skipped (dead letter)",
                              item.event.id, item.event.run)
                with session_scope(self.engine) as s:
                    count_dead_letter(s, item.topic, "processing_error",
                                      f"{item.event.id}: {type(exc).__name__}: {exc}")
                    save_offsets(s, self.config.group_id, nxt)
        return total

    def _after_commit(self, res: BatchResult) -> None:
        self.stats["commands"] += res.commands
        self.stats["alerts"] += res.alerts
        if res.commands:
            try:
                self.outbox.publish_due()  # now, on this thread: the verdict's latency path
            except Exception:  # noqa: BLE001 - the outbox thread retries what is still pending
                log.exception("immediate command publish failed")
                self.outbox.wake()
        if res.alerts and self.deliverer is not None:
            wake = getattr(self.deliverer, "wake", None)
            if wake is not None:
                wake()
