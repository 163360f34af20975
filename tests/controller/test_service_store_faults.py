"""Store faults in the service loop: a lock is waited out (no dead letter, no lost row, no offset
moved), a deleted, replaced or read-only store stops the service, a failed tick reloads the runs."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import threading
import time
import urllib.error
import urllib.request

import pytest
from sqlalchemy import select
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

from cliffguard.controller import batch as batch_mod
from cliffguard.controller.config import ControllerConfig
from cliffguard.controller.health import HealthServer
from cliffguard.controller.outbox import CommandOutbox
from cliffguard.controller.service import MAX_BATCH_FAILURES, ControllerService
from cliffguard.controller.store.db import StoreConfig, init_db, make_engine, session_scope
from cliffguard.controller.store.errors import StoreLost
from cliffguard.controller.store.guard import StoreGuard
from cliffguard.controller.store.models import DlqCountRow, StepMetricRow
from cliffguard.core.kafka_config import KafkaConfig
from testing.controller_service import SECRET
from tests.controller.test_service_loop import TOPIC, StubEdge, as_batch, records, stored_offset
from tests.controller.test_service_outbox import FakeProducer


class PausingEdge(StubEdge):
    """StubEdge that honours pause/resume like kafka-python: nothing is polled while paused."""

    def assignment(self):
        return [(TOPIC, 0), (TOPIC, 1)]

    def __init__(self, batches) -> None:
        super().__init__(batches)
        self.paused: set = set()
        self.pauses = 0

    def poll(self, timeout_s: float):
        if self.paused:
            time.sleep(min(timeout_s, 0.01))
            return as_empty()
        return super().poll(timeout_s)

    def pause(self, tps) -> None:
        self.paused |= set(tps)
        self.pauses += 1

    def resume(self, tps) -> None:
        self.paused -= set(tps)

    def connected(self) -> bool:
        return True


def as_empty():
    from cliffguard.controller.edge_classify import EdgeBatch

    return EdgeBatch()


@pytest.fixture
def db(tmp_path):
    path = tmp_path / "store" / "store.db"
    eng = make_engine(StoreConfig(url=f"sqlite:///{path}", busy_timeout_ms=50))
    init_db(eng)
    yield eng, path
    eng.dispose()


def service(engine) -> ControllerService:
    cfg = ControllerConfig(group_id="g", tick_s=0.001, store_retry_initial_s=0.02, store_retry_max_s=0.2)
    kafka = KafkaConfig(topic_prefix="p")
    svc = ControllerService(cfg, kafka, engine, SECRET)
    svc.outbox = CommandOutbox(engine, kafka, producer=FakeProducer())
    svc.processor.on_command = svc.outbox.send_early  # the early send too: no real producer
    return svc


def steps_and_dead(engine) -> tuple[list[int], dict[str, int]]:
    with session_scope(engine) as s:
        return (sorted(s.scalars(select(StepMetricRow.step))),
                {r.reason: r.count for r in s.scalars(select(DlqCountRow))})


def get(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_a_store_locked_for_seconds_is_waited_out_with_no_dead_letter_and_no_lost_row(db):
    engine, path = db
    svc = service(engine)
    svc.edge = PausingEdge([as_batch(records("r", 0, 4, offset=0)), as_batch(records("r", 5, 9, offset=5))])
    health = HealthServer("127.0.0.1", 0, lambda: svc.health, 30.0)
    try:
        svc.step_once()
        assert stored_offset(engine) == 5
        holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        holder.execute("BEGIN IMMEDIATE")  # another writer holds the lock for 2 s
        threading.Timer(2.0, lambda: holder.execute("ROLLBACK")).start()
        start = time.monotonic()
        svc.step_once()
        assert svc.held.batch is not None and svc.edge.paused == {(TOPIC, 0), (TOPIC, 1)}  # all of them
        assert stored_offset(engine) == 5 and len(svc.edge.committed) == 1  # no offset moved
        svc.step_once()
        status, body = get(f"http://127.0.0.1:{health.port}/readyz")
        assert status == 503 and "locked" in body["reason"] and body["ok"] is False
        assert get(f"http://127.0.0.1:{health.port}/healthz")[0] == 200  # alive, just waiting
        while svc.held.batch is not None and time.monotonic() - start < 20:
            svc.step_once()
        holder.close()
        assert time.monotonic() - start >= 1.9
        assert svc.stats["store_retries"] > MAX_BATCH_FAILURES  # more failures than the poison limit
        assert steps_and_dead(engine) == (list(range(10)), {})
        assert stored_offset(engine) == 10 and svc.edge.committed[-1] == {(TOPIC, 0): 10}
        assert svc.edge.paused == set()
        svc.step_once()
        status, body = get(f"http://127.0.0.1:{health.port}/readyz")
        assert (status, body["reason"]) == (200, "ready")
    finally:
        health.close()


def test_a_lock_met_while_isolating_a_poisonous_event_keeps_the_rest_of_the_batch(db, monkeypatch):
    engine, _ = db
    recs = records("r", 0, 4, offset=0)
    poison, unlucky = recs[1].event.id, recs[3].event.id
    locked_once = []
    real = batch_mod.ingest_events

    def ingest(session, events, **kw):
        ids = {e.id for e in events}
        if poison in ids:
            raise RuntimeError("boom")
        if ids == {unlucky} and not locked_once:
            locked_once.append(1)
            raise OperationalError("INSERT", {}, sqlite3.OperationalError("database is locked"))
        return real(session, events, **kw)

    monkeypatch.setattr(batch_mod, "ingest_events", ingest)
    svc = service(engine)
    svc.edge = PausingEdge([as_batch(recs)])
    deadline = time.monotonic() + 10
    while (svc.held.batch is not None or not svc.edge.committed) and time.monotonic() < deadline:
        svc.step_once()
    assert locked_once
    assert steps_and_dead(engine) == ([0, 2, 3, 4], {"processing_error": 1})  # only the poison
    assert stored_offset(engine) == 5 and svc.edge.committed[-1] == {(TOPIC, 0): 5}


def test_a_deleted_store_stops_the_service_before_kafka_hears_of_a_commit(db):
    engine, path = db
    svc = service(engine)
    svc.edge = PausingEdge([as_batch(records("r", 0, 4, offset=0)), as_batch(records("r", 5, 9, offset=5))])
    svc.step_once()
    shutil.rmtree(path.parent)  # the store directory is gone; SQLite would write on into the void
    with pytest.raises(StoreLost, match="deleted"):
        svc.step_once()
    assert svc.edge.committed == [{(TOPIC, 0): 5}]
    assert "deleted" in svc.health.store_error


def test_a_replaced_store_file_is_never_opened_by_a_new_connection(db):
    engine, path = db
    svc = service(engine)
    svc.edge = PausingEdge([as_batch(records("r", 0, 4, offset=0))])
    svc.step_once()
    shutil.copy(path, path.with_suffix(".new"))
    os.replace(path.with_suffix(".new"), path)
    with pytest.raises(StoreLost, match="replaced"):
        svc.step_once()
    engine.dispose()  # pooled connections gone: a new one must refuse the replaced file
    with pytest.raises(StoreLost, match="replaced"), engine.connect():
        pass


def test_a_read_only_sqlite_store_fails_the_write_probe_with_its_reason(db):
    engine, path = db
    ro = make_engine(f"sqlite:///file:{path}?mode=ro&uri=true")
    try:
        with pytest.raises(StoreLost, match="not writable.*readonly"):
            StoreGuard(ro).probe_write()
        StoreGuard(engine).probe_write()  # the writable one passes
    finally:
        ro.dispose()


@pytest.mark.postgres
def test_a_read_only_postgres_store_fails_the_write_probe(tmp_path, pg_url):
    from testing.controller_service import store_engine

    with store_engine("postgres", tmp_path, pg_url) as (_eng, url):
        opts = make_url(url).query["options"] + " -cdefault_transaction_read_only=on"
        ro = make_engine(make_url(url).update_query_dict({"options": opts}).render_as_string(hide_password=False))
        try:
            with pytest.raises(StoreLost, match="read-only transaction"):
                StoreGuard(ro).probe_write()
        finally:
            ro.dispose()


def test_a_failed_tick_reloads_the_runs_so_their_timeouts_go_on(db, monkeypatch):
    engine, _ = db
    svc = service(engine)
    svc.edge = PausingEdge([as_batch(records("r", 0, 4, offset=0))])
    svc.step_once()
    assert "r" in svc.runs.slots
    real = svc.processor.tick
    calls = []

    def tick(session, now):
        calls.append(now)
        if len(calls) == 1:
            raise OperationalError("UPDATE", {}, sqlite3.OperationalError("database is locked"))
        return real(session, now)

    monkeypatch.setattr(svc.processor, "tick", tick)
    svc.step_once()
    assert svc.runs.slots == {} and svc._runs_stale
    svc.step_once()
    assert "r" in svc.runs.slots and not svc._runs_stale and len(calls) == 2


def test_a_lost_store_in_a_batch_stops_the_service(db, monkeypatch):
    engine, _ = db

    def ingest(session, events, **kw):
        raise OperationalError("INSERT", {}, sqlite3.OperationalError("attempt to write a readonly database"))

    monkeypatch.setattr(batch_mod, "ingest_events", ingest)
    svc = service(engine)
    svc.edge = PausingEdge([as_batch(records("r", 0, 4, offset=0))])
    with pytest.raises(StoreLost, match="readonly"):
        svc.step_once()
    assert svc.edge.committed == [] and steps_and_dead(engine) == ([], {})


@pytest.mark.postgres
def test_a_postgres_lock_timeout_is_waited_out_with_no_dead_letter(tmp_path, pg_url):
    from sqlalchemy import text

    from testing.controller_service import store_engine

    with store_engine("postgres", tmp_path, pg_url) as (_eng, url):
        opts = make_url(url).query["options"] + " -clock_timeout=100"
        engine = make_engine(make_url(url).update_query_dict({"options": opts}).render_as_string(hide_password=False))
        holder = make_engine(url)
        try:
            svc = service(engine)
            svc.edge = PausingEdge([as_batch(records("r", 0, 4, offset=0))])
            conn = holder.connect()
            tx = conn.begin()
            conn.execute(text("LOCK TABLE step_metrics IN ACCESS EXCLUSIVE MODE"))
            threading.Timer(1.5, tx.rollback).start()
            start = time.monotonic()
            svc.step_once()
            assert svc.held.batch is not None and svc.stats["store_retries"] == 1
            while svc.held.batch is not None and time.monotonic() - start < 20:
                svc.step_once()
            conn.close()
            assert svc.stats["store_retries"] > 1
            assert steps_and_dead(engine) == (list(range(5)), {})
            assert stored_offset(engine) == 5 and svc.edge.committed == [{(TOPIC, 0): 5}]
        finally:
            engine.dispose()
            holder.dispose()


def test_a_store_that_turns_read_only_stops_the_service(db, monkeypatch):
    engine, path = db
    svc = service(engine)
    svc.edge = PausingEdge([as_batch(records("r", 0, 4, offset=0)), as_batch(records("r", 5, 9, offset=5))])
    svc.step_once()
    real = os.access
    # as after `mount -o remount,bind,ro` over the directory (root ignores file modes, not mounts)
    monkeypatch.setattr(os, "access", lambda p, mode: False if str(p).startswith(str(path.parent)) else real(p, mode))
    with pytest.raises(StoreLost, match="read-only"):
        svc.step_once()
    assert svc.edge.committed == [{(TOPIC, 0): 5}]


def test_an_assignment_while_the_store_is_unreadable_pauses_until_the_offsets_can_be_read(db, monkeypatch):
    from cliffguard.controller import service as service_mod
    from cliffguard.controller.store.offsets import save_offsets

    engine, _ = db
    with session_scope(engine) as s:
        save_offsets(s, "g", {(TOPIC, 0): 5})
    svc = service(engine)
    svc.edge = PausingEdge([])
    real = service_mod.load_offsets
    fail = [True]

    def load(session, group, topic):
        if fail[0]:
            raise OperationalError("SELECT", {}, sqlite3.OperationalError("database is locked"))
        return real(session, group, topic)

    monkeypatch.setattr(service_mod, "load_offsets", load)
    svc._on_assigned([(TOPIC, 0)])  # kafka-python would swallow an exception here and read on
    assert svc.edge.paused == {(TOPIC, 0)} and svc.edge.seeks == []
    svc.step_once()  # still unreadable: stays paused, nothing read
    assert svc.edge.paused == {(TOPIC, 0)}
    fail[0] = False
    svc.step_once()
    assert svc.edge.seeks == [(TOPIC, 0, 5)] and svc.edge.paused == set()
