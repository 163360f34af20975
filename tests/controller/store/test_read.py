"""Read-side queries over a store filled through the real write paths; SQLite and PostgreSQL."""

from __future__ import annotations

import math

import pytest

from controller.store import read
from controller.store.db import session_scope
from controller.store.ingest import ingest_events
from controller.store.models import Alert, AuditRow, CommandRow, Incident, OutboxRow, Run, Transition
from core.enums import EventType
from tests.controller.store import factory as f


def _loss(step: int) -> float:
    return 2.0 + 1.0 / (1 + step) + (5.0 if step == 437 else 0.0)  # one spike at step 437


@pytest.fixture
def run_1000(engine):
    """run-a: 1000 steps on 2 ranks (rank 1 twice as slow), histograms every 100 steps."""
    events = [f.run_started()]
    for i in range(1000):
        events += [f.step(i, _loss(i), rank=r, step_time_s=0.1 * (1 + r)) for r in range(2)]
        if i % 100 == 0:
            events.append(f.grad_hist(i, p99=1e-3 * (1 + i)))
    with session_scope(engine) as s:
        ingest_events(s, events)
    return engine


def test_loss_curve_at_full_resolution(run_1000):
    with session_scope(run_1000) as s:
        curve = read.loss_curve(s, "run-a", max_points=None)
    assert [p["step"] for p in curve] == list(range(1000))
    assert all(p["loss"] == p["loss_min"] == p["loss_max"] == _loss(p["step"]) for p in curve)
    assert {p["resolution"] for p in curve} == {1}


@pytest.mark.parametrize("max_points", [1, 7, 100, 999])
def test_loss_curve_is_bounded_by_max_points_and_keeps_the_spike(run_1000, max_points):
    with session_scope(run_1000) as s:
        curve = read.loss_curve(s, "run-a", max_points=max_points)
    assert 0 < len(curve) <= max_points
    assert max(p["loss_max"] for p in curve) == pytest.approx(_loss(437))
    assert min(p["loss_min"] for p in curve) == pytest.approx(_loss(999))
    width = curve[0]["resolution"]
    assert width > 1 and all(p["step"] % width == 0 for p in curve)
    # the bucket mean is the mean of the raw losses in it
    first = [_loss(i) for i in range(width)]
    assert curve[0]["loss"] == pytest.approx(sum(first) / len(first))


def test_loss_curve_step_range_and_rank(run_1000):
    with session_scope(run_1000) as s:
        window = read.loss_curve(s, "run-a", from_step=430, to_step=440, max_points=None)
        assert [p["step"] for p in window] == list(range(430, 441))
        assert read.loss_curve(s, "run-a", rank=1, from_step=999) != []
        assert read.loss_curve(s, "run-a", rank=5) == []
        assert read.loss_curve(s, "nope") == []


def test_rank_metrics_raw_and_bucketed(run_1000):
    with session_scope(run_1000) as s:
        raw = read.rank_metrics(s, "run-a", columns=("step_time_s",), from_step=10, to_step=11)
        assert raw == [
            {"step": 10, "rank": 0, "step_time_s": 0.1},
            {"step": 10, "rank": 1, "step_time_s": 0.2},
            {"step": 11, "rank": 0, "step_time_s": 0.1},
            {"step": 11, "rank": 1, "step_time_s": 0.2},
        ]
        coarse = read.rank_metrics(s, "run-a", max_points=50)
        with pytest.raises(ValueError, match="^columns: "):
            read.rank_metrics(s, "run-a", columns=("loss", "nonsense"))
    assert len([p for p in coarse if p["rank"] == 0]) <= 50
    assert {p["rank"] for p in coarse} == {0, 1}
    assert all(p["step_time_s"] == pytest.approx(0.1 * (1 + p["rank"])) for p in coarse)
    assert isinstance(coarse[0]["mem_allocated"], float)


