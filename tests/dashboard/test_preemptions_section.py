"""The preemptions section: absent for a run never preempted; for one that was, each preemption
with its save against the grace time, the steps lost and the time until training again."""

from __future__ import annotations

import pytest

from cliffguard.controller.store.db import session_scope
from cliffguard.controller.store.models import IncidentRow, TransitionRow
from tests.dashboard.conftest import run_app, texts

pytestmark = pytest.mark.timeout(180)


def test_no_section_for_a_run_never_preempted(filled):
    assert "Preemptions" not in texts(run_app())


def test_section_lists_each_preemption_with_its_save_and_its_cost(filled):
    run = filled.run.run_id
    with session_scope(filled.engine) as s:
        for i, (save_s, closed) in enumerate([(3.0, True), (12.0, False)]):
            inc = f"p{i}".ljust(32, "0")
            s.add(IncidentRow(id=inc, run_id=run, opened_at=2e9 + 100 * i, closed_at=2e9 + 100 * i + 50 if closed else None,
                              rule="preemption", level="ok", spike_step=40 + i, onset_step=40 + i,
                              outcome="requeued" if closed else "open",
                              evidence={"signal": "SIGTERM", "deadline_s": 30.0, "save_s": save_s, "verified": True,
                                        "saved_step": 40 + i}))
            s.flush()
            if closed:
                s.add(TransitionRow(run_id=run, incident_id=inc, ts=2e9 + 50, step=40, from_state="preempted",
                                    to_state="running", reason="training again",
                                    evidence={"steps_lost": 0, "seconds_to_train": 47.5}))
    text = texts(run_app())
    assert "Preemptions" in text
    assert "2 preemption(s) · the slowest save took 40 % of its grace time · down now" in text
    at = run_app()
    table = next(d.value for d in at.dataframe if "seconds_to_train" in d.value.columns)
    assert list(table["outcome"]) == ["open", "requeued"]  # newest first
    assert table["seconds_to_train"].iloc[1] == 47.5 and table["save_s"].iloc[0] == 12.0
