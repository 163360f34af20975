"""The controller survives its broker restarting empty (topics re-created, offsets from 0 again).

Stored offsets then point past the end of the new topic; without care the service would seek
there (skipping the new events) or refuse every new batch as already processed. Real parts: an
embedded broker restarted on the same port, the controller service on a thread, SQLite.
"""

from __future__ import annotations

import time

import pytest
from sqlalchemy import func, select

from cliffguard.controller.broker import EmbeddedBroker, ensure_topics, free_port
from cliffguard.controller.store.db import session_scope
from cliffguard.controller.store.models import StepMetricRow
from testing.controller_service import FakeTrainer, Running, store_engine, wait_for

pytestmark = [pytest.mark.broker, pytest.mark.slow, pytest.mark.timeout(240)]


def _steps(engine, run: str) -> set[int]:
    with session_scope(engine) as s:
        return set(s.scalars(select(StepMetricRow.step).where(StepMetricRow.run_id == run)))


def _count(engine, run: str) -> int:
    with session_scope(engine) as s:
        return s.scalar(select(func.count()).select_from(StepMetricRow).where(StepMetricRow.run_id == run))


def test_controller_keeps_consuming_after_the_broker_restarts_empty(tmp_path):
    broker = EmbeddedBroker(port=free_port()).start()
    try:
        kafka = broker.kafka_config(topic_prefix="restart", partitions=1)
        ensure_topics(kafka)
        with store_engine("sqlite", tmp_path) as (engine, _), Running(kafka, engine) as svc:
            trainer = FakeTrainer(kafka)
            trainer.steps("r", 0, 39)
            trainer.producer.flush()
            wait_for(lambda: _count(engine, "r") == 40, 60)
            trainer.close()

            broker.restart(down_s=1.0)  # in-memory broker: every topic and offset is gone
            ensure_topics(kafka)
            trainer = FakeTrainer(kafka)
            trainer.steps("r", 40, 49)  # offsets 0..9 of the new topic; the store says 40
            trainer.producer.flush()
            wait_for(lambda: _steps(engine, "r") >= set(range(50)), 90)
            trainer.close()
        assert _count(engine, "r") == 50  # nothing lost, nothing applied twice
        assert svc.stats["stale"] == 0 or svc.stats.get("offset_resets", 0) >= 1
    finally:
        broker.stop()


def test_commands_and_dead_letters_still_leave_after_the_broker_restarts_empty(tmp_path):
    """kafka-python's idempotent producer goes fatal once a restarted broker forgets its producer
    id: the outbox and the dead-letter producer must build new ones (issue 29 A)."""
    import time

    from cliffguard.controller.edge import EdgeConsumer
    from cliffguard.controller.edge_classify import DeadLetter
    from cliffguard.controller.operator import enqueue_command
    from cliffguard.controller.outbox import CommandOutbox
    from cliffguard.controller.store.models import CommandRow, RunRow
    from testing.controller_service import SECRET

    broker = EmbeddedBroker(port=free_port()).start()
    try:
        kafka = broker.kafka_config(topic_prefix="restart2", partitions=1)
        ensure_topics(kafka)
        with store_engine("sqlite", tmp_path) as (engine, _):
            with session_scope(engine) as s:
                s.add(RunRow(id="r"))
            box = CommandOutbox(engine, kafka, retry_s=0.2)
            edge = EdgeConsumer(kafka, "restart2-group")

            def queue() -> str:
                with session_scope(engine) as s:
                    return enqueue_command(s, run_id="r", type="pause", args={}, secret=SECRET,
                                           commands_topic=kafka.commands_topic, ttl_s=120, source="controller",
                                           now=time.time()).id

            def dead(offset: int) -> DeadLetter:
                return DeadLetter("undecodable", "$: test", kafka.metrics_topic, 0, offset, b"x")

            queue()
            assert box.publish_due() == 1
            edge._send_dead([dead(0)])
            assert edge.dlq_send_errors == 0

            broker.restart(down_s=1.0)
            ensure_topics(kafka)
            cmds = [queue() for _ in range(3)]

            def all_sent() -> bool:
                box.publish_due(time.time() + 60)  # due now, whatever the backoff said
                with session_scope(engine) as s:
                    return all(s.get(CommandRow, c).status == "sent" for c in cmds)

            wait_for(all_sent, 60)
            assert box._producer.discards >= 1  # the old producer was the one that failed
            wait_for(lambda: _dlq_sent_once(edge, dead(1)), 60)  # the first try after the restart fails
            assert edge._dlq.discards >= 1
            box.close()
            edge.close()
    finally:
        broker.stop()


