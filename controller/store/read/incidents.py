"""Incidents and the recovery state machine's transitions; one incident's whole story."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from cliffguard.controller.store.models import IncidentRow, TransitionRow
from cliffguard.controller.store.read._rows import row_dict
from cliffguard.controller.store.read.alerts import alerts
from cliffguard.controller.store.read.commands import commands
from cliffguard.controller.store.read.data_stats import data_evidence
from cliffguard.controller.store.read.validations import validations
from cliffguard.core.enums import IncidentOutcome


def incidents(
    session: Session, run_id: str | None = None, *, open_only: bool = False, limit: int | None = 100
) -> list[dict[str, Any]]:
    """Incidents, newest first; all runs when ``run_id`` is None."""
    stmt = select(IncidentRow)
    if run_id is not None:
        stmt = stmt.where(IncidentRow.run_id == run_id)
    if open_only:
        stmt = stmt.where(IncidentRow.outcome == IncidentOutcome.OPEN)
    return [row_dict(r) for r in session.scalars(stmt.order_by(IncidentRow.opened_at.desc()).limit(limit))]


def transitions(
    session: Session, run_id: str, *, incident_id: str | None = None, limit: int | None = 1000
) -> list[dict[str, Any]]:
    """State-machine transitions of a run (or one incident), oldest first: the timeline (the
    newest ``limit`` of them)."""
    stmt = select(TransitionRow).where(TransitionRow.run_id == run_id)
    if incident_id is not None:
        stmt = stmt.where(TransitionRow.incident_id == incident_id)
    rows = session.scalars(stmt.order_by(TransitionRow.ts.desc(), TransitionRow.id.desc()).limit(limit))
    return [row_dict(r) for r in rows][::-1]


def incident_detail(session: Session, incident_id: str) -> dict[str, Any] | None:
    """One incident with its whole story, or None: the incident's columns plus ``transitions``
    (oldest first), ``commands`` (oldest first, each with its ack), ``validations`` (the results
    answering its validate commands), ``alerts`` (newest first, with deliveries) and ``data``: the
    batch statistics of its steps (onset to spike) beside the baseline (``read.data_evidence``; None
    without a data watch)."""
    inc = session.get(IncidentRow, incident_id)
    if inc is None:
        return None
    out = row_dict(inc)
    out["transitions"] = transitions(session, inc.run_id, incident_id=incident_id, limit=None)
    out["commands"] = commands(session, inc.run_id, incident_id=incident_id, limit=None)[::-1]
    cmd_ids = [c["id"] for c in out["commands"]]
    answers = [v for v in validations(session, inc.run_id, limit=None) if v["cmd"] in cmd_ids] if cmd_ids else []
    out["validations"] = answers
    out["alerts"] = alerts(session, inc.run_id, incident_id=incident_id, limit=None)
    onset = inc.onset_step if inc.onset_step is not None else inc.spike_step
    out["data"] = data_evidence(session, inc.run_id, onset, inc.spike_step)
    return out
