"""The controller service through the real broker and a real store (SQLite and PostgreSQL).

The test plays the trainer: it publishes events, reads the signed commands the controller sends,
and answers with acks and validation results, like trainer/commands.py does.
"""

from __future__ import annotations

import threading
import time

import pytest
from kafka import KafkaConsumer, TopicPartition
from sqlalchemy import select

from controller.config import ControllerConfig
from controller.recovery_types import RecoveryConfig
from controller.service import ControllerService
from controller.store import read
from controller.store.db import session_scope
from controller.store.models import Alert, AuditRow, CommandRow, DlqCount, Run
from tests.controller.service_support import FAST_GROUP, SECRET, FakeTrainer, store_engine

pytestmark = pytest.mark.broker

RECOVERY = RecoveryConfig(stable_window=5, recover_window=5, rollback_budget=1)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db(request, tmp_path):
    pg = request.getfixturevalue("pg_url") if request.param == "postgres" else None
    with store_engine(request.param, tmp_path, pg) as (engine, url):
        yield engine, url


class Running:
    """A ControllerService on a thread; always closed."""

    def __init__(self, kafka, engine, group="ctl") -> None:
        cfg = ControllerConfig(group_id=group, tick_s=0.2, outbox_interval_s=0.2, **FAST_GROUP)
        self.svc = ControllerService(cfg, kafka, engine, SECRET, recovery=RECOVERY)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.svc.run_forever, args=(self.stop,), daemon=True)

    def __enter__(self) -> ControllerService:
        self.svc.start()
        self.thread.start()
        return self.svc

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(20)
        assert not self.thread.is_alive()


def wait_for(pred, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.1)


def _has_run(engine, run_id: str) -> bool:
    with session_scope(engine) as s:
        return s.get(Run, run_id) is not None


def prefix(t: FakeTrainer, run: str) -> None:
    """40 healthy steps with stable checkpoints at 10 and 20 and a validation baseline of 2.0."""
    t.steps(run, 0, 10)
    t.checkpoint(run, 10)
    t.steps(run, 11, 20)
    t.checkpoint(run, 20, "full")
    t.validation(run, 20, 2.0)
    t.steps(run, 21, 40)


def spike(t: FakeTrainer, run: str, first: int) -> None:
    t.steps(run, first, first + 2, loss=lambda s: 20.0)  # x10: extreme, critical at the first point