def _dlq_sent_once(edge, letter) -> bool:
    before = edge.dlq_send_errors
    edge._send_dead([letter])
    return edge.dlq_send_errors == before


def _stuck_then_released(tmp_path, caplog, prefix: str, stuck_after_s: float, release: str):
    """A controller on a real broker stores steps 0-19; then its polls come back empty (the fetch
    held stuck) until the edge's ``release`` method is called (a seek, a rebuild); steps 20-39
    must all be stored. Returns the service and what it logged while stuck."""
    import logging
    import threading

    from cliffguard.controller.config import ControllerConfig
    from cliffguard.controller.edge_classify import EdgeBatch
    from cliffguard.controller.service import ControllerService
    from testing.controller_service import FAST_GROUP, RECOVERY, SECRET

    broker = EmbeddedBroker(port=free_port()).start()
    try:
        kafka = broker.kafka_config(topic_prefix=prefix, partitions=1)
        ensure_topics(kafka)
        with store_engine("sqlite", tmp_path) as (engine, _):
            cfg = ControllerConfig(group_id="ctl", tick_s=0.2, outbox_interval_s=0.2, stuck_after_s=stuck_after_s,
                                   **FAST_GROUP)
            svc = ControllerService(cfg, kafka, engine, SECRET, recovery=RECOVERY)
            svc.start()
            stuck = threading.Event()
            poll, released = svc.edge.poll, getattr(svc.edge, release)
            held_polls = []

            def stuck_poll(timeout_s=1.0):
                if stuck.is_set():
                    held_polls.append(1)
                    time.sleep(min(timeout_s, 0.1))
                    return EdgeBatch()
                return poll(timeout_s)

            def release_clears(*args):
                stuck.clear()
                return released(*args)

            svc.edge.poll = stuck_poll
            setattr(svc.edge, release, release_clears)
            stop = threading.Event()
            thread = threading.Thread(target=svc.run_forever, args=(stop,), daemon=True)
            thread.start()
            try:
                trainer = FakeTrainer(kafka)
                trainer.steps("r", 0, 19)
                trainer.producer.flush()
                wait_for(lambda: _count(engine, "r") == 20, 60)
                stuck.set()
                # a real poll already under way when the flag went up would read on: wait for held ones
                wait_for(lambda: len(held_polls) >= 2, 30)
                with caplog.at_level(logging.WARNING, logger="cliffguard.controller"):
                    trainer.steps("r", 20, 39)
                    trainer.producer.flush()
                    wait_for(lambda: _count(engine, "r") == 40, 120)
                trainer.close()
            finally:
                stop.set()
                thread.join(20)
        return svc, [r.getMessage() for r in caplog.records]
    finally:
        broker.stop()


def test_a_partition_that_reads_nothing_while_its_log_grows_is_said_and_read_again(tmp_path, caplog):
    """The soak's seed 5: after a broker restart the controller polled nothing for 31 s while the log
    grew, and said nothing. Here the consumer's fetch is held stuck (its polls come back empty) until
    something seeks it; the controller must notice within ``stuck_after_s``, say so, and read on."""
    svc, said = _stuck_then_released(tmp_path, caplog, "stuck", 3.0, "seek")
    said = [m for m in said if "nothing read for" in m]
    assert said and "while the log ends at" in said[0], caplog.text
    assert svc.stats["stuck_resets"] >= 1


def test_a_consumer_a_seek_does_not_unstick_is_built_again_and_reads_on(tmp_path, caplog):
    """The CI soak's seed 2: the broker was killed while the controller was stopped; after it went on,
    the store stood still though the stuck watch sought. Here the consumer is held stuck until it is
    built again (a seek does not clear it); the controller must find it stuck twice, say so, build
    a fresh consumer that joins the group and seeks to the store's offsets, and store every step."""
    svc, said = _stuck_then_released(tmp_path, caplog, "wedged", 2.0, "rebuild")
    said = [m for m in said if "rebuilding the metrics consumer" in m]
    assert said and "2 looks, a seek between them" in said[0], caplog.text
    assert svc.stats["consumer_rebuilds"] == 1 and svc.stats["stuck_resets"] >= 2
