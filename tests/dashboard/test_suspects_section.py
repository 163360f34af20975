"""The suspect-nodes section: absent while no node is suspect; otherwise every node not admitted,
why and since when, said as a warning, with the ones on probation and those this run evicted."""

from __future__ import annotations

import pytest

from cliffguard.controller.store.db import session_scope
from cliffguard.controller.store.suspects import ask_recheck, clear_suspect, record_suspect
from tests.dashboard.conftest import run_app, texts

pytestmark = pytest.mark.timeout(180)


def test_no_section_while_no_node_is_suspect(filled):
    with session_scope(filled.engine) as s:  # a cleared record is history, not a suspect
        record_suspect(s, node="gpu-01", cause="bad_rank", reason="bad", run_id="other", incident_id=None, at=2e9)
        clear_suspect(s, "gpu-01", by="alice", reason="replaced", now=2e9 + 1)
    assert "Suspect nodes" not in texts(run_app())


def test_section_lists_each_suspect_node_with_why_and_what_is_on_probation(filled):
    run = filled.run.run_id
    with session_scope(filled.engine) as s:
        record_suspect(s, node="gpu-07", cause="bad_rank", reason="rank 5 is bad whatever shard it gets", run_id=run,
                       incident_id=None, at=2e9)
        record_suspect(s, node="gpu-09", cause="hang_again", reason="hung twice", run_id="other", incident_id=None,
                       at=2e9 + 10)
        ask_recheck(s, "gpu-09", by="bob", now=2e9 + 20)
    at = run_app()
    text = texts(at)
    assert "Suspect nodes" in text
    assert ("1 node(s) not admitted to any run until cleared (`cliffguard nodes clear NODE --reason ...`) · "
            "1 on probation until a node check passes · 1 evicted from this run") in text
    table = next(d.value for d in at.dataframe if "cause" in d.value.columns)
    assert list(table["node"]) == ["gpu-09", "gpu-07"]  # newest first
    assert table["reason"].iloc[1] == "rank 5 is bad whatever shard it gets"


def test_a_suspect_node_incident_names_the_node_and_its_record():
    from cliffguard.dashboard.incident_cause import cause_line

    line = cause_line("suspect_node", {"node": "gpu-07", "record": {"cause": "bad_rank", "run": "run-a",
                                                                     "why": "rank 5 is bad"}})
    assert line == ("node **gpu-07** is suspect (bad_rank, evicted from run run-a: rank 5 is bad); "
                    "not admitted until cleared (`cliffguard nodes clear`)")
