"""A controller holding no metrics partition (controller/assignment_watch.py): with nobody storing
the group's offsets it says so and joins the group again; with a peer storing them it stands by.

Real parts: an embedded broker, a SQLite store, the service on a thread. What is held is the
group's answer: the edge reports no assignment and polls nothing (what CI saw from Tansu's group
coordinator) until the consumer is built again."""

from __future__ import annotations

import logging
import threading
import time

import pytest
from sqlalchemy import func, select

from cliffguard.controller.broker import EmbeddedBroker, ensure_topics, free_port
from cliffguard.controller.config import ControllerConfig
from cliffguard.controller.edge_classify import EdgeBatch
from cliffguard.controller.service import ControllerService
from cliffguard.controller.store.db import session_scope
from cliffguard.controller.store.models import StepMetricRow
from cliffguard.controller.store.offsets import save_offsets
from testing.controller_service import FAST_GROUP, RECOVERY, SECRET, FakeTrainer, store_engine, wait_for

pytestmark = [pytest.mark.broker, pytest.mark.slow, pytest.mark.timeout(240)]
AFTER_S = 2.0


def _count(engine, run: str) -> int:
    with session_scope(engine) as s:
        return s.scalar(select(func.count()).select_from(StepMetricRow).where(StepMetricRow.run_id == run))


def _unassigned_until_rebuilt(svc: ControllerService) -> threading.Event:
    """From now on the edge holds no partition and polls nothing, until it is built again."""
    edge, hidden = svc.edge, threading.Event()
    assignment, poll, rebuild = edge.assignment, edge.poll, edge.rebuild
    hidden.set()

    def no_assignment():
        return [] if hidden.is_set() else assignment()

    def no_poll(timeout_s=1.0):
        if hidden.is_set():
            time.sleep(min(timeout_s, 0.1))
            return EdgeBatch()
        return poll(timeout_s)

    def rebuilt(why):
        hidden.clear()
        return rebuild(why)

    edge.assignment, edge.poll, edge.rebuild = no_assignment, no_poll, rebuilt
    return hidden


def _service(tmp_path, prefix: str, engine, after_s: float = AFTER_S):
    broker = EmbeddedBroker(port=free_port()).start()
    kafka = broker.kafka_config(topic_prefix=prefix, partitions=1)
    ensure_topics(kafka)
    cfg = ControllerConfig(group_id=f"ctl-{prefix}", tick_s=0.2, outbox_interval_s=0.2, stuck_after_s=0,
                           unassigned_after_s=after_s, **FAST_GROUP)
    svc = ControllerService(cfg, kafka, engine, SECRET, recovery=RECOVERY)
    svc.start()
    return broker, kafka, svc


def test_no_partitions_and_nobody_storing_offsets_is_said_and_the_group_joined_again(tmp_path, caplog):
    with store_engine("sqlite", tmp_path) as (engine, _):
        broker, kafka, svc = _service(tmp_path, "lost", engine)
        stop = threading.Event()
        thread = threading.Thread(target=svc.run_forever, args=(stop,), daemon=True)
        trainer = FakeTrainer(kafka)
        try:
            thread.start()
            trainer.steps("r", 0, 9)
            wait_for(lambda: _count(engine, "r") == 10, 60)
            # a loaded runner's first join can outlast the 2 s window: that episode is not this test's
            before, rejoins_before = len(caplog.records), svc.stats.get("unassigned_rejoins", 0)
            with caplog.at_level(logging.INFO, logger="cliffguard.controller"):
                hidden = _unassigned_until_rebuilt(svc)
                trainer.steps("r", 10, 19)  # unread while no partition is held
                wait_for(lambda: not hidden.is_set(), 30)
                wait_for(lambda: _count(engine, "r") == 20, 60)
        finally:
            stop.set()
            thread.join(20)
            trainer.close()
            svc.close()
            broker.stop()
    said = [r for r in caplog.records[before:] if "no metrics partitions for" in r.getMessage()]
    assert said and said[0].levelno == logging.WARNING, caplog.text
    assert "no member of group ctl-lost stored an offset" in said[0].getMessage()
    assert "joining the group again" in said[0].getMessage()
    # the events sent meanwhile were read: the rebuilt consumer holds the partition again. One rejoin,
    # or more where a loaded runner's join outlasted the doubled 4 s window, each said, from the second on at ERROR
    rejoins = svc.stats["unassigned_rejoins"] - rejoins_before
    joins = [r for r in said if "joining the group again" in r.getMessage()]
    assert rejoins >= 1 and len(joins) == rejoins, caplog.text
    assert all(r.levelno == logging.ERROR for r in joins[1:])
    assert not any("stands by" in r.getMessage() for r in caplog.records)


def test_no_partitions_while_a_peer_stores_the_groups_offsets_is_a_standby_said_once(tmp_path, caplog):
    with store_engine("sqlite", tmp_path) as (engine, _):
        # a wider window than the other test's: on a loaded CI runner the peer's writes must land
        # between the assignment emptying and the first look
        after_s = 3 * AFTER_S
        broker, kafka, svc = _service(tmp_path, "standby", engine, after_s=after_s)
        stop, peer_stop = threading.Event(), threading.Event()
        thread = threading.Thread(target=svc.run_forever, args=(stop,), daemon=True)
        writes = []

        def peer():  # another member of the group: it stores the offsets it consumed, batch by batch
            while not peer_stop.wait(0.2):
                with session_scope(engine) as s:
                    save_offsets(s, svc.config.group_id, {(kafka.metrics_topic, 0): len(writes) + 1})
                writes.append(time.time())

        peer_thread = threading.Thread(target=peer, daemon=True)
        try:
            peer_thread.start()
            wait_for(lambda: writes, 30)  # the peer consumes before this instance's partitions go
            thread.start()
            wait_for(lambda: svc.edge.assignment(), 60)  # joined, then its group gives it nothing
            with caplog.at_level(logging.INFO, logger="cliffguard.controller"):
                hidden = _unassigned_until_rebuilt(svc)
                wait_for(lambda: any("stands by" in r.getMessage() for r in caplog.records), 60)
                time.sleep(2 * after_s)  # two more looks: still a standby, said once, never rebuilt
        finally:
            peer_stop.set()
            if peer_thread.is_alive():
                peer_thread.join(5)
            stop.set()
            thread.join(20)
            svc.close()
            broker.stop()
    standby = [r for r in caplog.records if "stands by" in r.getMessage()]
    assert len(standby) == 1 and standby[0].levelno == logging.INFO, caplog.text
    assert hidden.is_set() and svc.stats.get("unassigned_rejoins", 0) == 0
