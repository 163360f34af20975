"""The pure formatters, each checked against the documented shape of its receiver."""

from __future__ import annotations

import json
import math

import pytest

from cliffguard.controller.alerts import AlertAction, AlertLevel, AlertMessage, EndpointConfig, verify
from cliffguard.controller.alerts.config import PAGERDUTY_EVENTS_URL
from cliffguard.controller.alerts.formats import (
    PAGERDUTY_SUMMARY_MAX,
    SLACK_FIELDS_MAX,
    SLACK_HEADER_MAX,
    iso_utc,
    pagerduty_payload,
    render,
    slack_payload,
)
from testing.alerts import GENERIC_SECRET

TS = 1_764_480_000.5


def message(**kw) -> AlertMessage:
    base = dict(
        id="a1b2", ts=TS, rule="loss_spike", level=AlertLevel.CRITICAL, title="Loss spike at step 300",
        body="loss 9.1 is 7.2σ above the median 3.4", run_id="run-7", incident_id="inc-42",
        action=AlertAction.TRIGGER, evidence={"sigma": 7.2, "median": 3.4, "loss": math.inf},
    )
    base.update(kw)
    return AlertMessage(**base)


GENERIC = EndpointConfig(name="hooks", url="https://example.org/hook", secret=GENERIC_SECRET)
SLACK = EndpointConfig(name="chat", format="slack", url="https://hooks.slack.com/services/T/B/X")
PD = EndpointConfig(name="pd", format="pagerduty", secret="R0UTINGKEY0123456789")


def test_generic_is_a_signed_standard_webhook_a_receiver_can_verify():
    req = render(message(), GENERIC, msg_id="msg_1", now=TS + 5)
    assert req.url == "https://example.org/hook"
    assert req.headers["content-type"] == "application/json"
    assert req.headers["webhook-id"] == "msg_1"
    assert req.headers["webhook-timestamp"] == str(int(TS + 5))
    assert req.headers["webhook-signature"].startswith("v1,")
    assert verify(GENERIC_SECRET, req.headers, req.body, now=TS + 6) == "msg_1"
    body = json.loads(req.body)
    assert body["type"] == "alert.trigger"
    assert body["timestamp"] == iso_utc(TS) and body["timestamp"].endswith("Z")
    data = body["data"]
    assert data["alert_id"] == "a1b2" and data["run_id"] == "run-7" and data["incident_id"] == "inc-42"
    assert data["level"] == "critical" and data["rule"] == "loss_spike" and data["action"] == "trigger"
    assert data["evidence"] == {"sigma": 7.2, "median": 3.4, "loss": "Infinity"}  # strict JSON, inf kept


def test_generic_resolve_has_its_own_type():
    req = render(message(action=AlertAction.RESOLVE), GENERIC, msg_id="msg_2", now=TS)
    assert json.loads(req.body)["type"] == "alert.resolve"


def test_slack_message_has_text_and_blocks_within_limits():
    msg = message(title="x" * 400, evidence={f"k{i}": i for i in range(20)})
    req = render(msg, SLACK, msg_id="msg_3", now=TS)
    assert req.url == "https://hooks.slack.com/services/T/B/X"
    payload = json.loads(req.body)
    assert payload["text"].startswith(":rotating_light: [CRITICAL] xxx")
    assert "run-7" in payload["text"]
    kinds = [b["type"] for b in payload["blocks"]]
    assert kinds == ["header", "section", "section", "context"]
    header = payload["blocks"][0]["text"]
    assert header["type"] == "plain_text" and len(header["text"]) <= SLACK_HEADER_MAX
    assert payload["blocks"][1]["text"] == {"type": "mrkdwn", "text": msg.body}
    fields = payload["blocks"][2]["fields"]
    assert 1 <= len(fields) <= SLACK_FIELDS_MAX and all(f["type"] == "mrkdwn" for f in fields)
    assert fields[0]["text"] == "*Run*\nrun-7"
    assert "webhook-signature" not in req.headers  # Slack authenticates by URL


@pytest.mark.parametrize(
    ("level", "action", "prefix"),
    [
        (AlertLevel.WARN, AlertAction.TRIGGER, ":warning: [WARN]"),
        (AlertLevel.INFO, AlertAction.TRIGGER, ":information_source: [INFO]"),
        (AlertLevel.CRITICAL, AlertAction.RESOLVE, ":white_check_mark: [RESOLVED]"),
    ],
)
def test_slack_text_names_level_or_resolution(level, action, prefix):
    assert slack_payload(message(level=level, action=action))["text"].startswith(prefix)


def test_slack_omits_the_body_section_when_there_is_no_body():
    kinds = [b["type"] for b in slack_payload(message(body=""))["blocks"]]
    assert kinds == ["header", "section", "context"]


@pytest.mark.parametrize(
    ("level", "severity"),
    [(AlertLevel.CRITICAL, "critical"), (AlertLevel.WARN, "warning"), (AlertLevel.INFO, "info")],
)
def test_pagerduty_trigger_shape_and_severity(level, severity):
    req = render(message(level=level), PD, msg_id="msg_4", now=TS)
    assert req.url == PAGERDUTY_EVENTS_URL
    event = json.loads(req.body)
    assert event["routing_key"] == "R0UTINGKEY0123456789"
    assert event["event_action"] == "trigger"
    assert event["dedup_key"] == "inc-42"
    p = event["payload"]
    assert set(p) >= {"summary", "source", "severity", "timestamp", "component", "group", "class", "custom_details"}
    assert p["severity"] == severity
    assert p["summary"] == "Loss spike at step 300 (run run-7)"
    assert p["source"] == "cliffguard/run-7" and p["class"] == "loss_spike"
    assert p["custom_details"]["loss"] == "Infinity" and p["custom_details"]["alert_id"] == "a1b2"


def test_pagerduty_resolve_carries_only_key_action_and_the_trigger_dedup_key():
    trigger = pagerduty_payload(message(), "RK")
    resolve = pagerduty_payload(message(action=AlertAction.RESOLVE, level=AlertLevel.INFO), "RK")
    assert resolve == {"routing_key": "RK", "event_action": "resolve", "dedup_key": trigger["dedup_key"]}


def test_pagerduty_without_incident_dedups_per_run_and_rule_and_clips_summary():
    event = pagerduty_payload(message(incident_id=None, title="y" * 5000), "RK")
    assert event["dedup_key"] == "cliffguard/run-7/loss_spike"
    assert len(event["payload"]["summary"]) == PAGERDUTY_SUMMARY_MAX


def test_rendered_request_repr_hides_url_and_headers():
    req = render(message(), PD, msg_id="msg_5", now=TS)
    assert "R0UTINGKEY" not in repr(req) and "pagerduty.com" not in repr(req)
