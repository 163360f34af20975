"""Commands with their acks, and the operator audit log."""

from __future__ import annotations

from cliffguard.controller.store import read
from cliffguard.controller.store.db import session_scope


def test_commands_newest_first_by_run_or_incident(decisions):
    with session_scope(decisions) as s:
        assert [c["id"] for c in read.commands(s, "r")] == ["c2", "c1"]
        assert [c["id"] for c in read.commands(s, incident_id="i1")] == ["c1"]
        assert read.commands(s, "other") == []


def test_audit_log(decisions):
    with session_scope(decisions) as s:
        assert [a["actor"] for a in read.audit_log(s, "r")] == ["alice"]
        assert read.audit_log(s, "other") == []
