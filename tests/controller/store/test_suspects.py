"""The suspect-node store (controller/store/suspects.py, read/suspects.py) and the controller's edge
to it (controller/suspects.py through controller/batch.py), on SQLite and PostgreSQL: an evicted
node is recorded with its run, incident and why; its beat in a later run is not admitted; a clear is
audited; a recheck admits it on probation and a passing node check clears it."""

from __future__ import annotations

from sqlalchemy import select

from cliffguard.controller.alerts import AlertsConfig
from cliffguard.controller.batch import BatchContext, BatchProcessor
from cliffguard.controller.edge_classify import EdgeBatch, EdgeRecord
from cliffguard.controller.recovery_types import RecoveryConfig
from cliffguard.controller.runstate import RunTable, default_detector_factory
from cliffguard.controller.store import read
from cliffguard.controller.store.db import session_scope
from cliffguard.controller.store.models import AuditRow, CommandRow, IncidentRow, RunRow
from cliffguard.controller.store.suspects import ask_recheck, clear_suspect, record_suspect, standing
from cliffguard.core.enums import EventType
from cliffguard.core.events import Event, make_event
from cliffguard.core.signing import Secret
from testing import store_factory as f

T0 = 1_700_000_000.0


def test_a_record_refuses_the_node_until_cleared_and_the_clear_is_audited(engine):
    with session_scope(engine) as s:
        record_suspect(s, node="node-b", cause="bad_rank", reason="rank 1 bad", run_id="run-a", incident_id="i1", at=T0)
        record_suspect(s, node="node-c", cause="hang_again", reason="hung twice", run_id="run-a", incident_id=None,
                       at=T0 + 1)
    with session_scope(engine) as s:
        st = standing(s)
        assert st["node-b"].refused and st["node-b"].open is not None and st["node-b"].open.incident_id == "i1"
        assert [r["node"] for r in read.suspect_nodes(s)] == ["node-c", "node-b"]  # newest first
        assert clear_suspect(s, "node-b", by="alice", reason="reseated the GPU", now=T0 + 5) == 1
        assert clear_suspect(s, "node-b", by="alice", reason="again", now=T0 + 6) == 0  # nothing open: no audit row
    with session_scope(engine) as s:
        st = standing(s)
        assert not st["node-b"].refused and st["node-b"].open is None  # a record still (evicted sooner)
        assert [r["node"] for r in read.suspect_nodes(s)] == ["node-c"]
        (row,) = [r for r in read.suspect_nodes(s, cleared=True) if r["node"] == "node-b"]
        assert (row["cleared_by"], row["clear_reason"], row["cleared_at"], row["records"]) == (
            "alice", "reseated the GPU", T0 + 5, 1)
        (audit,) = s.scalars(select(AuditRow)).all()
        assert (audit.actor, audit.action, audit.detail["node"]) == ("alice", "nodes.clear", "node-b")


def test_a_device_record_gives_the_node_a_record_but_admits_it(engine):
    with session_scope(engine) as s:
        record_suspect(s, node="node-d", cause="sdc", reason="rank 1 diverged again", run_id="run-a",
                       incident_id="i2", at=T0, device=1)
    with session_scope(engine) as s:
        st = standing(s)
        assert "node-d" in st and not st["node-d"].refused and st["node-d"].open is None
        (row,) = read.suspect_nodes(s)
        assert (row["node"], row["device"], row["cause"]) == ("node-d", 1, "sdc")
        record_suspect(s, node="node-d", cause="hang_again", reason="hung twice", run_id="run-a", incident_id=None,
                       at=T0 + 1)  # a node-level record refuses it, the device record notwithstanding
    with session_scope(engine) as s:
        assert standing(s)["node-d"].refused


