"""The data watch's windows (``data_stats``): the live statistics over steps, a rank's baseline,
and the evidence of a loss incident: its steps' batch statistics beside the baseline.

The baseline is what the data rules use (controller/rules/data_quality.py): the rank's first
``baseline_windows`` windows (20 by default). ``drift`` is the Jensen-Shannon divergence of a
window's token sketch from the baseline's summed sketch (the rule's ``tokens`` statistic; a
baseline window is compared with a baseline it is part of, so its drift reads a little low).
A rollback replays steps, so a step may have several records: the series show the newest, an
incident's evidence the first (the pass that went wrong).
"""

from __future__ import annotations

from statistics import median
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from cliffguard.controller.rules.budget import js_divergence
from cliffguard.controller.rules.data_quality import DataQualityConfig
from cliffguard.controller.store.models import DataStatsRow
from cliffguard.controller.store.read._rows import row_dict, speaker_rank
from cliffguard.core.floats import from_json

BASELINE_WINDOWS = DataQualityConfig().baseline_windows
STEP_FIELDS = ("dup", "pad", "garbled", "ppl")
"""The per-step figures of a window (``per_step`` arrays beside ``steps``)."""


def _rows(session: Session, run_id: str, rank: int, *, newest: int | None = None,
          oldest: int | None = None) -> list[dict[str, Any]]:
    stmt = select(DataStatsRow).where(DataStatsRow.run_id == run_id, DataStatsRow.rank == rank)
    if newest is not None:
        stmt = stmt.order_by(DataStatsRow.ts.desc(), DataStatsRow.id.desc()).limit(newest)
    else:
        stmt = stmt.order_by(DataStatsRow.ts, DataStatsRow.id).limit(oldest)
    out = []
    for r in session.scalars(stmt):
        d = row_dict(r)
        d["per_step"], d["outliers"] = from_json(d["per_step"]), from_json(d["outliers"])
        out.append(d)
    return out if newest is None else out[::-1]


def _rank(session: Session, run_id: str, rank: int | None) -> int | None:
    return rank if rank is not None else speaker_rank(session, run_id, DataStatsRow)


def data_baseline(session: Session, run_id: str, *, rank: int | None = None,
                  windows: int = BASELINE_WINDOWS) -> dict[str, Any] | None:
    """The rank's baseline: its first ``windows`` windows' steps, summed sketch and the medians of
    the per-step figures (None before any window; ``complete`` False while it is still filling)."""
    rank = _rank(session, run_id, rank)
    if rank is None:
        return None
    rows = _rows(session, run_id, rank, oldest=windows)
    if not rows:
        return None
    n = len(rows[0]["sketch"])
    sketch = [sum(col) for col in zip(*(r["sketch"] for r in rows if len(r["sketch"]) == n), strict=True)]
    out: dict[str, Any] = {"rank": rank, "steps": [rows[0]["first_step"], rows[-1]["step"]], "windows": len(rows),
                           "complete": len(rows) >= windows, "sketch": sketch}
    for f in STEP_FIELDS:
        values = [v for r in rows for v in r["per_step"].get(f, []) if v is not None and v == v]
        out[f] = median(values) if values else None
    out["drift"] = median(js_divergence(r["sketch"], sketch) for r in rows) if sketch else None
    return out


def data_windows(session: Session, run_id: str, *, rank: int | None = None,
                 limit: int | None = 500) -> list[dict[str, Any]]:
    """The rank's windows (default: the speaking rank's), oldest first (the newest ``limit``), each
    with ``drift`` against the baseline (None while there is none)."""
    rank = _rank(session, run_id, rank)
    if rank is None:
        return []
    base = data_baseline(session, run_id, rank=rank)
    rows = _rows(session, run_id, rank, newest=limit)
    for r in rows:
        r["drift"] = (js_divergence(r["sketch"], base["sketch"])
                      if base and len(r["sketch"]) == len(base["sketch"]) else None)
    return rows


def data_steps(session: Session, run_id: str, *, rank: int | None = None, first: int | None = None,
               last: int | None = None, replayed: str = "newest", limit: int | None = 500) -> list[dict[str, Any]]:
    """Per step (oldest first): ``step``, ``window`` (its window's last step), and the figures of
    ``STEP_FIELDS`` (None where not measured); a replayed step's ``replayed`` record ("newest" or
    "first"); steps in [first, last] when given."""
    rank = _rank(session, run_id, rank)
    if rank is None:
        return []
    rows = _rows(session, run_id, rank, newest=limit) if first is None else _rows(session, run_id, rank)
    by_step: dict[int, dict[str, Any]] = {}
    for r in rows:
        ps = r["per_step"]
        for i, step in enumerate(ps.get("steps", [])):
            if (first is not None and step < first) or (last is not None and step > last):
                continue
            if replayed == "first" and step in by_step:
                continue
            rec = {"step": step, "rank": rank, "window": r["step"]}
            for f in STEP_FIELDS:
                values = ps.get(f)
                rec[f] = values[i] if values is not None and i < len(values) else None
            by_step[step] = rec
    return [by_step[s] for s in sorted(by_step)]


def data_evidence(session: Session, run_id: str, first_step: int, last_step: int, *,
                  rank: int | None = None) -> dict[str, Any] | None:
    """A loss incident's data evidence: the batch statistics of steps [first_step, last_step] (the
    first pass), the windows holding them with their drift and outlier sequences, and the baseline
    (its sketch left out); None when the run has no data watch."""
    rank = _rank(session, run_id, rank)
    if rank is None:
        return None
    base = data_baseline(session, run_id, rank=rank)
    steps = data_steps(session, run_id, rank=rank, first=first_step, last=last_step, replayed="first")
    windows = []
    for r in _rows(session, run_id, rank):
        if r["step"] < first_step or r["first_step"] > last_step or any(w["step"] == r["step"] for w in windows):
            continue
        windows.append({"first_step": r["first_step"], "step": r["step"], "dup_share": r["dup_share"],
                        "garbled": r["garbled"], "ppl": r["ppl"], "pad_share": r["pad_share"],
                        "drift": js_divergence(r["sketch"], base["sketch"]) if base else None,
                        "outliers": r["outliers"]})
    if base is not None:
        base = {k: v for k, v in base.items() if k != "sketch"}
    return {"rank": rank, "steps": steps, "windows": windows, "baseline": base}
