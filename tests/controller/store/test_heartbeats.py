"""Heartbeats in the store (controller/store/heartbeats.py): one row per node, newest wins,
expanded per rank for readers; the liveness summary (controller/store/read/runs.py)."""

from __future__ import annotations

from sqlalchemy import func, select

from cliffguard.controller.store import read
from cliffguard.controller.store.db import session_scope
from cliffguard.controller.store.heartbeats import upsert_heartbeats
from cliffguard.controller.store.ingest import ingest_events
from cliffguard.controller.store.models import HeartbeatRow
from cliffguard.core.enums import EventType
from testing import store_factory as f


def _node_beat(leader: int, size: int, ts: float, step: int, *, stuck: int | None = None):
    ranks = list(range(leader, leader + size))
    data = {"state": "running", "ranks": ranks, "steps": [step - (r == stuck) for r in ranks],
            "ages_s": [30.0 if r == stuck else 0.0 for r in ranks],
            "collectives": ["" if r == stuck else "all_reduce" for r in ranks]}
    return f.event(EventType.HEARTBEAT, step, data, rank=leader, world=64, ts=ts)


def test_a_node_heartbeat_is_one_row_and_the_newest_wins(engine):
    beats = [_node_beat(n * 8, 8, f.T0 + n, 10) for n in range(8)]
    with session_scope(engine) as s:
        assert ingest_events(s, [f.step(10, 2.5, world=64), *beats]) == 1 + 8
    with session_scope(engine) as s:
        assert s.scalar(select(func.count()).select_from(HeartbeatRow)) == 8  # 64 ranks, 8 rows
        older = _node_beat(8, 8, f.T0 - 5, 9)
        assert upsert_heartbeats(s, [older, beats[1]]) == 0  # older and a re-delivery: nothing moves
        assert upsert_heartbeats(s, [_node_beat(8, 8, f.T0 + 20, 11, stuck=13)]) == 1
    with session_scope(engine) as s:
        per_rank = read.heartbeats(s, "run-a")
        assert len(per_rank) == 64 and [b["rank"] for b in per_rank] == list(range(64))
        assert per_rank[13] | {} == {"run_id": "run-a", "rank": 13, "ts": f.T0 - 10, "step": 10, "state": "running",
                                     "collective": "", "via": 8}
        assert per_rank[12]["step"] == 11 and per_rank[12]["collective"] == "all_reduce"
        live = read.liveness(s, "run-a", now=f.T0 + 31)
    assert live["ranks"] == 64 and live["silent"] == "0-7, 13"  # node 0 beat at T0, rank 13 was last alive at T0 - 10
    assert (live["lowest_step"], live["highest_step"]) == (10, 11) and live["lowest_ranks"] == "0-7, 13, 16-63"
    assert live["in_collective"] == {"all_reduce": 63} and live["states"] == ["running"]


def test_a_rank_beating_for_itself_and_its_node_row_merge_newest_first(engine):
    with session_scope(engine) as s:
        ingest_events(s, [_node_beat(0, 4, f.T0, 10),
                          f.event(EventType.HEARTBEAT, 12, {"state": "paused"}, rank=2, world=64, ts=f.T0 + 3)])
    with session_scope(engine) as s:
        beats = read.heartbeats(s, "run-a")
        assert [(b["rank"], b["step"], b["state"], b["via"]) for b in beats] == [
            (0, 10, "running", 0), (1, 10, "running", 0), (2, 12, "paused", 2), (3, 10, "running", 0)]
        assert read.liveness(s, "other", now=f.T0) == {"ranks": 0}