def test_latest_rank_steps_and_heartbeats(run_1000):
    with session_scope(run_1000) as s:
        ingest_events(s, [f.event(EventType.HEARTBEAT, 999, {"state": "running"}, rank=r) for r in range(2)])
        latest = read.latest_rank_steps(s, "run-a")
        beats = read.heartbeats(s, "run-a")
    assert [(r["rank"], r["step"]) for r in latest] == [(0, 999), (1, 999)]
    assert [b["rank"] for b in beats] == [0, 1]


def test_grad_hists_newest_first_at_or_before_a_step(run_1000):
    with session_scope(run_1000) as s:
        assert [h["step"] for h in read.grad_hists(s, "run-a")] == [900]
        assert [h["step"] for h in read.grad_hists(s, "run-a", step=450, limit=2)] == [400, 300]
        h = read.grad_hists(s, "run-a", step=100)[0]
    assert h["layers"]["h.0"]["p99"] == pytest.approx(1e-3 * 101) and h["edges"][0] == 1e-6


def test_runs_list_and_get(engine):
    with session_scope(engine) as s:
        ingest_events(s, [f.step(5, run="old", ts=f.T0), f.step(5, run="new", ts=f.T0 + 10)])
        s.get(Run, "new").controller_state = {"big": list(range(10))}
    with session_scope(engine) as s:
        runs = read.list_runs(s)
        assert [r["id"] for r in runs] == ["new", "old"]
        assert "controller_state" not in runs[0]
        assert read.get_run(s, "new")["controller_state"] == {"big": list(range(10))}
        assert read.get_run(s, "missing") is None


def _decisions(engine):
    with session_scope(engine) as s:
        ingest_events(s, [f.run_started(run="r"), f.run_started(run="other")])
        s.add_all(
            [
                Incident(
                    id="i1",
                    run_id="r",
                    opened_at=10.0,
                    closed_at=20.0,
                    rule="loss_spike",
                    level="critical",
                    spike_step=60,
                    outcome="rolled_back",
                    evidence={"sigmas": 41.0},
                ),
                Incident(id="i2", run_id="r", opened_at=30.0, rule="mfu_low", level="warn", spike_step=90),
                Incident(
                    id="i3", run_id="other", opened_at=5.0, rule="heartbeat", level="warn", spike_step=1
                ),
            ]
        )
        s.flush()
        s.add_all(
            [
                Transition(
                    run_id="r",
                    incident_id="i1",
                    ts=10.0,
                    from_state="running",
                    to_state="pausing",
                    reason="spike",
                ),
                Transition(
                    run_id="r",
                    incident_id="i1",
                    ts=11.0,
                    from_state="pausing",
                    to_state="validating",
                    reason="ok",
                ),
                Transition(
                    run_id="r",
                    incident_id="i2",
                    ts=31.0,
                    from_state="running",
                    to_state="pausing",
                    reason="x",
                ),
                CommandRow(
                    id="c1", run_id="r", incident_id="i1", type="pause", issued_at=10.0, expires_at=70.0
                ),
                CommandRow(
                    id="c2", run_id="r", type="resume", issued_at=40.0, expires_at=100.0, source="operator"
                ),
                Alert(
                    id="a1",
                    run_id="r",
                    incident_id="i1",
                    ts=10.0,
                    level="critical",
                    rule="loss_spike",
                    title="spike",
                ),
                Alert(
                    id="a2", run_id="r", ts=30.0, level="warn", rule="mfu_low", title="slow", suppressed=True
                ),
                OutboxRow(
                    id="o1",
                    kind="alert",
                    target="slack",
                    payload=b"a1",
                    created_at=10.0,
                    next_attempt_at=10.0,
                    status="delivered",
                    attempts=1,
                    delivered_at=10.5,
                ),
                OutboxRow(
                    id="o2",
                    kind="alert",
                    target="pager",
                    payload=b"a1",
                    created_at=10.0,
                    next_attempt_at=15.0,
                    attempts=2,
                    last_error="HTTP 503",
                ),
                OutboxRow(
                    id="o3",
                    kind="command",
                    target="p.commands",
                    key="r",
                    payload=b"{}",
                    created_at=10.0,
                    next_attempt_at=10.0,
                    status="delivered",
                ),
                AuditRow(ts=40.0, actor="alice", action="resume", run_id="r", command_id="c2"),
            ]
        )
        ingest_events(
            s,
            [
                f.checkpoint(40, run="r", kind="full"),
                f.checkpoint(50, run="r", kind="memory", verified=False),
                f.event(
                    EventType.DATA_FLAG, 61, {"sample_ids": [1, 2], "rule": "url_pile", "score": 0.8}, run="r"
                ),
                f.event(
                    EventType.DATA_FLAG,
                    62,
                    {"sample_ids": [3], "rule": "garbled", "score": math.inf},
                    run="r",
                ),
                f.event(EventType.VALIDATION, 61, {"cmd": "c1", "val_loss": 3.9, "batches": 8}, run="r"),
            ],
        )