def test_a_nodes_open_device_records_are_its_standings_devices_until_cleared(engine):
    from cliffguard.controller.admission import entry_of

    with session_scope(engine) as s:
        for at, slot, cause in ((T0, 3, "sdc"), (T0 + 1, 1, "bad_rank"), (T0 + 2, 3, "sdc_again_device")):
            record_suspect(s, node="node-d", cause=cause, reason="r", run_id="run-a", incident_id="i", at=at,
                           device=slot)
    with session_scope(engine) as s:
        d = standing(s)["node-d"]
        assert not d.refused and [(r.device, r.cause) for r in d.devices] == [(1, "bad_rank"), (3, "sdc_again_device")]
        entry = entry_of(d, at=T0 + 5)  # what the suspect-node list carries: admitted, without slots 1 and 3
        assert entry["state"] == "cleared" and [x["slot"] for x in entry["devices"]] == [1, 3]
        assert clear_suspect(s, "node-d", by="alice", reason="reseated", now=T0 + 10) == 3
    with session_scope(engine) as s:
        d = standing(s)["node-d"]
        assert d.devices == () and "devices" not in entry_of(d, at=T0 + 11)


def test_a_recheck_admits_the_node_on_probation_until_it_is_evicted_again(engine):
    with session_scope(engine) as s:
        record_suspect(s, node="node-b", cause="bad_rank", reason="bad", run_id="run-a", incident_id=None, at=T0)
        assert ask_recheck(s, "node-z", by="bob", now=T0 + 1) == 0  # not suspect: nothing done
        assert ask_recheck(s, "node-b", by="bob", now=T0 + 2) == 1
    with session_scope(engine) as s:
        b = standing(s)["node-b"]
        assert b.recheck and not b.refused
        assert [a.action for a in s.scalars(select(AuditRow))] == ["nodes.recheck"]
        record_suspect(s, node="node-b", cause="node_check_failed", reason="slow", run_id="run-c", incident_id=None,
                       at=T0 + 3)
    with session_scope(engine) as s:
        b = standing(s)["node-b"]
        assert b.refused and b.open is not None and b.open.cause == "node_check_failed"
        assert {r["records"] for r in read.suspect_nodes(s)} == {2}


def _ctx() -> BatchContext:
    return BatchContext(group_id="g", commands_topic="cmds", secret=Secret("test-secret-of-enough-length"),
                        recovery=RecoveryConfig(), alerts=AlertsConfig())


def _feed(engine, proc: BatchProcessor, events: list[Event], now: float) -> None:
    with session_scope(engine) as s:
        for run in {e.run for e in events}:
            if s.get(RunRow, run) is None:
                s.add(RunRow(id=run))
        s.flush()
        proc.process(s, EdgeBatch(records=[EdgeRecord("events", 0, i, e) for i, e in enumerate(events)]), now=now)


def _torchrun(run: str, *, life: int = 0, nodes: int = 3) -> Event:
    return f.run_started(run, ts=T0, world=4, life=life, max_restarts=3, restarts_left=3, nodes=nodes, min_nodes=1)


def _triaged(run: str, cls: str, node: str, count: int = 0) -> Event:
    return make_event(EventType.STEP_TRIAGED, run, 31, {
        "class": cls, "remedy": "suspect_rank" if cls == "bad_rank" else "retry_step", "rank": 1, "node": node,
        "reason": "rank 1 is bad whatever shard it gets", "reruns": 2, "rerun_s": 0.05, "evidence": {},
        "sample_ids": [], "update_applied": cls == "transient", "bad_batches": 0, "transient_counts": {"1": count}},
        world=4, ts=T0 + 31)


def _beat(run: str, node: str, life: int = 0) -> Event:
    return make_event(EventType.HEARTBEAT, run, 5, {"state": "running", "ranks": [2, 3], "steps": [5, 5],
                                                   "ages_s": [0.1, 0.1], "collectives": ["", ""], "node": node,
                                                   "life": life}, rank=2, world=4, ts=T0 + 40)


def _restarts(engine, run: str) -> list[dict]:
    with session_scope(engine) as s:
        return [c.args for c in s.scalars(select(CommandRow).where(CommandRow.run_id == run, CommandRow.type == "restart"))]