def test_scripted_streams_produce_exactly_the_expected_commands(kafka_cfg, db):
    engine, _ = db
    t = FakeTrainer(kafka_cfg)
    try:
        with Running(kafka_cfg, engine):
            for run in ("run-a", "run-b", "run-c"):
                prefix(t, run)
                spike(t, run, 41)
            # run-a: validation abnormal -> rollback to the newest stable checkpoint before the onset
            t.ack(t.expect("run-a", "pause"))
            val = t.expect("run-a", "validate")
            t.ack(val)
            t.validation("run-a", 43, 3.0, cmd=val)
            rb = t.expect("run-a", "rollback")
            assert rb.args == {"to_step": 20, "lr_scale": 0.5}
            t.ack(rb, detail="memory")
            t.steps("run-a", 21, 30)
            # run-b: validation normal -> resume
            t.ack(t.expect("run-b", "pause"))
            val = t.expect("run-b", "validate")
            t.ack(val)
            t.validation("run-b", 43, 2.02, cmd=val)
            t.ack(t.expect("run-b", "resume"))
            t.steps("run-b", 44, 50)
            # run-c: a second spike after the rollback exhausts the budget of one -> halted
            t.ack(t.expect("run-c", "pause"))
            val = t.expect("run-c", "validate")
            t.ack(val)
            t.validation("run-c", 43, 3.0, cmd=val)
            t.ack(t.expect("run-c", "rollback"))
            t.steps("run-c", 21, 23)
            spike(t, "run-c", 24)
            t.ack(t.expect("run-c", "pause"))
            val = t.expect("run-c", "validate")
            t.ack(val)
            t.validation("run-c", 26, 3.0, cmd=val)
            t.quiet(2.0)
        assert t.types("run-a") == ["pause", "validate", "rollback"]
        assert t.types("run-b") == ["pause", "validate", "resume"]
        assert t.types("run-c") == ["pause", "validate", "rollback", "pause", "validate"]
    finally:
        t.close()
    with session_scope(engine) as s:
        runs = {r.id: r for r in s.scalars(select(Run))}
        assert runs["run-a"].recovery_state == "running" and runs["run-a"].lr_scale == 0.5
        assert runs["run-b"].recovery_state == "running"
        assert runs["run-c"].recovery_state == "halted"
        outcomes = {run: [i["outcome"] for i in read.incidents(s, run)] for run in runs}
        assert outcomes == {"run-a": ["rolled_back"], "run-b": ["resumed"], "run-c": ["halted"]}
        inc_a = read.incidents(s, "run-a")[0]
        assert inc_a["onset_step"] == 41 and inc_a["rollback_to"] == 20
        timeline = [(x["from_state"], x["to_state"]) for x in read.transitions(s, "run-a")]
        assert timeline == [("running", "pausing"), ("pausing", "validating"), ("validating", "rolling_back"),
                            ("rolling_back", "recovering"), ("recovering", "running")]
        abnormal = read.transitions(s, "run-a")[2]
        assert abnormal["evidence"]["val_loss"] == 3.0 and abnormal["evidence"]["baseline"] == 2.0
        assert all(c["status"] == "applied" for c in read.commands(s, "run-a"))
        crit = s.scalars(select(Alert).where(Alert.run_id == "run-c", Alert.level == "critical")).all()
        assert any("halted" in a.title for a in crit)
        flags = read.data_flags(s, "run-b")  # the transient spike's samples (8 per step from step*8)
        assert [f["rule"] for f in flags] == ["transient_spike"]
        assert set(range(41 * 8, 42 * 8)) <= set(flags[0]["sample_ids"]) <= set(range(41 * 8, 44 * 8))
        assert read.data_flags(s, "run-a") == []
        stable = {c["step"] for c in read.checkpoints(s, "run-a") if c["stable"]}
        assert {10, 20} <= stable


def _outcomes(engine, run_id: str) -> list[str]:
    with session_scope(engine) as s:
        return [i["outcome"] for i in read.incidents(s, run_id)]


def test_run_finished_while_pausing_abandons_the_incident_and_cancels_the_pause(kafka_cfg, tmp_path):
    with store_engine("sqlite", tmp_path) as (engine, _):
        t = FakeTrainer(kafka_cfg)
        try:
            # its own consumer group: sharing "ctl" made the next test's controller re-read its first
            # offsets (dead letters counted twice) in 2 of 3 runs on the shared broker
            with Running(kafka_cfg, engine, group="ctl-end"):
                prefix(t, "run-end")
                spike(t, "run-end", 41)
                pause = t.expect("run-end", "pause")
                t.send("run-end", "run.finished", 43, {"steps": 44})  # ends instead of acking the pause
                t.producer.flush()
                wait_for(lambda: _outcomes(engine, "run-end") == ["abandoned"])
                t.quiet(1.0)
            assert t.types("run-end") == ["pause"]  # nothing more is sent to a trainer that is gone
        finally:
            t.close()
        with session_scope(engine) as s:
            run = s.get(Run, "run-end")
            assert run.status == "finished" and run.recovery_state == "running"
            inc = read.incidents(s, "run-end")[0]
            assert inc["closed_at"] is not None
            timeline = [(x["from_state"], x["to_state"]) for x in read.transitions(s, "run-end")]
            assert timeline == [("running", "pausing"), ("pausing", "running")]
            assert read.transitions(s, "run-end")[-1]["reason"].startswith("run_ended: the run finished while pausing")
            assert s.get(CommandRow, pause.id).status == "cancelled"


