"""Incidents, transitions and one incident's whole story."""

from __future__ import annotations

from cliffguard.controller.store import read
from cliffguard.controller.store.db import session_scope


def test_incidents_and_transitions(decisions):
    with session_scope(decisions) as s:
        assert [i["id"] for i in read.incidents(s)] == ["i2", "i1", "i3"]
        assert [i["id"] for i in read.incidents(s, "r", open_only=True)] == ["i2"]
        assert [i["id"] for i in read.incidents(s, limit=1)] == ["i2"]
        assert read.incidents(s, "r")[1]["evidence"] == {"sigmas": 41.0}
        assert [t["to_state"] for t in read.transitions(s, "r")] == ["pausing", "validating", "pausing"]
        assert [t["to_state"] for t in read.transitions(s, "r", limit=2)] == ["validating", "pausing"]
        assert [t["ts"] for t in read.transitions(s, "r", incident_id="i1")] == [10.0, 11.0]


def test_incident_detail_tells_the_whole_story(decisions):
    with session_scope(decisions) as s:
        detail = read.incident_detail(s, "i1")
        assert read.incident_detail(s, "nope") is None
    assert (detail["rule"], detail["outcome"]) == ("loss_spike", "rolled_back")
    assert [t["to_state"] for t in detail["transitions"]] == ["pausing", "validating"]
    assert [c["id"] for c in detail["commands"]] == ["c1"]
    assert [v["val_loss"] for v in detail["validations"]] == [3.9]
    assert [a["id"] for a in detail["alerts"]] == ["a1"] and len(detail["alerts"][0]["deliveries"]) == 2
