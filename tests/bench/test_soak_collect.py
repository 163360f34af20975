"""What the soak reads from the store: a hang incident's first rank report on the trainer's clock
(which the unexplained-incident check matches to a stopped rank), and none for other incidents."""

from __future__ import annotations

from bench.soak.collect import store_facts
from cliffguard.controller.store.db import init_db, make_engine, session_scope
from cliffguard.controller.store.ingest import ingest_events
from cliffguard.controller.store.models import IncidentRow
from testing import store_factory as f

T0 = f.T0


def test_a_hang_incident_carries_its_first_reports_time_and_others_none(tmp_path):
    engine = make_engine(f"sqlite:///{tmp_path / 'store.db'}")
    init_db(engine)
    with session_scope(engine) as s:
        ingest_events(s, [f.run_started(world=2)])
        s.add(IncidentRow(id="hang-1", run_id="run-a", opened_at=T0 + 65, rule="hang", level="critical",
                          spike_step=27, onset_step=27, outcome="resumed",
                          evidence={"cause": "hang", "first_report_ts": T0 + 10}))
        s.add(IncidentRow(id="spike-1", run_id="run-a", opened_at=T0 + 5, rule="loss_spike", level="critical",
                          spike_step=3, onset_step=3, outcome="resumed", evidence={"first_report_ts": "soon"}))
    facts = store_facts(engine, "run-a")
    engine.dispose()
    by_id = {i["id"]: i for i in facts["incidents"]}
    assert by_id["hang-1"]["first_report_ts"] == T0 + 10 and by_id["hang-1"]["opened_at"] == T0 + 65
    assert by_id["spike-1"]["first_report_ts"] is None  # not a number: not trusted
