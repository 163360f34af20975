"""Alerts with their deliveries, outbox totals and alert endpoints' state."""

from __future__ import annotations

from cliffguard.controller.alerts.enqueue import set_endpoint_disabled
from cliffguard.controller.store import read
from cliffguard.controller.store.db import session_scope


def test_alerts_carry_their_deliveries_and_outbox_is_summarised(decisions):
    with session_scope(decisions) as s:
        alerts = read.alerts(s, "r")
        summary = read.outbox_status(s)
        assert [a["id"] for a in read.alerts(s, "r", incident_id="i1")] == ["a1"]
    assert [a["id"] for a in alerts] == ["a2", "a1"]
    assert alerts[0]["deliveries"] == [] and alerts[0]["suppressed"] is True
    assert [(d["target"], d["status"], d["attempts"]) for d in alerts[1]["deliveries"]] == [
        ("pager", "pending", 2),
        ("slack", "delivered", 1),
    ]
    assert alerts[1]["deliveries"][0]["last_error"] == "HTTP 503"
    assert summary == {"alert": {"delivered": 1, "pending": 1}, "command": {"delivered": 1}}


def test_alert_endpoints_count_outbox_rows_and_show_disabled_ones(decisions):
    with session_scope(decisions) as s:
        set_endpoint_disabled(s, "gone", disabled=True, reason="HTTP 410 Gone", now=50.0)
    with session_scope(decisions) as s:
        table = read.alert_endpoints(s)
    assert [(e["endpoint"], e["disabled"], e["counts"]) for e in table] == [
        ("gone", True, {}),
        ("pager", False, {"pending": 1}),
        ("slack", False, {"delivered": 1}),
    ]
    assert table[0]["reason"] == "HTTP 410 Gone"
