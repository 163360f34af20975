"""Stores for the read API's tests, filled through the real write paths (SQLite and PostgreSQL
through the ``engine`` fixture of tests/controller/store/conftest.py)."""

from __future__ import annotations

import math

import pytest

from cliffguard.controller.store.db import session_scope
from cliffguard.controller.store.ingest import ingest_events
from cliffguard.controller.store.models import (
    AlertRow,
    AuditRow,
    CommandRow,
    IncidentRow,
    OutboxRow,
    TransitionRow,
)
from cliffguard.core.enums import EventType
from testing import store_factory as f


def loss_at(step: int) -> float:
    return 2.0 + 1.0 / (1 + step) + (5.0 if step == 437 else 0.0)  # one spike at step 437


@pytest.fixture
def run_1000(engine):
    """run-a: 1000 steps on 2 ranks (rank 1 twice as slow), histograms every 100 steps."""
    events = [f.run_started()]
    for i in range(1000):
        events += [f.step(i, loss_at(i), rank=r, step_time_s=0.1 * (1 + r)) for r in range(2)]
        if i % 100 == 0:
            events.append(f.grad_hist(i, p99=1e-3 * (1 + i)))
    with session_scope(engine) as s:
        ingest_events(s, events)
    return engine


@pytest.fixture
def decisions(engine):
    """Runs r and other: incidents, transitions, commands, alerts with outbox rows, checkpoints,
    data flags, a validation and an audit row."""
    with session_scope(engine) as s:
        ingest_events(s, [f.run_started(run="r"), f.run_started(run="other")])
        s.add_all(
            [
                IncidentRow(
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
                IncidentRow(id="i2", run_id="r", opened_at=30.0, rule="mfu_low", level="warn", spike_step=90),
                IncidentRow(
                    id="i3", run_id="other", opened_at=5.0, rule="heartbeat", level="warn", spike_step=1
                ),
            ]
        )
        s.flush()
        s.add_all(
            [
                TransitionRow(
                    run_id="r",
                    incident_id="i1",
                    ts=10.0,
                    from_state="running",
                    to_state="pausing",
                    reason="spike",
                ),
                TransitionRow(
                    run_id="r",
                    incident_id="i1",
                    ts=11.0,
                    from_state="pausing",
                    to_state="validating",
                    reason="ok",
                ),
                TransitionRow(
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
                AlertRow(
                    id="a1",
                    run_id="r",
                    incident_id="i1",
                    ts=10.0,
                    level="critical",
                    rule="loss_spike",
                    title="spike",
                ),
                AlertRow(
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
    return engine
