"""The service loop's failure handling, with a stub consumer edge and a real SQLite store."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from cliffguard.controller import batch as batch_mod
from cliffguard.controller.config import ControllerConfig
from cliffguard.controller.edge_classify import DeadLetter, EdgeBatch, EdgeRecord
from cliffguard.controller.outbox import CommandOutbox
from cliffguard.controller.recovery_types import Phase, RecoveryConfig
from cliffguard.controller.service import MAX_BATCH_FAILURES, ControllerService
from cliffguard.controller.store.db import session_scope
from cliffguard.controller.store.models import (
    CommandRow,
    ConsumerOffsetRow,
    DlqCountRow,
    RunRow,
    StepMetricRow,
)
from cliffguard.controller.store.offsets import save_offsets
from cliffguard.core.events import make_event
from cliffguard.core.kafka_config import KafkaConfig
from testing.controller_service import SECRET, healthy_loss, step_data, store_engine
from tests.controller.test_service_outbox import FakeProducer

TOPIC = "p.metrics"


class StubEdge:
    def __init__(self, batches: list[EdgeBatch]) -> None:
        self.batches = batches
        self.seeks: list[tuple[str, int, int]] = []
        self.committed: list[dict] = []

    def poll(self, timeout_s: float) -> EdgeBatch:
        return self.batches.pop(0) if self.batches else EdgeBatch()

    def seek(self, topic: str, partition: int, offset: int) -> None:
        self.seeks.append((topic, partition, offset))

    def assignment(self) -> list[tuple[str, int]]:
        return [(TOPIC, 0)]

    def commit_offsets(self, offsets) -> bool:
        self.committed.append(dict(offsets))
        return True

    def close(self) -> None:
        pass


def records(run: str, first: int, last: int, offset: int, loss=healthy_loss) -> list[EdgeRecord]:
    return [EdgeRecord(TOPIC, 0, offset + i, make_event("step", run, s, step_data(loss(s), s)))
            for i, s in enumerate(range(first, last + 1))]


def as_batch(recs: list[EdgeRecord], dead: list[DeadLetter] = ()) -> EdgeBatch:
    last = max([r.offset for r in recs] + [d.offset for d in dead])
    return EdgeBatch(records=recs, dead=list(dead), next_offsets={(TOPIC, 0): last + 1})


@pytest.fixture
def engine(tmp_path):
    with store_engine("sqlite", tmp_path) as (eng, _):
        yield eng


def service(engine, clock=None, **recovery) -> ControllerService:
    cfg = ControllerConfig(group_id="g", tick_s=0.001)
    kafka = KafkaConfig(topic_prefix="p")
    svc = ControllerService(cfg, kafka, engine, SECRET, recovery=RecoveryConfig(**recovery),
                            **({"clock": clock} if clock else {}))
    svc.outbox = CommandOutbox(engine, kafka, producer=FakeProducer())  # no Kafka in these tests
    # the processor sends a verdict's command early through the outbox it was built with: the fake
    # one too (else a real producer waits a minute for a broker that is not there)
    svc.processor.on_command = svc.outbox.send_early
    return svc


def stored_offset(engine) -> int | None:
    with session_scope(engine) as s:
        row = s.scalar(select(ConsumerOffsetRow.offset).where(ConsumerOffsetRow.group_id == "g"))
    return row


def test_a_batch_another_instance_already_processed_is_refused_and_reread(engine):
    svc = service(engine)
    with session_scope(engine) as s:
        save_offsets(s, "g", {(TOPIC, 0): 10})  # another instance got this far
    svc.edge = StubEdge([as_batch(records("r", 0, 4, offset=5))])
    assert svc.step_once() is None
    assert svc.stats["stale"] == 1 and (TOPIC, 0, 10) in svc.edge.seeks
    with session_scope(engine) as s:
        assert s.scalar(select(StepMetricRow.id).limit(1)) is None  # nothing of the stale batch stayed
    assert stored_offset(engine) == 10


def test_a_poisonous_event_is_isolated_and_counted_after_repeated_failures(engine, monkeypatch):
    recs = records("r", 0, 4, offset=0)
    poison = recs[2].event.id
    real = batch_mod.ingest_events

    def ingest(session, events, **kw):
        if any(e.id == poison for e in events):
            raise RuntimeError("boom")
        return real(session, events, **kw)

    monkeypatch.setattr(batch_mod, "ingest_events", ingest)
    svc = service(engine)
    dead = DeadLetter("undecodable", "$: junk", TOPIC, 0, 5, b"junk")
    svc.edge = StubEdge([as_batch(recs, [dead]) for _ in range(MAX_BATCH_FAILURES)])
    for _ in range(MAX_BATCH_FAILURES - 1):
        assert svc.step_once() is None
        assert (TOPIC, 0, 0) not in svc.edge.seeks  # nothing stored yet: nothing to seek to
    res = svc.step_once()
    assert res is not None and res.events == 4
    with session_scope(engine) as s:
        steps = sorted(s.scalars(select(StepMetricRow.step)))
        counts = {r.reason: r.count for r in s.scalars(select(DlqCountRow))}
    assert steps == [0, 1, 3, 4]
    assert counts == {"processing_error": 1, "undecodable": 1}
    assert stored_offset(engine) == 6
    assert svc.stats["errors"] == MAX_BATCH_FAILURES


def test_ticks_resend_an_unanswered_pause_and_the_state_survives_a_reload(engine):
    now = [1000.0]
    svc = service(engine, clock=lambda: now[0], stable_window=5, command_timeout_s=10, max_attempts=2)
    healthy = records("r", 0, 40, offset=0)
    spike = records("r", 41, 43, offset=41, loss=lambda s: 50.0)
    svc.edge = StubEdge([as_batch(healthy), as_batch(spike)])
    svc.step_once()
    svc.step_once()
    with session_scope(engine) as s:
        assert s.get(RunRow, "r").recovery_state == "pausing"
    svc.runs.clear()  # as after a partition move: the next tick reloads nothing, an event reloads
    with session_scope(engine) as s:
        assert svc.runs.load_partitions(s, {0}) == 1
    now[0] += 11
    svc.step_once()
    with session_scope(engine) as s:
        cmds = s.scalars(select(CommandRow).order_by(CommandRow.attempt)).all()
    assert [(c.type, c.attempt, c.status) for c in cmds] == [("pause", 1, "timeout"), ("pause", 2, "sent")]
    assert len(svc.outbox._producer.current.sent) == 2  # published right after each commit
    now[0] += 11
    svc.step_once()
    assert svc.runs.slots["r"].recovery.phase is Phase.HALTED


def test_the_service_applies_step_retention_in_the_batch_transaction(engine):
    from sqlalchemy import func

    from cliffguard.controller.store.retention import RetentionConfig

    cfg = ControllerConfig(group_id="g", tick_s=0.001)
    kafka = KafkaConfig(topic_prefix="p")
    policy = RetentionConfig(full_steps=100, mid_steps=200, mid_bucket=10, far_bucket=20, every_steps=20)
    svc = ControllerService(cfg, kafka, engine, SECRET, retention=policy)
    svc.outbox = CommandOutbox(engine, kafka, producer=FakeProducer())
    svc.processor.on_command = svc.outbox.send_early
    svc.edge = StubEdge([as_batch(records("r", 0, 399, 0))])
    svc.step_once()
    with session_scope(engine) as s:
        rows = s.scalar(select(func.count()).select_from(StepMetricRow).where(StepMetricRow.run_id == "r"))
        below = s.scalar(select(RunRow.downsampled_below).where(RunRow.id == "r"))
        newest = s.scalars(select(StepMetricRow.step).where(StepMetricRow.run_id == "r", StepMetricRow.resolution == 1)
                           .order_by(StepMetricRow.step.desc()).limit(100)).all()
    assert below > 0 and rows < 400  # old steps folded into buckets by the controller itself
    assert newest == list(range(399, 299, -1))  # the newest full_steps stay at full resolution


@pytest.mark.parametrize("error, traceback", [("database is locked", False), ("no such column: nonsense", True)])
def test_a_tick_a_busy_store_fails_is_one_line_and_any_other_failure_keeps_its_traceback(engine, caplog, error,
                                                                                          traceback):
    """The soak's seed 10 counted a locked store during a tick as one of our tracebacks."""
    import logging
    import sqlite3

    from sqlalchemy.exc import OperationalError

    svc = service(engine)
    svc.edge = StubEdge([])

    def tick(session, now):
        raise OperationalError("SELECT 1", {}, sqlite3.OperationalError(error))

    svc.processor.tick = tick
    with caplog.at_level(logging.WARNING, logger="cliffguard.controller.service"):
        svc.step_once()
    said = [r for r in caplog.records if "tick failed" in r.getMessage()]
    assert len(said) == 1 and bool(said[0].exc_info) is traceback
    assert (error in said[0].getMessage()) is not traceback and svc.stats["errors"] == 1
