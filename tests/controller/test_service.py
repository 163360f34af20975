"""The controller service through the real broker and a real store (SQLite and PostgreSQL).

The test plays the trainer: it publishes events, reads the signed commands the controller sends,
and answers with acks and validation results, like trainer/commands.py does.
"""

from __future__ import annotations

import time

import pytest
from kafka import KafkaConsumer, TopicPartition
from sqlalchemy import func, select

from cliffguard.controller.rules.loss import LossSpikeConfig
from cliffguard.controller.store import read
from cliffguard.controller.store.db import session_scope
from cliffguard.controller.store.models import (
    AlertRow,
    AuditRow,
    CommandRow,
    DlqCountRow,
    RunRow,
    StepMetricRow,
)
from cliffguard.controller.store.requests import RequestStatus, request_state, submit_request
from cliffguard.core.spike import SpikeDetector
from testing.controller_service import (
    FakeTrainer,
    Running,
    healthy_loss,
    prefix,
    spike,
    step_data,
    store_engine,
    wait_for,
)

pytestmark = pytest.mark.broker

@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db(request, tmp_path):
    pg = request.getfixturevalue("pg_url") if request.param == "postgres" else None
    with store_engine(request.param, tmp_path, pg) as (engine, url):
        yield engine, url


def _has_run(engine, run_id: str) -> bool:
    with session_scope(engine) as s:
        return s.get(RunRow, run_id) is not None


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
        runs = {r.id: r for r in s.scalars(select(RunRow))}
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
        crit = s.scalars(select(AlertRow).where(AlertRow.run_id == "run-c", AlertRow.level == "critical")).all()
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
            run = s.get(RunRow, "run-end")
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
            wait_for(lambda: svc.stats["dead"] == 3)  # the pause leaves before its batch commits
    finally:
        t.close()
    with session_scope(engine) as s:
        counts = {r.reason: r.count for r in s.scalars(select(DlqCountRow))}
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


def _decided(engine, request_id: int):
    with session_scope(engine) as s:
        state = request_state(s, request_id)
    return state if state is not None and state.status is not RequestStatus.PENDING else None


def _halt(t: FakeTrainer, run: str) -> None:
    """Two spikes with a rollback between them: the budget of one is spent, the run halts."""
    prefix(t, run)
    spike(t, run, 41)
    t.ack(t.expect(run, "pause"))
    val = t.expect(run, "validate")
    t.ack(val)
    t.validation(run, 43, 3.0, cmd=val)
    t.ack(t.expect(run, "rollback"))
    t.steps(run, 21, 23)
    spike(t, run, 24)
    t.ack(t.expect(run, "pause"))
    val = t.expect(run, "validate")
    t.ack(val)
    t.validation(run, 26, 3.0, cmd=val)


def test_operator_requests_are_signed_by_the_controller_and_verified_by_the_trainer(kafka_cfg, db):
    engine, _ = db
    t = FakeTrainer(kafka_cfg)
    try:
        with Running(kafka_cfg, engine, group="ctl-requests") as svc:
            _halt(t, "run-op")
            wait_for(lambda: _run(engine, "run-op").recovery_state == "halted")
            bad = submit_request(engine, run_id="ghost", type="pause", args={}, requested_by="mallory", source="cli")
            wait_for(lambda: _decided(engine, bad) is not None, 10)
            assert "not in the store" in _decided(engine, bad).detail
            good = submit_request(engine, run_id="run-op", type="resume", args={"reason": "checked by hand"},
                                  requested_by="dashboard:alice", source="dashboard")
            resume = t.expect("run-op", "resume")  # FakeTrainer.poll verified its signature (core.signing)
            assert _decided(engine, good).command_id == resume.id
            assert resume.args == {"reason": "checked by hand"}
            t.ack(resume, detail="resumed by hand")
            wait_for(lambda: _run(engine, "run-op").recovery_state == "running")
            t.quiet(0.5)
            assert svc.stats["requests_accepted"] == 1 and svc.stats["requests_rejected"] == 1
        assert t.types("run-op") == ["pause", "validate", "rollback", "pause", "validate", "resume"]
    finally:
        t.close()
    with session_scope(engine) as s:
        cmd = s.get(CommandRow, resume.id)
        assert (cmd.source, cmd.status) == ("operator", "applied")
        audit = s.scalars(select(AuditRow)).all()
        assert [(a.actor, a.action, a.command_id) for a in audit] == [("dashboard:alice", "command.resume", resume.id)]
        last = read.transitions(s, "run-op")[-1]
        assert (last["from_state"], last["to_state"]) == ("halted", "running")
        assert last["reason"].startswith("operator_resumed")
        assert [i["outcome"] for i in read.incidents(s, "run-op")] == ["halted"]  # one incident, closed by hand
        assert s.scalars(select(func.count()).select_from(CommandRow).where(CommandRow.run_id == "ghost")).one() == 0


