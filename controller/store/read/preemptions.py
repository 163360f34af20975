"""A run's preemptions (controller/recovery_preempt.py): one row per ``preemption`` incident."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from cliffguard.controller.store.models import IncidentRow, TransitionRow

PREEMPTION_RULE = "preemption"


def preemptions(session: Session, run_id: str, *, limit: int | None = 100) -> list[dict[str, Any]]:
    """Newest first: ``id``, ``opened_at``, ``closed_at``, ``outcome`` (``open`` while the run is down,
    ``requeued`` once it trained again), what the trainer measured (``signal``, ``deadline_s``,
    ``save_s`` signal -> verified checkpoint, ``verified``, ``saved_step``) and, once closed, what the
    machine measured (``steps_lost``, ``seconds_to_train``: from the save until the first step again)."""
    incs = list(session.scalars(select(IncidentRow).where(IncidentRow.run_id == run_id, IncidentRow.rule == PREEMPTION_RULE)
                                .order_by(IncidentRow.opened_at.desc()).limit(limit)))
    if not incs:
        return []
    # the move that closed it when the run trained again (a run that ended while down has none)
    again = {t.incident_id: t.evidence for t in session.scalars(
        select(TransitionRow).where(TransitionRow.incident_id.in_([i.id for i in incs]),
                                    TransitionRow.from_state == "preempted", TransitionRow.to_state == "running"))
             if isinstance(t.evidence, dict) and "steps_lost" in t.evidence}
    out = []
    for inc in incs:
        ev, back = inc.evidence or {}, again.get(inc.id, {})
        out.append({"id": inc.id, "opened_at": inc.opened_at, "closed_at": inc.closed_at, "outcome": inc.outcome,
                    "signal": ev.get("signal"), "deadline_s": ev.get("deadline_s"), "save_s": ev.get("save_s"),
                    "verified": ev.get("verified"), "saved_step": ev.get("saved_step"), "scope": ev.get("scope", "job"),
                    "nodes": ev.get("nodes") or [],
                    "steps_lost": back.get("steps_lost"), "seconds_to_train": back.get("seconds_to_train")})
    return out
