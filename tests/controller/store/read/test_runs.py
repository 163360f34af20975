"""Runs (list and one) and the newest heartbeat per rank."""

from __future__ import annotations

from cliffguard.controller.store import read
from cliffguard.controller.store.db import session_scope
from cliffguard.controller.store.ingest import ingest_events
from cliffguard.controller.store.models import RunRow
from cliffguard.core.enums import EventType
from testing import store_factory as f


def test_runs_list_and_get(engine):
    with session_scope(engine) as s:
        ingest_events(s, [f.step(5, run="old", ts=f.T0), f.step(5, run="new", ts=f.T0 + 10)])
        s.get(RunRow, "new").controller_state = {"big": list(range(10))}
    with session_scope(engine) as s:
        runs = read.list_runs(s)
        assert [r["id"] for r in runs] == ["new", "old"]
        assert [r["id"] for r in read.list_runs(s, limit=1)] == ["new"]
        assert "controller_state" not in runs[0]
        assert read.get_run(s, "new")["controller_state"] == {"big": list(range(10))}
        assert read.get_run(s, "missing") is None


def test_heartbeats_newest_per_rank(run_1000):
    with session_scope(run_1000) as s:
        ingest_events(s, [f.event(EventType.HEARTBEAT, 999, {"state": "running"}, rank=r) for r in range(2)])
        beats = read.heartbeats(s, "run-a")
    assert [(b["rank"], b["step"], b["state"]) for b in beats] == [(0, 999, "running"), (1, 999, "running")]
