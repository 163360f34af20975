"""Pure formatters: one stored alert + one endpoint -> the HTTP request to send. No I/O.

- generic: a Standard Webhooks message, ``{"type", "timestamp", "data"}`` with type
  ``alert.trigger`` / ``alert.resolve``, signed (see webhook_signing.py).
- slack: an incoming-webhook message, ``text`` (the notification and fallback) plus Block Kit
  ``blocks`` (header, body, fields, context); Slack's limits are respected (header text 150
  characters, a section 3000, a field 2000, at most 10 fields).
- pagerduty: an Events API v2 event. ``trigger`` carries ``payload`` (summary <= 1024 characters,
  source, severity, timestamp, component, group, class, custom_details); ``resolve`` carries only
  routing key, action and ``dedup_key``. dedup_key = the incident id, so the resolve closes the
  trigger; without an incident, ``cliffguard/<run>/<rule>``. Severity: critical -> critical,
  warn -> warning, info -> info (PagerDuty's ``error`` is not used).

Every request carries ``webhook-id`` (the outbox row id, the same on every retry); only the
generic format is signed, because Slack and PagerDuty authenticate by URL and routing key.
Evidence may hold NaN/inf (a diverging run): bodies are strict JSON with those written as the
strings "NaN"/"Infinity" (core/floats.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from cliffguard.controller.alerts.config import EndpointConfig, EndpointFormat
from cliffguard.controller.alerts.spec import AlertAction, AlertLevel, AlertMessage
from cliffguard.controller.alerts.webhook_signing import signed_headers
from cliffguard.core.floats import dumps, to_json

JSON_HEADERS = {"content-type": "application/json", "user-agent": "cliffguard-alerts/1"}
PAGERDUTY_SEVERITY = {AlertLevel.CRITICAL: "critical", AlertLevel.WARN: "warning", AlertLevel.INFO: "info"}
SLACK_EMOJI = {AlertLevel.CRITICAL: ":rotating_light:", AlertLevel.WARN: ":warning:", AlertLevel.INFO: ":information_source:"}
SLACK_HEADER_MAX = 150
SLACK_SECTION_MAX = 3000
SLACK_FIELD_MAX = 2000
SLACK_FIELDS_MAX = 10
PAGERDUTY_SUMMARY_MAX = 1024
PAGERDUTY_DEDUP_MAX = 255


@dataclass(frozen=True, slots=True)
class OutgoingRequest:
    url: str
    body: bytes
    headers: dict[str, str]

    def __repr__(self) -> str:  # the URL and headers may hold credentials
        return f"OutgoingRequest(body={len(self.body)} bytes, headers={sorted(self.headers)})"


def iso_utc(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def generic_payload(msg: AlertMessage) -> dict[str, Any]:
    return {
        "type": f"alert.{msg.action}",
        "timestamp": iso_utc(msg.ts),
        "data": {
            "alert_id": msg.id,
            "run_id": msg.run_id,
            "incident_id": msg.incident_id,
            "rule": msg.rule,
            "level": str(msg.level),
            "action": str(msg.action),
            "title": msg.title,
            "body": msg.body,
            "ts": msg.ts,
            "evidence": msg.evidence,
        },
    }


def _field_text(value: Any) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def slack_payload(msg: AlertMessage) -> dict[str, Any]:
    resolved = msg.action == AlertAction.RESOLVE
    emoji = ":white_check_mark:" if resolved else SLACK_EMOJI[msg.level]
    tag = "RESOLVED" if resolved else msg.level.upper()
    text = f"{emoji} [{tag}] {msg.title}" + (f" (run {msg.run_id})" if msg.run_id else "")
    fields = [("Run", msg.run_id), ("Rule", msg.rule), ("Level", str(msg.level)), ("Incident", msg.incident_id)]
    fields += [(str(k), v) for k, v in msg.evidence.items() if not isinstance(v, (dict, list))]
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": _clip(f"[{tag}] {msg.title}", SLACK_HEADER_MAX)}},
    ]
    if msg.body:
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": _clip(msg.body, SLACK_SECTION_MAX)}})
    blocks.append({
        "type": "section",
        "fields": [
            {"type": "mrkdwn", "text": _clip(f"*{name}*\n{_field_text(value)}", SLACK_FIELD_MAX)}
            for name, value in fields[:SLACK_FIELDS_MAX]
            if value is not None
        ],
    })
    blocks.append({
        "type": "context",
        "elements": [{"type": "mrkdwn", "text": f"cliffguard · {iso_utc(msg.ts)} · alert {msg.id}"}],
    })
    return {"text": text, "blocks": blocks}


def pagerduty_dedup_key(msg: AlertMessage) -> str:
    key = msg.incident_id or f"cliffguard/{msg.run_id or '-'}/{msg.rule}"
    return key[:PAGERDUTY_DEDUP_MAX]


def pagerduty_payload(msg: AlertMessage, routing_key: str) -> dict[str, Any]:
    event: dict[str, Any] = {
        "routing_key": routing_key,
        "event_action": str(msg.action),
        "dedup_key": pagerduty_dedup_key(msg),
    }
    if msg.action == AlertAction.TRIGGER:
        event["client"] = "cliffguard"
        event["payload"] = {
            "summary": _clip(msg.title + (f" (run {msg.run_id})" if msg.run_id else ""), PAGERDUTY_SUMMARY_MAX),
            "source": f"cliffguard/{msg.run_id}" if msg.run_id else "cliffguard",
            "severity": PAGERDUTY_SEVERITY[msg.level],
            "timestamp": iso_utc(msg.ts),
            "component": msg.run_id or "cliffguard",
            "group": "cliffguard",
            "class": msg.rule,
            "custom_details": to_json({"body": msg.body, "alert_id": msg.id, **msg.evidence}),
        }
    return event


def render(msg: AlertMessage, endpoint: EndpointConfig, *, msg_id: str, now: float) -> OutgoingRequest:
    """The request for one attempt; ``now`` is the attempt's time (the signed timestamp)."""
    fmt = EndpointFormat(endpoint.format)
    headers = dict(JSON_HEADERS)
    if fmt == EndpointFormat.GENERIC:
        body = dumps(generic_payload(msg))
        secret = endpoint.secret_value
        assert secret is not None  # EndpointConfig requires it for generic
        headers.update(signed_headers(secret, msg_id, int(now), body))
        return OutgoingRequest(endpoint.url_value, body, headers)
    headers["webhook-id"] = msg_id
    if fmt == EndpointFormat.SLACK:
        return OutgoingRequest(endpoint.url_value, dumps(slack_payload(msg)), headers)
    routing_key = endpoint.secret_value
    assert routing_key is not None  # EndpointConfig requires it for pagerduty
    return OutgoingRequest(endpoint.url_value, dumps(pagerduty_payload(msg, routing_key)), headers)
