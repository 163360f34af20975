"""Per-rank metrics (raw, bucketed, the newest steps) and each rank's newest step row."""

from __future__ import annotations

import pytest

from cliffguard.controller.store import read
from cliffguard.controller.store.db import session_scope


def test_rank_metrics_raw_and_bucketed(run_1000):
    with session_scope(run_1000) as s:
        raw = read.rank_metrics(s, "run-a", columns=("step_time_s",), from_step=10, to_step=11)
        assert raw == [
            {"step": 10, "rank": 0, "step_time_s": 0.1},
            {"step": 10, "rank": 1, "step_time_s": 0.2},
            {"step": 11, "rank": 0, "step_time_s": 0.1},
            {"step": 11, "rank": 1, "step_time_s": 0.2},
        ]
        coarse = read.rank_metrics(s, "run-a", max_points=50)
        with pytest.raises(ValueError, match="^columns: "):
            read.rank_metrics(s, "run-a", columns=("loss", "nonsense"))
    assert len([p for p in coarse if p["rank"] == 0]) <= 50
    assert {p["rank"] for p in coarse} == {0, 1}
    assert all(p["step_time_s"] == pytest.approx(0.1 * (1 + p["rank"])) for p in coarse)
    assert isinstance(coarse[0]["mem_allocated"], float)


def test_rank_metrics_of_the_newest_steps(run_1000):
    with session_scope(run_1000) as s:
        last = read.rank_metrics(s, "run-a", columns=("mfu",), last_steps=3, max_points=None)
        assert read.rank_metrics(s, "nope", last_steps=3) == []
    assert [(p["step"], p["rank"]) for p in last] == [(997, 0), (997, 1), (998, 0), (998, 1), (999, 0), (999, 1)]


def test_latest_rank_steps(run_1000):
    with session_scope(run_1000) as s:
        latest = read.latest_rank_steps(s, "run-a")
    assert [(r["rank"], r["step"]) for r in latest] == [(0, 999), (1, 999)]
