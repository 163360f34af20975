"""The run's evidence (migration 0013): hang reports and node checks stored once each, read back
as sent, and a hang incident's own evidence gathered by its life and time."""

from __future__ import annotations

from cliffguard.controller.store import read
from cliffguard.controller.store.db import session_scope
from cliffguard.controller.store.ingest import ingest_events
from cliffguard.controller.store.models import IncidentRow
from cliffguard.core.enums import EventType
from testing import store_factory as f
from tests.core.test_events import PAYLOADS

T0 = f.T0


def report(rank: int, ts: float, reason: str = "stalled", life: int = 0):
    data = {**PAYLOADS[EventType.HANG_EVIDENCE], "reason": reason, "life": life, "node": "a" if rank < 2 else "b"}
    return f.event(EventType.HANG_EVIDENCE, 27, data, rank=rank, world=4, ts=ts)


def test_reports_and_checks_are_stored_once_and_read_back_as_sent(engine):
    evs = [report(r, T0 + 10 + r) for r in range(4)]
    check = f.event(EventType.NODE_CHECK, 25, PAYLOADS[EventType.NODE_CHECK], world=4, ts=T0 + 40)
    with session_scope(engine) as s:
        assert ingest_events(s, [f.run_started(world=4), *evs, check]) >= 5
    with session_scope(engine) as s:
        assert ingest_events(s, [*evs, check]) == 0  # a re-delivery
    with session_scope(engine) as s:
        rows = read.evidence(s, "run-a", kind="hang.evidence")
        assert [(r["rank"], r["reason"], r["node"], r["life"]) for r in rows] == [
            (0, "stalled", "a", 0), (1, "stalled", "a", 0), (2, "stalled", "b", 0), (3, "stalled", "b", 0)]
        assert rows[0]["data"]["stacks"][0]["frame"] == "x.py:1 in f"
        assert rows[0]["data"]["pg_status"] == {"0": {"enqueued": 41, "started": -1, "completed": 40}}
        (c,) = read.evidence(s, "run-a", kind="node.check")
        assert (c["reason"], c["life"], c["data"]["slow"]) == ("failed", 1, [2])
        assert [r["rank"] for r in read.evidence(s, "run-a", since=T0 + 12, until=T0 + 13)] == [2, 3]
        assert read.evidence(s, "run-a", life=5) == [] and read.evidence(s, "other") == []


def test_a_hang_incidents_evidence_is_its_lifes_reports_one_per_rank_and_its_checks(engine):
    later_life = report(0, T0 + 100, life=1)
    with session_scope(engine) as s:
        ingest_events(s, [f.run_started(world=4), report(0, T0 + 10), report(0, T0 + 12, reason="collective_error"),
                          report(1, T0 + 10, reason="resolved"), report(3, T0 + 11), later_life,
                          f.event(EventType.NODE_CHECK, 25, PAYLOADS[EventType.NODE_CHECK], world=4, ts=T0 + 40)])
        s.add(IncidentRow(id="inc-1", run_id="run-a", opened_at=T0 + 14, closed_at=T0 + 60, rule="hang", level="critical",
                          spike_step=27, onset_step=27, outcome="restarted",
                          evidence={"cause": "hang", "culprit": [3], "kind": "outside_collective", "life": 0,
                                    "first_report_ts": T0 + 10, "frame": "faults.py:1 in hang", "nodes": ["b"],
                                    "collective": "gloo:all_reduce", "table": [{"rank": 3, "verdict": "culprit"}]}))
        s.add(IncidentRow(id="inc-2", run_id="run-a", opened_at=T0 + 5, rule="loss_spike", level="critical",
                          spike_step=3, onset_step=3, outcome="resumed", evidence={}))
    with session_scope(engine) as s:
        h = read.hang_evidence(s, "inc-1")
        assert (h["culprit"], h["kind"], h["frame"], h["life"], h["nodes"]) == ([3], "outside_collective",
                                                                              "faults.py:1 in hang", 0, ["b"])
        assert [(r["rank"], r["reason"]) for r in h["reports"]] == [(0, "stalled"), (3, "stalled")]  # first per rank
        assert [c["reason"] for c in h["checks"]] == ["failed"] and h["table"] == [{"rank": 3, "verdict": "culprit"}]
        assert read.hang_evidence(s, "inc-2") is None and read.hang_evidence(s, "nope") is None


def test_triage_verdicts_are_stored_and_badbatches_lists_the_data_ones(engine, capsys):
    from cliffguard.cli import main

    data = PAYLOADS[EventType.STEP_TRIAGED]
    transient = {**data, "class": "transient", "remedy": "retry_step", "sample_ids": [], "update_applied": True}
    del transient["rank"]
    with session_scope(engine) as s:
        ingest_events(s, [f.run_started(world=4), f.event(EventType.STEP_TRIAGED, 40, data, world=4, ts=T0 + 10),
                          f.event(EventType.STEP_TRIAGED, 55, transient, world=4, ts=T0 + 20)])
    with session_scope(engine) as s:
        rows = read.evidence(s, "run-a", kind="step.triaged")
        assert [(r["step"], r["reason"], r["node"], r["rank"]) for r in rows] == [
            (40, "data", "skip_batch", 2), (55, "transient", "retry_step", -1)]
    url = engine.url.render_as_string(hide_password=False)
    assert main(["badbatches", "run-a", "--db", url, "--json"]) == 0
    out = capsys.readouterr().out
    import json

    (entry,) = json.loads(out)["bad_batches"]
    assert (entry["step"], entry["rank"], entry["sample_ids"]) == (40, 2, [40, 41])
    assert main(["badbatches", "run-a", "--db", url]) == 0
    assert "step      40  rank 2   2 samples: [40, 41]" in capsys.readouterr().out
    assert main(["badbatches", "nope", "--db", url]) == 1
