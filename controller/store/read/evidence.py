"""The run's evidence: each rank's hang evidence (Flight Recorder sequence numbers, in-flight
collectives, stacks) and the node checks of restarted groups; a hang incident's own evidence."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from cliffguard.controller.store.models import EvidenceRow, IncidentRow
from cliffguard.controller.store.read._rows import row_dict
from cliffguard.core.floats import from_json

HANG = "hang.evidence"
NODE_CHECK = "node.check"
AROUND_S = 120.0
"""A hang incident's evidence: the rows of its life from this long before it opened to its close."""


def evidence(session: Session, run_id: str, *, kind: str | None = None, life: int | None = None,
             since: float | None = None, until: float | None = None, limit: int | None = 200) -> list[dict[str, Any]]:
    """Evidence rows, oldest first (the newest ``limit``), with ``data`` as the agent sent it."""
    stmt = select(EvidenceRow).where(EvidenceRow.run_id == run_id)
    if kind is not None:
        stmt = stmt.where(EvidenceRow.kind == kind)
    if life is not None:
        stmt = stmt.where(EvidenceRow.life == life)
    if since is not None:
        stmt = stmt.where(EvidenceRow.ts >= since)
    if until is not None:
        stmt = stmt.where(EvidenceRow.ts <= until)
    rows = session.scalars(stmt.order_by(EvidenceRow.ts.desc(), EvidenceRow.id.desc()).limit(limit))
    out = [row_dict(r) for r in rows][::-1]
    for d in out:
        d["data"] = from_json(d["data"])
    return out


def hang_evidence(session: Session, incident_id: str) -> dict[str, Any] | None:
    """A hang incident's evidence: the culprit and the sequence table it was named by (from the
    incident), every rank's report of that life (``reports``, one per rank: its first) and the
    node checks that followed (``checks``). None for an unknown incident or one that is no hang."""
    inc = session.get(IncidentRow, incident_id)
    if inc is None or (inc.evidence or {}).get("cause") != "hang":
        return None
    ev = from_json(inc.evidence or {})
    life = ev.get("life")
    start = float(ev.get("first_report_ts") or inc.opened_at) - AROUND_S
    end = inc.closed_at if inc.closed_at is not None else None
    rows = evidence(session, inc.run_id, kind=HANG, life=life, since=start, until=end, limit=None)
    first: dict[int, dict[str, Any]] = {}
    for r in rows:
        if r["reason"] != "resolved":
            first.setdefault(r["rank"], r)
    checks = evidence(session, inc.run_id, kind=NODE_CHECK, since=inc.opened_at, until=end, limit=None)
    return {"incident": row_dict(inc), "culprit": ev.get("culprit", []), "kind": ev.get("kind"),
            "collective": ev.get("collective"), "frame": ev.get("frame"), "nodes": ev.get("nodes", []),
            "table": ev.get("table", []), "life": life, "reports": [first[r] for r in sorted(first)],
            "checks": checks}