def test_malformed_input_goes_to_the_dlq_and_the_service_stays_up(kafka_cfg, db):
    engine, _ = db
    t = FakeTrainer(kafka_cfg)
    try:
        with Running(kafka_cfg, engine) as svc:
            t.send_raw("run-x", b"\xff\xfe not json")
            t.send_raw("run-x", b'{"v": 99, "id": "' + b"a" * 32 + b'", "run": "run-x"}')
            t.send_raw("run-x", b'{"v": 1, "type": "step"}')
            prefix(t, "run-x")
            spike(t, "run-x", 41)
            t.expect("run-x", "pause")
            assert svc.stats["dead"] == 3
    finally:
        t.close()
    with session_scope(engine) as s:
        counts = {r.reason: r.count for r in s.scalars(select(DlqCount))}
    assert counts == {"undecodable": 1, "unknown_version": 1, "schema_invalid": 1}
    dlq = KafkaConsumer(**kafka_cfg.client_kwargs(), auto_offset_reset="earliest", enable_auto_commit=False)
    try:
        parts = [TopicPartition(kafka_cfg.dlq_topic, p) for p in range(kafka_cfg.partitions)]
        dlq.assign(parts)
        dlq.seek_to_beginning(*parts)
        got: list[bytes] = []
        deadline = time.monotonic() + 10
        while len(got) < 3 and time.monotonic() < deadline:
            got += [m.value for msgs in dlq.poll(timeout_ms=500).values() for m in msgs]
    finally:
        dlq.close()
    assert b"\xff\xfe not json" in got and len(got) == 3


def test_operator_command_goes_through_the_outbox_with_an_audit_row(kafka_cfg, tmp_path):
    from controller.operator import UnknownRun, issue_operator_command

    with store_engine("sqlite", tmp_path) as (engine, _):
        t = FakeTrainer(kafka_cfg)
        try:
            with Running(kafka_cfg, engine):
                t.steps("run-op", 0, 2)
                wait_for(lambda: _has_run(engine, "run-op"))
                with session_scope(engine) as s:
                    with pytest.raises(UnknownRun):
                        issue_operator_command(s, run_id="nope", type="pause", args={}, actor="alice",
                                               secret=SECRET, commands_topic=kafka_cfg.commands_topic)
                    row = issue_operator_command(s, run_id="run-op", type="rollback",
                                                 args={"to_step": 1, "lr_scale": 0.5}, actor="alice",
                                                 secret=SECRET, commands_topic=kafka_cfg.commands_topic)
                    cmd_id = row.id
                cmd = t.expect("run-op", "rollback")
                assert cmd.id == cmd_id and cmd.args == {"to_step": 1, "lr_scale": 0.5}
        finally:
            t.close()
        with session_scope(engine) as s:
            assert s.get(CommandRow, cmd_id).source == "operator"
            assert s.get(CommandRow, cmd_id).status == "sent"
            audit = s.scalars(select(AuditRow)).all()
            assert [(a.actor, a.action, a.command_id) for a in audit] == [("alice", "command.rollback", cmd_id)]


@pytest.mark.slow
def test_two_instances_share_runs_and_a_moved_run_continues_from_the_store(kafka_cfg, tmp_path):
    runs = [f"share-{i}" for i in range(6)]
    with store_engine("sqlite", tmp_path) as (engine, _):
        t = FakeTrainer(kafka_cfg)
        first = Running(kafka_cfg, engine, group="shared")
        second = Running(kafka_cfg, engine, group="shared")
        try:
            a = first.__enter__()
            for run in runs:
                prefix(t, run)
                spike(t, run, 41)
            pauses = {run: t.expect(run, "pause") for run in runs}
            b = second.__enter__()  # joins: the group rebalances, B takes over a partition
            wait_for(lambda: bool(b.edge.assignment()) and len(a.edge.assignment()) < kafka_cfg.partitions)
            for run in runs:
                t.ack(pauses[run])
            vals = {run: t.expect(run, "validate") for run in runs}
            assert b.stats["events"] > 0 and b.stats["commands"] > 0  # B continued runs A had started
            first.__exit__()  # A leaves: B owns every run now
            for run in runs:
                t.ack(vals[run])
                t.validation(run, 43, 2.02, cmd=vals[run])
            for run in runs:
                t.ack(t.expect(run, "resume"))
            t.quiet(1.0)
            for run in runs:
                assert t.types(run) == ["pause", "validate", "resume"]
        finally:
            t.close()
            second.__exit__()
        with session_scope(engine) as s:
            assert {r.id: r.recovery_state for r in s.scalars(select(Run))} == {run: "running" for run in runs}
            assert all(len(read.incidents(s, run)) == 1 for run in runs)
