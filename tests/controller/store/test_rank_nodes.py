"""The stored rank -> node map (controller/store/rank_nodes.py, written by controller/batch.py), on
SQLite and PostgreSQL: a run's mapping is written when it changes, not per beat, and a controller
that starts again loads it, so an SDC verdict right after the restart still names the rank's node
and its device slot."""

from __future__ import annotations

from sqlalchemy import select

from cliffguard.controller.alerts import AlertsConfig
from cliffguard.controller.batch import BatchContext, BatchProcessor
from cliffguard.controller.edge_classify import EdgeBatch, EdgeRecord
from cliffguard.controller.rank_nodes import RankNodes
from cliffguard.controller.recovery_types import RecoveryConfig, VerdictIn
from cliffguard.controller.rules.sdc import SDC
from cliffguard.controller.runstate import RunTable, default_detector_factory
from cliffguard.controller.store.db import session_scope
from cliffguard.controller.store.models import RankNodeRow, RunRow
from cliffguard.controller.store.rank_nodes import load_rank_nodes, save_rank_nodes
from cliffguard.controller.verdict import Level, Verdict
from cliffguard.core.enums import EventType
from cliffguard.core.events import Event, make_event
from cliffguard.core.signing import Secret

T0 = 1_700_000_000.0


def _processor() -> BatchProcessor:
    ctx = BatchContext(group_id="g", commands_topic="cmds", secret=Secret("test-secret-of-enough-length"),
                       recovery=RecoveryConfig(), alerts=AlertsConfig())
    return BatchProcessor(ctx, RunTable(default_detector_factory()))


def _beat(run: str, node: str, ranks: list[int], life: int, ts: float) -> Event:
    n = len(ranks)
    return make_event(EventType.HEARTBEAT, run, 5, {"state": "running", "ranks": ranks, "steps": [5] * n,
                                                   "ages_s": [0.1] * n, "collectives": [""] * n, "node": node,
                                                   "life": life}, rank=ranks[0], world=4, ts=ts)


def _feed(engine, proc: BatchProcessor, events: list[Event], now: float) -> None:
    with session_scope(engine) as s:
        for run in {e.run for e in events}:
            if s.get(RunRow, run) is None:
                s.add(RunRow(id=run))
        s.flush()
        proc.process(s, EdgeBatch(records=[EdgeRecord("events", 0, i, e) for i, e in enumerate(events)]), now=now)
    proc.rank_nodes.saved()  # what the service does once the batch committed


def _rows(engine) -> list[tuple]:
    with session_scope(engine) as s:
        return [(r.run_id, r.rank, r.node, r.life, r.updated_at)
                for r in s.scalars(select(RankNodeRow).order_by(RankNodeRow.run_id, RankNodeRow.rank))]


def test_the_map_is_written_when_it_changes_and_a_restarted_controller_names_the_node(engine):
    proc = _processor()
    beats = [_beat("run-a", "node-a", [0, 1], 0, T0), _beat("run-a", "node-b", [2, 3], 0, T0)]
    _feed(engine, proc, beats, now=T0 + 1)
    first = _rows(engine)
    assert [(r[1], r[2], r[3], r[4]) for r in first] == [(0, "node-a", 0, T0 + 1), (1, "node-a", 0, T0 + 1),
                                                         (2, "node-b", 0, T0 + 1), (3, "node-b", 0, T0 + 1)]
    for i in range(3):  # the same beats again and again: not written again
        _feed(engine, proc, [_beat("run-a", "node-a", [0, 1], 0, T0 + 5 + i),
                             _beat("run-a", "node-b", [2, 3], 0, T0 + 5 + i)], now=T0 + 10 + i)
    assert _rows(engine) == first
    _feed(engine, proc, [_beat("run-a", "node-c", [2, 3], 1, T0 + 20)], now=T0 + 21)  # a new life, rank 2 moved
    assert {(r[1], r[2], r[3]) for r in _rows(engine)} == {(0, "node-a", 0), (1, "node-a", 0), (2, "node-c", 1),
                                                           (3, "node-c", 1)}

    restarted = RankNodes()  # a controller that starts again: no beat seen yet
    with session_scope(engine) as s:
        restarted.load(load_rank_nodes(s, restarted.runs_kept))
    v = Verdict(rule=SDC, level=Level.CRITICAL, step=40, message="rank 2 disagrees", rank=2)
    named = restarted.annotate("run-a", VerdictIn(verdict=v, now=T0 + 30))
    assert (named.verdict.evidence["node"], named.verdict.evidence["node_life"]) == ("node-c", 1)
    # and its device: a device-level eviction right after the restart leaves one device out, not the node
    assert (named.verdict.evidence["device"], named.verdict.evidence["node_devices"]) == (0, 2)
    assert restarted.unsaved() == {}  # loaded: nothing to write back


def test_load_keeps_the_newest_runs_and_a_run_deleted_takes_its_map_along(engine):
    with session_scope(engine) as s:
        for i, run in enumerate(["r1", "r2", "r3"]):
            s.add(RunRow(id=run))
            s.flush()
            save_rank_nodes(s, run, {0: (f"n{i}", None, i, 3) if i else (f"n{i}", None, None, None)}, now=T0 + i)
    with session_scope(engine) as s:
        assert load_rank_nodes(s, 2) == {"r2": {0: ("n1", None, 1, 3)}, "r3": {0: ("n2", None, 2, 3)}}
        assert load_rank_nodes(s, 5)["r1"] == {0: ("n0", None, None, None)}  # a beat that named no slot
        assert list(load_rank_nodes(s, 5)) == ["r1", "r2", "r3"]  # oldest first
        save_rank_nodes(s, "r1", {}, now=T0 + 9)  # an empty map: no rows
    with session_scope(engine) as s:
        assert list(load_rank_nodes(s, 5)) == ["r2", "r3"]
        s.delete(s.get(RunRow, "r2"))
    with session_scope(engine) as s:
        assert list(load_rank_nodes(s, 5)) == ["r3"]
