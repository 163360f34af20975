"""Write an alert and its outbox rows in the caller's transaction (the transactional outbox).

The controller calls ``enqueue_alert`` inside the same transaction that stores the state and the
consumer offsets that produced the alert, so an alert exists iff that state was committed; the
deliverer sends it after commit. One outbox row per endpoint: its id is the Standard Webhooks
``webhook-id``, reused on every retry. Ids sort by creation (time, then a per-process counter), so
an endpoint's queue is delivered in the order alerts were raised: a PagerDuty resolve never
overtakes its trigger.

Suppression (dedup per (run, rule), like W&B's ``wait_duration``): a trigger is stored with
``suppressed=True`` and no outbox rows when a trigger for the same (run, rule) was *sent* (not
itself suppressed) less than ``suppress_s`` ago and no resolve for that (run, rule) came since
(after a resolve, a new trigger is a new problem). Critical alerts and resolves are never
suppressed. Suppressed alerts stay in the table, so the dashboard still shows every firing.
"""

from __future__ import annotations

import itertools
import os
import time
import uuid

from sqlalchemy import select
from sqlalchemy.orm import Session

from cliffguard.controller.alerts.config import AlertsConfig
from cliffguard.controller.alerts.spec import AlertAction, AlertLevel, AlertSpec
from cliffguard.controller.store.models import AlertEndpointStateRow, AlertRow, OutboxRow
from cliffguard.core.floats import to_json

_SEQ = itertools.count()


def new_message_id() -> str:
    """``msg_`` + creation time (ns, hex) + per-process counter + random: sorts by creation."""
    return f"msg_{time.time_ns():016x}{next(_SEQ) & 0xFFFF:04x}{os.urandom(6).hex()}"


def is_suppressed(
    spec: AlertSpec,
    *,
    now: float,
    suppress_s: float,
    last_sent_trigger_ts: float | None,
    last_resolve_ts: float | None,
) -> bool:
    """Pure suppression decision (see the module docstring)."""
    if spec.action == AlertAction.RESOLVE or spec.level == AlertLevel.CRITICAL:
        return False
    if last_sent_trigger_ts is None or now - last_sent_trigger_ts >= suppress_s:
        return False
    return not (last_resolve_ts is not None and last_resolve_ts >= last_sent_trigger_ts)


def _same_run(run_id: str | None):  # noqa: ANN202 - a SQL expression
    return AlertRow.run_id.is_(None) if run_id is None else AlertRow.run_id == run_id


def _last_ts(session: Session, spec: AlertSpec, action: AlertAction, sent_only: bool) -> float | None:
    query = select(AlertRow.ts).where(_same_run(spec.run_id), AlertRow.rule == spec.rule, AlertRow.action == str(action))
    if sent_only:
        query = query.where(AlertRow.suppressed.is_(False))
    return session.scalar(query.order_by(AlertRow.ts.desc()).limit(1))


def disabled_endpoints(session: Session) -> set[str]:
    return set(session.scalars(select(AlertEndpointStateRow.name).where(AlertEndpointStateRow.disabled.is_(True))))


def enqueue_alert(session: Session, spec: AlertSpec, config: AlertsConfig, now: float) -> AlertRow:
    """Store the alert and, unless suppressed, one pending outbox row per accepting endpoint."""
    suppressed = is_suppressed(
        spec,
        now=now,
        suppress_s=config.suppress_s,
        last_sent_trigger_ts=_last_ts(session, spec, AlertAction.TRIGGER, sent_only=True),
        last_resolve_ts=_last_ts(session, spec, AlertAction.RESOLVE, sent_only=False),
    )
    alert = AlertRow(
        id=uuid.uuid4().hex,
        run_id=spec.run_id,
        incident_id=spec.incident_id,
        ts=now,
        level=str(spec.level),
        rule=spec.rule,
        title=spec.title,
        body=spec.body,
        action=str(spec.action),
        suppressed=suppressed,
        # PostgreSQL's JSON rejects NaN; the schema stores non-finite floats as strings.
        evidence=to_json(spec.evidence),
    )
    session.add(alert)
    if suppressed:
        return alert
    gone = disabled_endpoints(session)
    level = AlertLevel(spec.level)
    for endpoint in config.endpoints:
        if endpoint.name in gone or not endpoint.accepts(level, spec.action == AlertAction.RESOLVE):
            continue
        session.add(
            OutboxRow(
                id=new_message_id(),
                kind="alert",
                target=endpoint.name,
                key=spec.run_id,
                payload=alert.id.encode(),
                created_at=now,
                status="pending",
                attempts=0,
                next_attempt_at=now,
            )
        )
    return alert


def set_endpoint_disabled(session: Session, name: str, *, disabled: bool, reason: str | None, now: float) -> None:
    """Disable (on HTTP 410) or re-enable an endpoint. Re-enabling does not revive old rows."""
    state = session.get(AlertEndpointStateRow, name)
    if state is None:
        session.add(AlertEndpointStateRow(name=name, disabled=disabled, disabled_reason=reason, updated_at=now))
    else:
        state.disabled = disabled
        state.disabled_reason = reason
        state.updated_at = now
