"""``ranks`` events in the store: one ``rank_arrays`` row per event, expanded per rank on read.

A 16k-rank run sends 16 ``ranks`` events of 1024 ranks every ``ranks_every`` steps; one
``step_metrics`` row per rank made that 16k rows per 10 steps, the controller's largest write
(seconds per burst on a loaded machine, during which no verdict could leave). Idempotent like
the step rows: the event id is unique and an id already stored is not inserted again.
``per_rank`` gives each rank's fields as the per-rank step rows had them (``compute_s`` derived,
``skipped`` False, the run-level metrics None), for ``controller/store/read/ranks.py``.

Retention (``thin_rank_arrays``, called by ``store.retention.downsample``): a 16k-rank run at one
step per second stores ~1.1 MB of arrays every ``ranks_every`` steps, ~10 GB a day if nothing
ages. Sets newer than ``RetentionConfig.rank_arrays_full_steps`` are all kept (what a straggler
hunt looks at); older ones keep one set (every chunk of one step: the bucket's first) per
``rank_arrays_bucket`` steps, so the per-rank history of any age stays drawable at a bounded cost:
~1.2 GB per million steps of a 16k-rank run with the defaults. A per-rank array cannot be folded
into a mean the way a step row is (a straggler's minute would vanish in it), so whole sets are
kept or dropped.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from cliffguard.controller.store.models import RankArrayRow
from cliffguard.controller.store.upsert import insert_for
from cliffguard.core.enums import EventType
from cliffguard.core.events import Event
from cliffguard.core.floats import from_json, to_json
from cliffguard.core.rank_arrays import RANKS_ARRAYS
from cliffguard.core.ranks import RUN_RANK

_ID_CHUNK = 5000  # event ids per IN (...) lookup, below SQLite's bound-parameter limit


def insert_rank_arrays(session: Session, events: Iterable[Event]) -> int:
    """Store the ``ranks`` events not stored yet (one row each); returns how many were new."""
    rows = {ev.id: {"event_id": ev.id, "run_id": ev.run, "step": ev.step, "ts": ev.ts,
                    "first_rank": ev.data["first_rank"], "arrays": _stored_arrays(ev.data)}
            for ev in events if ev.type is EventType.RANKS}
    ids = list(rows)
    for i in range(0, len(ids), _ID_CHUNK):
        for seen in session.scalars(select(RankArrayRow.event_id).where(RankArrayRow.event_id.in_(ids[i:i + _ID_CHUNK]))):
            rows.pop(seen, None)
    if rows:
        stmt = insert_for(session, RankArrayRow).on_conflict_do_nothing(index_elements=["event_id"])
        session.connection().execute(stmt, list(rows.values()))
    return len(rows)


def thin_rank_arrays(session: Session, run_id: str, below: int, bucket: int) -> int:
    """Keep, of the run's ``ranks`` rows with step < ``below``, only those at the first stored step
    of each ``bucket``-step span (``below`` a multiple of ``bucket``, so a span is never split);
    returns how many rows were deleted. Idempotent: a kept step stays its span's first."""
    if below <= 0:
        return 0
    old = (RankArrayRow.run_id == run_id, RankArrayRow.step < below)
    firsts = select(func.min(RankArrayRow.step)).where(*old).group_by(RankArrayRow.step // bucket)
    gone = delete(RankArrayRow).where(*old, RankArrayRow.step.not_in(firsts))
    return session.connection().execute(gone).rowcount


def _stored_arrays(data: Mapping[str, Any]) -> dict[str, Any]:
    """The event's arrays as stored: ``to_json``'s non-finite strings, but its walk over every
    value (7 x 1,024 numbers per event) only when a sum says some array holds a non-finite
    number, or something that is not a number."""
    arrays = {name: list(data[name]) for name in RANKS_ARRAYS}
    try:
        if all(math.isfinite(sum(values)) for values in arrays.values()):
            return arrays  # plain finite numbers: to_json would give them back unchanged
    except (TypeError, OverflowError):
        pass
    return to_json(arrays)


def per_rank(step: int, ts: float, first_rank: int, arrays: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """One stored event -> a dict per rank (but ``RUN_RANK``, whose run-level step row exists):
    step, rank, ts and the per-rank metrics."""
    cols = from_json(dict(arrays))
    n = len(cols["step_time_s"])
    for i in range(n):
        rank = first_rank + i
        if rank == RUN_RANK:
            continue
        d: dict[str, Any] = {name: cols[name][i] for name in RANKS_ARRAYS}
        d["compute_s"] = d["step_time_s"] - d["data_wait_s"] - d["comm_exposed_s"]
        yield {"step": step, "rank": rank, "ts": ts, "skipped": False, **d}


def rank_points(session: Session, run_id: str, from_step: int | None = None,
                to_step: int | None = None) -> list[dict[str, Any]]:
    """Every rank's fields from the run's stored ``ranks`` events in ``[from_step, to_step]``."""
    conds = [RankArrayRow.run_id == run_id]
    if from_step is not None:
        conds.append(RankArrayRow.step >= from_step)
    if to_step is not None:
        conds.append(RankArrayRow.step <= to_step)
    rows = session.execute(select(RankArrayRow.step, RankArrayRow.ts, RankArrayRow.first_rank, RankArrayRow.arrays)
                           .where(*conds).order_by(RankArrayRow.step, RankArrayRow.first_rank)).all()
    return [p for step, ts, first, arrays in rows for p in per_rank(step, ts, first, arrays)]