def test_stored_rule_statistics_are_what_the_spike_rule_knew(kafka_cfg, db):
    engine, _ = db
    t = FakeTrainer(kafka_cfg)
    losses = {s: healthy_loss(s) for s in range(30)} | {30: float("nan")} | {s: healthy_loss(s) for s in range(31, 36)}
    try:
        with Running(kafka_cfg, engine, group="ctl-stats"):
            for step, loss in losses.items():
                t.send("run-st", "step", step, step_data(loss, step), world=2)
                t.send("run-st", "step", step, step_data(loss, step), rank=1, world=2)
            t.producer.flush()
            wait_for(lambda: _run(engine, "run-st") is not None and _run(engine, "run-st").last_step == 35)
            t.quiet(0.5)
    finally:
        t.close()
    det = SpikeDetector(LossSpikeConfig())
    expected = []
    for loss in losses.values():
        stats = det.stats() if len(det) >= det.config.min_history else None
        expected.append((*(stats or (None, None)), str(det.observe(loss).level)))
    with session_scope(engine) as s:
        rows = s.execute(select(StepMetricRow.rank, StepMetricRow.rule_median, StepMetricRow.rule_sigma, StepMetricRow.rule_level)
                         .where(StepMetricRow.run_id == "run-st").order_by(StepMetricRow.step, StepMetricRow.rank)).all()
        rule = _run(engine, "run-st").spike_rule
    assert [(r.rule_median, r.rule_sigma, r.rule_level) for r in rows if r.rank == 1] == [(None, None, None)] * 36
    got = [(r.rule_median, r.rule_sigma, r.rule_level) for r in rows if r.rank == 0]
    assert [g[2] for g in got] == [e[2] for e in expected] and got[30][2] == "critical"
    for (gm, gs, _), (em, es, _) in zip(got, expected, strict=True):
        assert (gm is None) == (em is None) and (gm is None or (gm, gs) == pytest.approx((em, es)))
    assert rule["k_warn"] == LossSpikeConfig().k_warn and rule["k_crit"] == LossSpikeConfig().k_crit


def _split(a, b) -> bool:
    """Two members, one metrics partition each (the group's settled state after B joined)."""
    def metrics(c) -> set[int]:
        return {p for topic, p in c.edge.assignment() if topic == c.kafka.metrics_topic}
    ma, mb = metrics(a), metrics(b)
    return len(ma) == 1 and len(mb) == 1 and ma != mb


def _run(engine, run_id: str) -> RunRow | None:
    with session_scope(engine) as s:
        return s.get(RunRow, run_id)


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
            # The settled split, not a moment inside the rebalance: during it one member may briefly hold
            # both partitions (an eager rebalance revokes everything), so "B has some, A has fewer" was
            # true before the acks went to whoever held the partition a moment later.
            wait_for(lambda: _split(a, b), timeout_s=60)
            for run in runs:
                t.ack(pauses[run])
            vals = {run: t.expect(run, "validate") for run in runs}
            split = (sorted(a.edge.assignment()), sorted(b.edge.assignment()))
            # B continued the runs A had started (unless the group split again meanwhile: then say how)
            assert b.stats["commands"] > 0 or not _split(a, b), split
            first.__exit__()  # A leaves: B owns every run now
            before = b.stats["commands"]
            for run in runs:
                t.ack(vals[run])
                t.validation(run, 43, 2.02, cmd=vals[run])
            for run in runs:
                t.ack(t.expect(run, "resume"))
            assert b.stats["commands"] - before == len(runs)  # every run's resume came from B, from the store
            t.quiet(1.0)
            for run in runs:
                assert t.types(run) == ["pause", "validate", "resume"]
        finally:
            t.close()
            second.__exit__()
        with session_scope(engine) as s:
            assert {r.id: r.recovery_state for r in s.scalars(select(RunRow))} == {run: "running" for run in runs}
            assert all(len(read.incidents(s, run)) == 1 for run in runs)