def test_incidents_transitions_and_commands(engine):
    _decisions(engine)
    with session_scope(engine) as s:
        assert [i["id"] for i in read.incidents(s)] == ["i2", "i1", "i3"]
        assert [i["id"] for i in read.incidents(s, "r", open_only=True)] == ["i2"]
        assert read.incidents(s, "r")[1]["evidence"] == {"sigmas": 41.0}
        assert [t["to_state"] for t in read.transitions(s, "r")] == ["pausing", "validating", "pausing"]
        assert [t["ts"] for t in read.transitions(s, "r", incident_id="i1")] == [10.0, 11.0]
        assert [c["id"] for c in read.commands(s, "r")] == ["c2", "c1"]
        assert [c["id"] for c in read.commands(s, incident_id="i1")] == ["c1"]
        assert read.commands(s, "other") == []


def test_checkpoints_flags_validations_audit(engine):
    _decisions(engine)
    with session_scope(engine) as s:
        assert [(c["step"], c["kind"]) for c in read.checkpoints(s, "r")] == [(50, "memory"), (40, "full")]
        assert [c["step"] for c in read.checkpoints(s, "r", verified_only=True)] == [40]
        flags = read.data_flags(s, "r")
        assert [fl["rule"] for fl in flags] == ["garbled", "url_pile"] and flags[0]["score"] == math.inf
        assert [v["val_loss"] for v in read.validations(s, "r")] == [3.9]
        assert [a["actor"] for a in read.audit_log(s, "r")] == ["alice"]
        assert read.audit_log(s, "other") == []


def test_alerts_carry_their_deliveries_and_outbox_is_summarised(engine):
    _decisions(engine)
    with session_scope(engine) as s:
        alerts = read.alerts(s, "r")
        summary = read.outbox_status(s)
    assert [a["id"] for a in alerts] == ["a2", "a1"]
    assert alerts[0]["deliveries"] == [] and alerts[0]["suppressed"] is True
    assert [(d["target"], d["status"], d["attempts"]) for d in alerts[1]["deliveries"]] == [
        ("pager", "pending", 2),
        ("slack", "delivered", 1),
    ]
    assert alerts[1]["deliveries"][0]["last_error"] == "HTTP 503"
    assert summary == {"alert": {"delivered": 1, "pending": 1}, "command": {"delivered": 1}}


def test_incident_detail_tells_the_whole_story(engine):
    _decisions(engine)
    with session_scope(engine) as s:
        detail = read.incident_detail(s, "i1")
        assert read.incident_detail(s, "nope") is None
    assert (detail["rule"], detail["outcome"]) == ("loss_spike", "rolled_back")
    assert [t["to_state"] for t in detail["transitions"]] == ["pausing", "validating"]
    assert [c["id"] for c in detail["commands"]] == ["c1"]
    assert [v["val_loss"] for v in detail["validations"]] == [3.9]
    assert [a["id"] for a in detail["alerts"]] == ["a1"] and len(detail["alerts"][0]["deliveries"]) == 2