def test_an_evicted_node_is_recorded_and_not_admitted_to_a_later_run(engine):
    proc = BatchProcessor(_ctx(), RunTable(default_detector_factory()))
    _feed(engine, proc, [_torchrun("run-a"), *(f.step(i, run="run-a", world=4, ts=T0 + i) for i in range(5)),
                         _triaged("run-a", "bad_rank", "node-b")], now=T0 + 32)
    with session_scope(engine) as s:
        (rec,) = read.suspect_nodes(s)
        inc = s.get(IncidentRow, rec["incident_id"])
        assert (rec["node"], rec["cause"], rec["run_id"], inc.rule) == ("node-b", "bad_rank", "run-a", "bad_rank")
        assert "rank 1 is bad" in rec["reason"]
    assert [a["exclude_nodes"] for a in _restarts(engine, "run-a")] == [["node-b"]]
    _feed(engine, proc, [_torchrun("run-b"), *(f.step(i, run="run-b", world=4, ts=T0 + i) for i in range(5)),
                         _beat("run-b", "node-a"), _beat("run-b", "node-b")], now=T0 + 41)
    (cmd,) = _restarts(engine, "run-b")
    assert cmd["mode"] == "exclude" and cmd["exclude_nodes"] == ["node-b"] and "not admitted" in cmd["reason"]
    with session_scope(engine) as s:
        (inc,) = s.scalars(select(IncidentRow).where(IncidentRow.run_id == "run-b")).all()
        assert inc.rule == "suspect_node" and inc.evidence["record"]["run"] == "run-a"
        assert len(read.suspect_nodes(s)) == 1  # a refusal is no second record


def test_a_rechecked_node_joins_on_probation_and_a_passing_check_clears_it(engine):
    with session_scope(engine) as s:
        record_suspect(s, node="node-b", cause="bad_rank", reason="bad", run_id="run-a", incident_id=None, at=T0)
        ask_recheck(s, "node-b", by="bob", now=T0 + 1)
    proc = BatchProcessor(_ctx(), RunTable(default_detector_factory()))
    check = make_event(EventType.NODE_CHECK, "run-c", 0, {
        "ok": True, "life": 1, "ranks": [0, 1, 2, 3], "nodes": ["node-a", "node-a", "node-b", "node-b"],
        "matmul_s": [0.01] * 4, "rounds": [], "slow": [], "slow_nodes": [], "seconds": 1.0,
        "detail": "4 ranks, 2 rounds: every pair and matmul within x3"}, world=4, ts=T0 + 50)
    _feed(engine, proc, [_torchrun("run-c", life=1), _beat("run-c", "node-b", life=1), check], now=T0 + 51)
    assert _restarts(engine, "run-c") == []  # on probation: admitted
    with session_scope(engine) as s:
        assert read.suspect_nodes(s) == []
        (row,) = read.suspect_nodes(s, cleared=True)
        assert row["cleared_by"] == "node check" and "every pair" in row["clear_reason"]
        assert [(a.action, a.actor, a.run_id) for a in s.scalars(select(AuditRow).order_by(AuditRow.ts))] == [
            ("nodes.recheck", "bob", None), ("nodes.clear", "node check", "run-c")]


def test_a_node_with_a_record_is_evicted_at_its_first_transient(engine):
    with session_scope(engine) as s:
        record_suspect(s, node="node-c", cause="transient", reason="flaky", run_id="run-0", incident_id=None, at=T0)
        clear_suspect(s, "node-c", by="alice", reason="swapped", now=T0 + 1)
    proc = BatchProcessor(_ctx(), RunTable(default_detector_factory()))
    _feed(engine, proc, [_torchrun("run-d"), *(f.step(i, run="run-d", world=4, ts=T0 + i) for i in range(5)),
                         _triaged("run-d", "transient", "node-c", count=1), _triaged("run-d", "transient", "node-x", 1)],
          now=T0 + 32)
    assert [a["exclude_nodes"] for a in _restarts(engine, "run-d")] == [["node-c"]]  # node-x: budget 3, cured
