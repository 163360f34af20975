"""``ControllerService``: the consumer loop around the pure parts.

::

    poll (EdgeConsumer: decode, DLQ) ──► one SQL transaction per batch (BatchProcessor)
                                          derived rows · run state · incidents/transitions
                                          command + alert outbox rows · DLQ counts · offsets
                                     └──► after commit: wake the command outbox (and the suspect-node
                                          list's publisher, controller/admission.py, after a record
                                          or clear); commit offsets to Kafka
    every tick_s ──► one transaction: heartbeat-loss verdicts and command timeouts for owned runs
    every request_poll_s ──► one transaction per pending operator request: sign + audit + outbox
                             rows, or a rejection (``controller.operator.decide_request``)

Exactly-once effect: offsets live in the store with the state they produced. On every partition
assignment (start included) the consumer seeks to the stored offsets and the runs of those
partitions are reloaded from the store; on revocation their cached state is dropped. A batch whose
partition another instance already advanced is refused (``StaleBatch``) and re-read from the store's
offset. A batch that fails is rolled back and kept (its partitions paused, so the consumer keeps
its place and its group membership), the run table is reloaded from the store, and the failure is
classified (``controller/store/errors.py``):

- a transient store error (locked, connection lost, serialization failure) is retried with capped
  exponential backoff, forever: it never skips an event nor moves an offset;
- a lost store (read-only, deleted, replaced, tables gone) raises ``StoreLost``: the controller
  stops with the reason and a non-zero exit (``cliffguard controller``), a supervisor restarts it;
- anything else is the batch's own fault: after three failures its events are applied one by one
  and an event that fails alone is counted as a dead letter (``processing_error``) and skipped, so
  one poisonous event cannot stop the service.

``StoreGuard`` (``controller/store/guard.py``) checks at start (a write probe) and after every
commit, before the offsets go to Kafka, that the SQLite file is still the one opened.
A partition the store has no offset for is read from the log start (an empty or new store next to
a consumer group with committed offsets is rebuilt from the log, never resumed from Kafka's offsets).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from sqlalchemy import Engine

from cliffguard.controller.admission import SuspectBoard
from cliffguard.controller.alerts import AlertDeliverer, AlertsConfig
from cliffguard.controller.assignment_watch import UnassignedWatch
from cliffguard.controller.batch import BatchContext, BatchProcessor, BatchResult, StaleBatch
from cliffguard.controller.bounds import StepBounds
from cliffguard.controller.config import ControllerConfig
from cliffguard.controller.edge import EdgeConsumer
from cliffguard.controller.edge_classify import DeadLetter, EdgeBatch, EdgeRecord
from cliffguard.controller.goodput.config import GoodputConfig
from cliffguard.controller.goodput.metrics import MetricsServer
from cliffguard.controller.health import HealthServer, HealthSnapshot
from cliffguard.controller.held import HeldBatch, pause
from cliffguard.controller.operator import RequestPass, decide_pending_requests
from cliffguard.controller.outbox import CommandOutbox
from cliffguard.controller.progress import ProgressWatch
from cliffguard.controller.recovery_types import RecoveryConfig
from cliffguard.controller.runstate import DetectorFactory, RunTable, default_detector_factory
from cliffguard.controller.service_offsets import LogOffsets
from cliffguard.controller.store.db import session_scope
from cliffguard.controller.store.dlq import count_dead_letter, count_run_dead_letter
from cliffguard.controller.store.errors import Backoff, StoreLost, is_store_lost, is_transient
from cliffguard.controller.store.guard import StoreGuard
from cliffguard.controller.store.offsets import load_offsets, save_offsets
from cliffguard.controller.store.rank_nodes import load_rank_nodes
from cliffguard.controller.store.retention import RetentionConfig
from cliffguard.core import kafka_log
from cliffguard.core.kafka_config import KafkaConfig
from cliffguard.core.keys import EventVerifier
from cliffguard.core.signing import SigningKey

log = logging.getLogger(__name__)

MAX_BATCH_FAILURES = 3


class ControllerService(LogOffsets):
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
        goodput: GoodputConfig | None = None,
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
                           retention=retention or RetentionConfig(), goodput=goodput or GoodputConfig())
        self.processor = BatchProcessor(ctx, self.runs)
        self.outbox = CommandOutbox(store_engine, kafka, batch=config.outbox_batch,
                                    interval_s=config.outbox_interval_s, retry_s=config.outbox_retry_s)
        self.processor.on_command = self.outbox.send_early  # the verdict leaves before the batch commits
        self.suspect_board = SuspectBoard(store_engine, kafka, secret)
        """The suspect-node list launchers read before their node joins (controller/admission.py)."""
        self._suspect_writes = 0
        self.deliverer: AlertDeliverer | None = None
        self.edge: EdgeConsumer | None = None
        self._last_tick = 0.0
        self._last_requests = 0.0
        self._check_bounds: set[tuple[str, int]] = set()
        self.progress = ProgressWatch(self.config.stuck_after_s)
        """Partitions that read nothing while their log grows (controller/progress.py)."""
        self.unassigned = UnassignedWatch(self.config.unassigned_after_s)
        """No partition held at all: a standby, or a group that does not assign (controller/assignment_watch.py)."""
        self._recreated: object = None
        """The new id of a re-created metrics topic the edge noticed, until it is settled."""
        self._topic_id: object = None
        """The id of the metrics topic the stored offsets belong to, as far as this instance knows:
        every reset to a topic's start adopts it, so one re-creation is acted on once however
        many signs of it arrive (the assignment's bounds check and the topic-id watch both see
        a broker that restarted empty)."""
        self._failures = 0
        self.guard = StoreGuard(store_engine)
        self.held = HeldBatch(Backoff(config.store_retry_initial_s, config.store_retry_max_s))
        self._runs_stale = False  # the run table must be reloaded before the next tick
        self._reseek_pending: set[tuple[str, int]] = set()
        self._unstored: set[tuple[str, int]] = set()  # assigned with no stored offset: log start
        self.last_store_error = ""
        self.health = HealthSnapshot()
        self.health_server: HealthServer | None = None
        self.metrics_server: MetricsServer | None = None
        """``/metrics`` (``[goodput] metrics_port``): the owned runs' goodput, as of the last commit."""
        self.stats = {"batches": 0, "events": 0, "dead": 0, "commands": 0, "alerts": 0, "stale": 0, "errors": 0,
                      "requests_accepted": 0, "requests_rejected": 0, "store_retries": 0, "store_rebuilds": 0, "replays": 0}

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> ControllerService:
        kafka_log.install()  # kafka-python's closed-socket race: one line, not a traceback
        try:
            self.guard.probe_write()
        except StoreLost:
            raise
        except Exception as exc:  # noqa: BLE001 - busy now: the loop retries every write anyway
            if not is_transient(exc):
                raise
            log.warning("store busy at start (%s); the loop retries", exc)
        self.edge = EdgeConsumer(self.kafka, self.config.group_id, max_bytes=self.config.max_event_bytes,
                                 on_assigned=self._on_assigned, on_revoked=self._on_revoked,
                                 on_recreated=self._on_recreated,
                                 consumer_overrides=self.config.consumer_overrides(),
                                 max_poll_records=self.config.max_poll_records,
                                 clock_window=self.config.clock_window(),
                                 event_verifier=self.event_verifier,
                                 step_bounds=self.step_bounds,
                                 max_fetch_bytes=self.config.max_fetch_bytes)
        self._load_rank_nodes()
        self.outbox.start()
        self.suspect_board.start()  # its first pass publishes every node with a record
        if self.config.health_port and self.health_server is None:
            self.health_server = HealthServer(self.config.health_host, self.config.health_port,
                                              lambda: self.health, self.config.health_max_loop_age_s)
        gp = self.processor.ctx.goodput
        if gp.metrics_port and self.metrics_server is None:
            self.metrics_server = MetricsServer(gp.metrics_host, gp.metrics_port)
        if self.alerts.endpoints:
            self.deliverer = AlertDeliverer(self.engine, self.alerts)
            self.deliverer.start()
        log.info("controller %s consuming %s", self.config.group_id, self.kafka.metrics_topic)
        return self

    def _load_rank_nodes(self) -> None:
        """The ranks' nodes the store kept (controller/rank_nodes.py): an SDC verdict right after a
        restart can still name its rank's node. A busy store leaves them to the next beats."""
        try:
            with session_scope(self.engine) as s:
                self.processor.rank_nodes.load(load_rank_nodes(s, self.processor.rank_nodes.runs_kept))
        except Exception as exc:  # noqa: BLE001 - the beats fill the map again within heartbeat_s
            if not is_transient(exc):
                raise
            log.warning("ranks' nodes not loaded (store busy: %s); the next heartbeats fill them", exc)

    def run_forever(self, stop_event: threading.Event, on_iteration: Callable[[], None] | None = None) -> None:
        """Step until ``stop_event``; ``on_iteration`` runs before each step (the command's stall
        watchdog re-arms there)."""
        if self.edge is None:
            self.start()
        try:
            while not stop_event.is_set():
                if on_iteration is not None:
                    on_iteration()
                self.step_once()
        finally:
            self.close()

    def close(self) -> None:
        for name, closer in (("edge", self.edge and self.edge.close), ("outbox", self.outbox.close),
                             ("suspect-node list", self.suspect_board.close),
                             ("alerts", self.deliverer and self.deliverer.close),
                             ("health endpoint", self.health_server and self.health_server.close),
                             ("metrics endpoint", self.metrics_server and self.metrics_server.close)):
            if not closer:
                continue
            try:
                closer()
            except Exception:  # noqa: BLE001 - close the others anyway
                log.exception("closing the controller's %s", name)
        self.edge = None
        self.health_server = None
        self.metrics_server = None

    def _take_health(self) -> None:
        """What /healthz and /readyz report, taken on the loop thread (``controller/health.py``)."""
        edge = self.edge
        connected = getattr(edge, "connected", None)
        self.health = HealthSnapshot(
            loop_at=time.monotonic(), store_error=self.last_store_error,
            broker_connected=bool(connected()) if connected is not None else edge is not None,
            assigned=sum(1 for t, _ in edge.assignment() if t == self.kafka.metrics_topic) if edge else 0)

    # -- rebalance ----------------------------------------------------------------------------

    def _on_assigned(self, tps: list[tuple[str, int]]) -> None:
        assert self.edge is not None
        self.progress.forget(tps)  # a fresh assignment: each partition's clock starts at its first look
        self._drop_hold()  # a rebalance: the store's offsets say where each partition resumes
        try:
            with session_scope(self.engine) as s:
                stored = load_offsets(s, self.config.group_id, self.kafka.metrics_topic)
                parts = {p for _, p in tps}
                self.runs.drop_partitions(parts)
                n = self.runs.load_partitions(s, parts)
        except Exception as exc:  # noqa: BLE001 - kafka-python would swallow it and read on unseeked
            log.warning("store unreadable at assignment of %s (%s); paused until it is", tps, exc)
            self._reseek_pending.update(tps)
            self._runs_stale = True
            pause(self.edge, tps)
            return
        for topic, part in tps:
            if part in stored:
                self.edge.seek(topic, part, stored[part])
            elif topic == self.kafka.metrics_topic:
                # No stored offset: a new partition, or an empty store next to a group that has
                # committed offsets at the broker. Resuming from those would lose every event
                # before them; the log start rebuilds the store (ingest is idempotent).
                self.edge.seek_to_beginning(topic, part)
                self._unstored.add((topic, part))
        # Checked on the consumer thread at the next step: this callback runs on kafka-python's
        # IO thread, where the blocking offset queries of that check are not allowed.
        self._check_bounds.update(tps)
        log.info("assigned %s: seek to stored offsets %s, %d runs reloaded", tps,
                 {p: stored[p] for p in parts if p in stored}, n)

    def _on_revoked(self, tps: list[tuple[str, int]]) -> None:
        self.progress.forget(tps)
        self._drop_hold()
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
        """One poll (or a retry of the batch kept through a store failure), its transaction, and
        a tick when due. Never raises for bad input; raises ``StoreLost`` when the store is lost."""
        assert self.edge is not None, "start() first"
        self._take_health()
        try:
            self.guard.check()
        except StoreLost as exc:
            self.last_store_error = str(exc)
            self._take_health()
            raise
        res = None
        if self._runs_stale:
            self._try_store(self._reload_runs)
        if self.held.batch is not None:
            res = self._retry_held()
            self.progress.wait(self.edge.assignment(), time.monotonic())
        elif self._try_store(self._settle_offsets):
            batch = self.edge.poll(self.config.poll_timeout_s)
            if batch.next_offsets:
                res = self._process(batch)
            elif self.held.batch is None:
                self._unstick()
                self._watch_assignment()
        now = self.clock()
        if now - self._last_tick >= self.config.tick_s and not self._runs_stale:
            self._last_tick = now
            try:
                with session_scope(self.engine) as s:
                    tick = self.processor.tick(s, now)
                self._after_commit(tick)
            except Exception as exc:  # noqa: BLE001
                self.stats["errors"] += 1
                if is_transient(exc):  # a busy store: expected, one line; the next tick tries again
                    log.warning("tick failed, the store is busy (%s); run state reloaded from the store",
                                str(getattr(exc, "orig", None) or exc).splitlines()[0])
                else:
                    log.exception("tick failed; run state reloaded from the store")
                self._lost_or_stale(exc)
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
        self._report_rebuilds()
        try:
            with session_scope(self.engine) as s:
                res = self.processor.process(s, batch, self.clock())
            self.processor.rank_nodes.saved()  # the ranks' nodes it wrote are stored now
        except StaleBatch as exc:
            self._drop_hold()
            self.stats["stale"] += 1
            log.warning("stale batch, re-reading from the store's offset: %s", exc)
            stale = [(exc.topic, exc.partition)]
            self._try_store(lambda: self._reseek(stale))
            return None
        except Exception as exc:  # noqa: BLE001 - keep the batch; retry, or isolate a poisonous event
            self.stats["errors"] += 1
            self._lost_or_stale(exc)
            self._hold(batch)
            if is_transient(exc):
                self._retry_later(exc)
                return None
            self._failures += 1
            log.exception("batch failed (%d in a row); rolled back, kept for a retry", self._failures)
            if self._failures >= MAX_BATCH_FAILURES:
                self._failures = 0
                return self._process_one_by_one(batch)
            return None
        self._failures = 0
        self.guard.check()  # before Kafka hears of it: a commit into a deleted file is no commit
        self._drop_hold()
        self.last_store_error = ""
        self.stats["batches"] += 1
        self.stats["events"] += res.events
        self.stats["dead"] += res.dead
        self._after_commit(res)
        self.edge.commit_offsets(batch.next_offsets)
        now = time.monotonic()
        for tp, offset in batch.next_offsets.items():
            self.progress.moved(tp, offset, now)
        self.unassigned.stored(self.clock())
        return res

    def _process_one_by_one(self, batch: EdgeBatch) -> BatchResult | None:
        """Apply a failing batch message by message, in offset order; skip what fails alone.
        A store failure on the way keeps the rest of the batch for a retry (never a dead letter)."""
        total = BatchResult()
        items = sorted([*batch.records, *batch.dead], key=lambda x: (x.topic, x.partition, x.offset))
        for i, item in enumerate(items):
            nxt = {(item.topic, item.partition): item.offset + 1}
            one = (EdgeBatch(dead=[item], next_offsets=nxt) if isinstance(item, DeadLetter)
                   else EdgeBatch(records=[item], next_offsets=nxt))
            try:
                try:
                    with session_scope(self.engine) as s:
                        res = self.processor.process(s, one, self.clock())
                    self.processor.rank_nodes.saved()
                    self._after_commit(res)
                    total.events += res.events
                    total.dead += res.dead
                    continue
                except Exception as exc:  # noqa: BLE001
                    self._lost_or_stale(exc)
                    if is_transient(exc):
                        raise
                    assert isinstance(item, EdgeRecord)
                    log.exception("event %s of run %s fails on its own: skipped (dead letter)",
                                  item.event.id, item.event.run)
                    with session_scope(self.engine) as s:
                        why = f"{item.event.id}: {type(exc).__name__}: {exc}"
                        count_dead_letter(s, item.topic, "processing_error", why)
                        count_run_dead_letter(s, item.event.run, "processing_error", why)
                        save_offsets(s, self.config.group_id, nxt)
            except Exception as exc:  # noqa: BLE001 - the store, not the event: keep the rest
                self._lost_or_stale(exc)
                if not is_transient(exc):
                    raise
                self._hold(_batch_of(items[i:], batch.next_offsets))
                self._retry_later(exc)
                return None
        self._drop_hold()
        self.guard.check()
        if self.edge is not None:
            self.edge.commit_offsets(batch.next_offsets)
        return total

    # -- store failures -----------------------------------------------------------------------

    def _lost_or_stale(self, exc: BaseException) -> None:
        """After a failed transaction: stop on a lost store, else reload the runs before going on."""
        self.runs.clear()
        self._runs_stale = True
        self.guard.check()
        if is_store_lost(exc):
            orig = getattr(exc, "orig", None) or exc
            self.last_store_error = (f"store {self.guard.describe()} lost: {type(orig).__name__}: "
                                     f"{str(orig).splitlines()[0] if str(orig) else ''}")
            raise StoreLost(self.last_store_error) from exc

    def _try_store(self, fn: Callable[[], object]) -> bool:
        """Run a store read outside a batch; False (logged, retried later) on a transient error."""
        try:
            fn()
            if self.held.batch is None:
                self.last_store_error = ""
            return True
        except StoreLost:
            raise
        except Exception as exc:  # noqa: BLE001
            if is_store_lost(exc) or not is_transient(exc):
                self._lost_or_stale(exc)
                raise
            self.last_store_error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            log.warning("store unavailable (%s); trying again", self.last_store_error)
            time.sleep(self.config.poll_timeout_s)
            return False

    def _retry_later(self, exc: BaseException) -> None:
        """The held batch waits out a transient store error (capped exponential backoff)."""
        self.stats["store_retries"] += 1
        delay = self.held.wait_transient()
        self.last_store_error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        log.warning("store busy (%s); batch kept, retry %d in %.1f s", self.last_store_error,
                    self.held.transient_failures, delay)

    def _reload_runs(self) -> None:
        assert self.edge is not None
        parts = {p for t, p in self.edge.assignment() if t == self.kafka.metrics_topic}
        with session_scope(self.engine) as s:
            self.runs.clear()
            self.runs.load_partitions(s, parts)
        self._runs_stale = False

    def _hold(self, batch: EdgeBatch) -> None:
        self.held.hold(batch, self.edge)

    def _drop_hold(self) -> None:
        self.held.release(self.edge)

    def _retry_held(self) -> BatchResult | None:
        assert self.edge is not None and self.held.batch is not None
        wait = self.held.wait_left_s()
        if wait > 0:
            # Polling the paused partitions keeps the group membership (max_poll_interval_ms).
            polled = self.edge.poll(min(wait, self.config.poll_timeout_s))
            if self.held.batch is None:  # a rebalance dropped it: what came is from the stored offsets
                return self._process(polled) if polled.next_offsets else None
            if polled.next_offsets:  # a partition not paused: the store's offsets say where to go
                log.warning("records polled while a batch is held; re-reading from the store's offsets")
                self._drop_hold()
                self._reseek_pending.update(self.edge.assignment())
            return None
        return self._process(self.held.batch)

    def _after_commit(self, res: BatchResult) -> None:
        if self.metrics_server is not None:
            self.metrics_server.publish(self.runs.slots.values())
        self.stats["commands"] += res.commands
        self.stats["replays"] += res.replays
        self.stats["alerts"] += res.alerts
        if res.commands:
            try:
                self.outbox.publish_due()  # now, on this thread: the verdict's latency path
            except Exception as exc:  # noqa: BLE001 - the outbox thread retries what is still pending
                if is_transient(exc) or _broker_trouble(exc):  # expected under faults: one line
                    log.warning("immediate command publish failed (the outbox retries): %s: %s",
                                type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
                else:
                    log.exception("immediate command publish failed")
                self.outbox.wake()
        if self.processor.suspects.writes != self._suspect_writes:  # a suspect recorded or cleared: publish it now
            self._suspect_writes = self.processor.suspects.writes
            self.suspect_board.wake()
        if res.alerts and self.deliverer is not None:
            wake = getattr(self.deliverer, "wake", None)
            if wake is not None:
                wake()


def _batch_of(items: list, next_offsets: dict[tuple[str, int], int]) -> EdgeBatch:
    """The rest of a batch (records and dead letters, in offset order) as a batch of its own."""
    out = EdgeBatch(next_offsets={tp: o for tp, o in next_offsets.items()
                                  if any((x.topic, x.partition) == tp for x in items)})
    for x in items:
        (out.dead if isinstance(x, DeadLetter) else out.records).append(x)
    return out


def _broker_trouble(exc: BaseException) -> bool:
    """A broker that is down or refuses: the outbox keeps the row and tries again."""
    from kafka.errors import KafkaError

    return isinstance(exc, (KafkaError, ConnectionError, TimeoutError))
