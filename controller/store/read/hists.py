"""Gradient histograms (per layer, fixed log2 bins of |g|)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from cliffguard.controller.store.models import GradHistRow
from cliffguard.controller.store.read._rows import row_dict, speaker_rank
from cliffguard.core.floats import from_json


def grad_hists(
    session: Session, run_id: str, *, rank: int | None = None, step: int | None = None, limit: int | None = 1
) -> list[dict[str, Any]]:
    """Gradient histograms of ``rank`` (default: the rank that speaks for the run), newest
    reported first (at most ``limit``; at or before ``step`` if given). ``layers`` maps layer
    name -> {counts, zeros, nonfinite, p50, p99, max, norm, underflow}; ``edges`` are the fixed
    log2 bin edges of |g|; non-finite values come back as floats."""
    if rank is None:
        rank = speaker_rank(session, run_id, GradHistRow)
        if rank is None:
            return []
    conds = [GradHistRow.run_id == run_id, GradHistRow.rank == rank]
    if step is not None:
        conds.append(GradHistRow.step <= step)
    rows = session.scalars(
        select(GradHistRow).where(*conds).order_by(GradHistRow.ts.desc(), GradHistRow.id.desc()).limit(limit)
    )
    out = []
    for r in rows:
        d = row_dict(r)
        d["edges"], d["layers"] = from_json(d["edges"]), from_json(d["layers"])
        out.append(d)
    return out
