"""``ranks`` events stored one row per event (controller/store/rank_arrays.py), read per rank by
``read.rank_metrics`` (merged with per-rank step rows, bucketed) and ``read.latest_rank_steps``."""

from __future__ import annotations

import math

import pytest
from sqlalchemy import select

from cliffguard.controller.store import read
from cliffguard.controller.store.db import session_scope
from cliffguard.controller.store.ingest import ingest_events
from cliffguard.controller.store.models import RankArrayRow
from cliffguard.controller.store.rank_arrays import insert_rank_arrays
from cliffguard.controller.store.retention import RetentionConfig, downsample
from cliffguard.core.enums import EventType
from testing import store_factory as f


def _ranks(step: int, first: int, n: int, step_time: float):
    data = {"first_rank": first, "steps": 10, "step_time_s": [step_time] * n, "data_wait_s": [0.0] * n,
            "comm_exposed_s": [0.0] * n, "mfu": [0.4] * n, "tokens_per_s": [1e3] * n,
            "mem_allocated": [1] * n, "mem_reserved": [2] * n, "loss_local": [math.nan] + [2.0] * (n - 1)}
    return f.event(EventType.RANKS, step, data, world=8, ts=f.T0 + step)


def test_arrays_merge_with_per_rank_rows_and_bucket_like_the_sql_path(engine):
    events = [f.step(s, 2.0, world=8) for s in range(0, 100, 10)]
    events += [_ranks(s, first, 4, 0.1 * (s // 10 + 1)) for s in range(0, 100, 10) for first in (0, 4)]
    events.append(f.step(95, 2.0, rank=5, world=8, detail=True))  # a per-rank step row beside the arrays
    with session_scope(engine) as s:
        ingest_events(s, events)
        assert insert_rank_arrays(s, events) == 0  # stored once
    with session_scope(engine) as s:
        full = read.rank_metrics(s, "run-a", columns=("step_time_s", "loss_local"))
        assert len(full) == 10 + 10 * 7 + 1 and {p["rank"] for p in full} == set(range(8))
        assert [p for p in full if p["rank"] == 4 and p["step"] == 20][0]["loss_local"] != 2.0  # nan at the chunk's first
        coarse = read.rank_metrics(s, "run-a", columns=("step_time_s",), max_points=5)
        three = [p for p in coarse if p["rank"] == 3]
        assert [p["step"] for p in three] == [0, 20, 40, 60, 80]
        assert three[0]["step_time_s"] == pytest.approx(0.15)  # steps 0 and 10 averaged
        recent = read.rank_metrics(s, "run-a", columns=("step_time_s",), last_steps=6)
        assert {p["step"] for p in recent} == {90, 95}
        latest = read.latest_rank_steps(s, "run-a")
        assert [(r["rank"], r["step"]) for r in latest] == [(0, 90), *[(r, 90) for r in range(1, 5)], (5, 95),
                                                           (6, 90), (7, 90)]


def _stored_sets(engine) -> dict[int, int]:
    with session_scope(engine) as s:
        steps = s.scalars(select(RankArrayRow.step).where(RankArrayRow.run_id == "run-a")).all()
    return {step: steps.count(step) for step in sorted(set(steps))}


def test_retention_keeps_recent_sets_whole_and_one_set_per_bucket_before(engine):
    """Sets (two chunks a step, every 10 steps, from step 3 so no bucket starts on a set) newer
    than rank_arrays_full_steps stay; older ones keep each 100-step span's first set; idempotent."""
    cfg = RetentionConfig(full_steps=200, mid_steps=400, mid_bucket=10, far_bucket=100,
                          rank_arrays_full_steps=250, rank_arrays_bucket=100)
    steps = range(3, 1000, 10)
    events = [f.step(s, 2.0, world=8) for s in steps] + [_ranks(s, first, 4, 0.1) for s in steps for first in (0, 4)]
    with session_scope(engine) as s:
        ingest_events(s, events)
    with session_scope(engine) as s:
        downsample(s, "run-a", cfg)  # newest step 993: arrays below 700 (993 - 250 + 1, aligned down) thinned
    kept = _stored_sets(engine)
    assert set(kept.values()) == {2}  # a set is kept or dropped whole
    assert [s for s in kept if s < 700] == [3, 103, 203, 303, 403, 503, 603]
    assert [s for s in kept if s >= 700] == list(range(703, 1000, 10))
    with session_scope(engine) as s:
        downsample(s, "run-a", cfg)
    assert _stored_sets(engine) == kept
    with session_scope(engine) as s:  # the thinned history still reads per rank
        pts = read.rank_metrics(s, "run-a", columns=("step_time_s",))
    assert {p["step"] for p in pts} >= {3, 603, 993}


def test_stored_arrays_are_what_to_json_gives_with_or_without_its_walk():
    from cliffguard.controller.store.rank_arrays import _stored_arrays
    from cliffguard.core.floats import to_json
    from cliffguard.core.rank_arrays import RANKS_ARRAYS

    base = {name: [1.0, 2.5, 3] for name in RANKS_ARRAYS}
    odd = [[1.0, float("nan")], [float("inf"), 1.0], [1e308, 1e308], [2**1100, 1], [1.0, None]]
    for values in [None, *odd]:
        data = dict(base) if values is None else {**base, RANKS_ARRAYS[0]: values}
        got = _stored_arrays(data)
        assert got == to_json({name: list(data[name]) for name in RANKS_ARRAYS}), values
    assert _stored_arrays({**base, RANKS_ARRAYS[0]: [float("nan")]})[RANKS_ARRAYS[0]] == ["NaN"]
