"""The hangs section: absent for a run that never hung; for one that did, the culprit, the
collective and the frame, the sequence table, each rank's stacks and the node check."""

from __future__ import annotations

import pytest

from cliffguard.controller.store.db import session_scope
from cliffguard.controller.store.ingest import ingest_events
from cliffguard.controller.store.models import IncidentRow
from cliffguard.core.enums import EventType
from cliffguard.core.events import make_event
from cliffguard.dashboard.sections.hangs import stack_text
from tests.controller.test_rules_hang import report
from tests.core.test_events import PAYLOADS
from tests.dashboard.conftest import run_app, texts

pytestmark = pytest.mark.timeout(180)


def test_no_section_for_a_run_that_never_hung(filled):
    assert "Hangs" not in texts(run_app())


def test_a_hang_shows_its_culprit_the_table_and_every_ranks_stacks(filled):
    run = filled.run.run_id
    evs = [make_event(EventType.HANG_EVIDENCE, run, 27, e.data, rank=e.rank, world=4, ts=2e9 + e.rank)
           for e in (report(0, 0), report(1, 0), report(2, 0),
                     report(3, 0, seq=59, done=59, frame="trainer/hang_faults.py:124 in hang"))]
    check = make_event(EventType.NODE_CHECK, run, 25, {**PAYLOADS[EventType.NODE_CHECK], "ok": True, "slow": [],
                                                       "slow_nodes": [], "life": 1, "detail": "every pair within x3"},
                       world=4, ts=2e9 + 30)
    table = [{"rank": r, "node": "a", "verdict": "culprit" if r == 3 else "waits", "reason": "stalled",
              "enqueued": 59 if r == 3 else 60, "completed": 59, "in_flight": "" if r == 3 else "#60 gloo:all_reduce",
              "frame": "f", "stalled_s": 8.0} for r in range(4)]
    with session_scope(filled.engine) as s:
        ingest_events(s, [*evs, check])
        s.add(IncidentRow(id="hang-1", run_id=run, opened_at=2e9 + 5, closed_at=2e9 + 40, rule="hang", level="critical",
                          spike_step=27, onset_step=27, outcome="restarted",
                          evidence={"cause": "hang", "culprit": [3], "kind": "outside_collective", "life": 0,
                                    "first_report_ts": 2e9, "frame": "trainer/hang_faults.py:124 in hang",
                                    "nodes": ["b"], "collective": "gloo:all_reduce (backward)", "table": table}))
    at = run_app()
    text = texts(at)
    assert "Hangs" in text
    assert "life 0: culprit rank 3 on node b (outside_collective) · gloo:all_reduce (backward) · restarted" in text
    assert "stuck in `trainer/hang_faults.py:124 in hang`" in text
    assert "node check of life 1: passed" in text
    shown = next(d.value for d in at.dataframe if "verdict" in d.value.columns)
    assert list(shown["verdict"]) == ["waits", "waits", "waits", "culprit"] and list(shown["enqueued"]) == [60, 60, 60, 59]
    labels = [e.label for e in at.expander]
    assert [label.split(" · ")[0] for label in labels if label.startswith("rank ")] == ["rank 0", "rank 1", "rank 2", "rank 3"]
    assert any("trainer/hang_faults.py:124 in hang" in c.value for c in at.code)


def test_a_ranks_stack_reads_innermost_last_with_the_training_thread_marked():
    rep = {"data": {"stacks": [{"name": "MainThread", "main": True, "frames": ["a.py:1 in f", "b.py:2 in g"]},
                               {"name": "cliffguard-heartbeat-r0", "main": False, "frames": ["h.py:3 in beat"]}]}}
    assert stack_text(rep).splitlines() == ["--- MainThread (training thread)", "a.py:1 in f", "b.py:2 in g",
                                            "--- cliffguard-heartbeat-r0", "h.py:3 in beat"]
