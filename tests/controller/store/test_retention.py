"""Downsampling of step metrics: the policy, and a long synthetic run staying queryable.

The fast tests use a policy scaled down 20x from the default (500 full-resolution steps, 5,000
in 10-step buckets, 100-step buckets beyond) on runs of up to 20,000 steps, so every tier is
exercised. ``projected_rows`` is exact for any policy (checked against the database here); the
default policy on a 1,000,000-step run keeps 28,000 rows per rank (10,000 + 9,000 + 9,000),
20x the scaled policy on 50,000 steps, and the slow test checks it at full scale on SQLite.
"""

from __future__ import annotations

import math
import time

import pytest
from sqlalchemy import func, select, text

from cliffguard.controller.store import read
from cliffguard.controller.store.db import init_db, make_engine, session_scope
from cliffguard.controller.store.ingest import ingest_event
from cliffguard.controller.store.models import RunRow, StepMetricRow
from cliffguard.controller.store.retention import (
    RetentionConfig,
    downsample,
    downsample_all,
    downsample_if_due,
    projected_rows,
    tier_edges,
)
from cliffguard.core.events import MAX_STEP
from testing import store_factory as f

SCALED = RetentionConfig(full_steps=500, mid_steps=5_000, mid_bucket=10, far_bucket=100)
SPIKE_FAR, SPIKE_MID, NAN_STEP = 12_345, 16_789, 17_001


def loss_at(n: int) -> float:
    return 2.0 + 1.0 / (n + 1) + (5.0 if n in (SPIKE_FAR, SPIKE_MID) else 0.0)


def bulk_steps(engine, run_id: str, first: int, last: int, ranks: int = 1) -> None:
    """Rows for steps [first, last) generated inside the database (fast on both kinds)."""
    sql = text(
        "INSERT INTO step_metrics (run_id, step, rank, ts, resolution, loss, loss_local, grad_norm, tokens, "
        "lr_scale, mem_allocated, skipped) "
        "SELECT :run, q.n, r.k, :t0 + q.n, 1, "
        "2.0 + 1.0 / (q.n + 1) + CASE WHEN q.n IN (:s1, :s2) THEN 5.0 ELSE 0.0 END, "
        "2.0, 1.0 + q.n % 7, 100, CASE WHEN q.n >= :halved THEN 0.5 ELSE 1.0 END, 1000 + q.n % 13, "
        "CASE WHEN q.n = :s1 THEN TRUE ELSE FALSE END "
        "FROM (WITH RECURSIVE seq(n) AS (SELECT CAST(:first AS INTEGER) UNION ALL SELECT n + 1 FROM seq WHERE n + 1 < :last) "
        "      SELECT n FROM seq) AS q, "
        "     (WITH RECURSIVE rk(k) AS (SELECT 0 UNION ALL SELECT k + 1 FROM rk WHERE k + 1 < :ranks) "
        "      SELECT k FROM rk) AS r"
    )
    with session_scope(engine) as s:
        if s.get(RunRow, run_id) is None:
            s.add(RunRow(id=run_id, world_size=ranks))
            s.flush()
        s.execute(
            sql,
            dict(
                run=run_id,
                t0=f.T0,
                s1=SPIKE_FAR,
                s2=SPIKE_MID,
                halved=10_000,
                first=first,
                last=last,
                ranks=ranks,
            ),
        )


def add_nan_loss(engine, run_id: str, step: int) -> None:
    with session_scope(engine) as s:
        s.execute(
            StepMetricRow.__table__.update()
            .where(StepMetricRow.run_id == run_id, StepMetricRow.step == step)
            .values(loss=None, nonfinite="nan")
        )


def rows_per_rank(engine, run_id: str, rank: int = 0) -> int:
    with session_scope(engine) as s:
        return s.scalar(select(func.count()).where(StepMetricRow.run_id == run_id, StepMetricRow.rank == rank))


def test_config_validation():
    for kwargs, field in [
        ({"full_steps": -1}, "full_steps"),
        ({"mid_steps": 10, "full_steps": 20}, "mid_steps"),
        ({"mid_bucket": 1}, "mid_bucket"),
        ({"far_bucket": 25}, "far_bucket"),
        ({"rank_arrays_full_steps": -1}, "rank_arrays_full_steps"),
        ({"rank_arrays_bucket": 0}, "rank_arrays_bucket"),
    ]:
        with pytest.raises(ValueError, match=rf"^{field}: "):
            RetentionConfig(**kwargs)


def test_policy_projection_for_a_million_steps_is_bounded():
    cfg = RetentionConfig()
    assert tier_edges(999_999, cfg) == (900_000, 990_000)
    assert projected_rows(1_000_000, cfg) == 10_000 + 9_000 + 9_000
    assert projected_rows(9_999, cfg) == 9_999  # short runs are never touched
    # the scaled policy is the default divided by 20 in every dimension that matters here
    assert projected_rows(50_000, SCALED) * 20 == projected_rows(1_000_000, cfg)


@pytest.fixture
def long_run(engine):
    """20,000 steps on 2 ranks with spikes in the far and middle tiers and one NaN loss."""
    bulk_steps(engine, "long", 0, 20_000, ranks=2)
    add_nan_loss(engine, "long", NAN_STEP)
    return engine


def test_downsample_keeps_the_projected_rows_and_the_curve_stays_bounded(long_run):
    engine = long_run
    assert rows_per_rank(engine, "long") == 20_000
    with session_scope(engine) as s:
        result = downsample(s, "long", SCALED)
    assert result.rows_before == 40_000
    assert result.rows_after == 2 * projected_rows(20_000, SCALED) == 2 * (500 + 450 + 150)
    assert result.downsampled_below == 19_500
    with session_scope(engine) as s:
        t0 = time.perf_counter()
        full = read.loss_curve(s, "long", max_points=None)
        chart = read.loss_curve(s, "long", max_points=500)
        took = time.perf_counter() - t0
    assert len(full) == 1_100 and len(chart) <= 500
    print(
        f"loss curve of a 20k-step run after downsampling: {len(full)} rows, chart {len(chart)}, {took:.3f}s"
    )
    # tiers: 100-step buckets, then 10-step buckets, then every step
    assert [p["resolution"] for p in full[:3]] == [100, 100, 100]
    assert {p["resolution"] for p in full if 15_000 <= p["step"] < 19_500} == {10}
    assert [p["step"] for p in full if p["resolution"] == 1] == list(range(19_500, 20_000))
    # spikes stay visible in both tiers and in the chart; the NaN is flagged on its bucket
    far = next(p for p in full if p["step"] == 12_300)
    mid = next(p for p in full if p["step"] == 16_780)
    assert far["loss_max"] == pytest.approx(loss_at(SPIKE_FAR)) and far["loss_min"] < 2.01
    assert mid["loss_max"] == pytest.approx(loss_at(SPIKE_MID))
    assert max(p["loss_max"] for p in chart) == pytest.approx(loss_at(SPIKE_FAR))
    nan_bucket = next(p for p in full if p["step"] == 17_000)
    assert nan_bucket["nonfinite"] == "nan" and math.isfinite(nan_bucket["loss"])
    # a bucket's loss is the mean of its steps' losses
    expected = sum(loss_at(n) for n in range(12_300, 12_400)) / 100
    assert far["loss"] == pytest.approx(expected)


def test_bucket_summaries_of_the_other_columns(long_run):
    engine = long_run
    with session_scope(engine) as s:
        downsample(s, "long", SCALED)
        far = s.scalars(
            select(StepMetricRow).where(
                StepMetricRow.run_id == "long", StepMetricRow.rank == 1, StepMetricRow.step == 9_900
            )
        ).one()
        spike = s.scalars(
            select(StepMetricRow).where(
                StepMetricRow.run_id == "long", StepMetricRow.rank == 0, StepMetricRow.step == 12_300
            )
        ).one()
        halved = s.scalars(
            select(StepMetricRow).where(
                StepMetricRow.run_id == "long", StepMetricRow.rank == 0, StepMetricRow.step == 10_000
            )
        ).one()
    assert (far.resolution, far.tokens, far.grad_norm, far.mem_allocated) == (100, 100 * 100, 7.0, 1012)
    assert far.lr_scale == 1.0 and halved.lr_scale == 0.5
    assert far.event_id is None and far.skipped is False and spike.skipped is True


def test_downsample_is_idempotent_and_incremental_equals_one_shot(engine):
    bulk_steps(engine, "inc", 0, 12_000)
    with session_scope(engine) as s:
        downsample(s, "inc", SCALED)
    bulk_steps(engine, "inc", 12_000, 20_000)
    with session_scope(engine) as s:
        downsample(s, "inc", SCALED)
    bulk_steps(engine, "one", 0, 20_000)
    with session_scope(engine) as s:
        assert downsample(s, "one", SCALED).buckets_written > 0
        again = downsample(s, "one", SCALED)
    assert again.buckets_written == 0 and again.rows_after == again.rows_before
    with session_scope(engine) as s:
        inc = read.loss_curve(s, "inc", max_points=None)
        one = read.loss_curve(s, "one", max_points=None)
    assert [(p["step"], p["resolution"]) for p in inc] == [(p["step"], p["resolution"]) for p in one]
    for a, b in zip(inc, one, strict=True):
        assert a["loss"] == pytest.approx(b["loss"])
        assert a["loss_max"] == pytest.approx(b["loss_max"])


def test_ingest_skips_redelivered_steps_inside_downsampled_buckets(engine):
    bulk_steps(engine, "run-a", 0, 10_000)
    with session_scope(engine) as s:
        downsample_all(s, SCALED)
        before = s.scalar(select(func.count()).select_from(StepMetricRow))
        assert not ingest_event(s, f.step(1_234, 9.0))  # folded into a bucket already
        assert ingest_event(s, f.step(9_999, 2.0, ts=f.T0 + 20_000))  # recent: full resolution
        assert s.scalar(select(func.count()).select_from(StepMetricRow)) == before + 1


def test_short_run_is_left_alone(engine):
    bulk_steps(engine, "short", 0, 400)
    with session_scope(engine) as s:
        result = downsample(s, "short", SCALED)
        assert downsample(s, "missing", SCALED).rows_after == 0
    assert (result.rows_before, result.rows_after, result.buckets_written) == (400, 400, 0)


@pytest.mark.slow
def test_million_step_run_at_full_scale_stays_queryable(tmp_path):
    """The default policy on a real 1,000,000-step run (SQLite file)."""
    engine = make_engine(f"sqlite:///{tmp_path / 'million.db'}")
    init_db(engine)
    t0 = time.perf_counter()
    bulk_steps(engine, "m", 0, 1_000_000)
    t1 = time.perf_counter()
    with session_scope(engine) as s:
        result = downsample(s, "m")
    t2 = time.perf_counter()
    with session_scope(engine) as s:
        chart = read.loss_curve(s, "m", max_points=2000)
        t3 = time.perf_counter()
        recent = read.loss_curve(s, "m", from_step=999_000, max_points=None)
    print(
        f"1M steps: insert {t1 - t0:.1f}s, downsample {t2 - t1:.1f}s -> {result.rows_after} rows, "
        f"chart query {t3 - t2:.3f}s for {len(chart)} points"
    )
    assert result.rows_after == projected_rows(1_000_000, RetentionConfig()) == 28_000
    assert len(chart) <= 2000 and max(p["loss_max"] for p in chart) == pytest.approx(loss_at(SPIKE_FAR))
    assert len(recent) == 1_000
    # steady state: the controller downsamples as the run goes; each pass only folds the new range
    bulk_steps(engine, "m", 1_000_000, 1_001_000)
    t4 = time.perf_counter()
    with session_scope(engine) as s:
        result = downsample(s, "m")
    print(f"then +1000 steps: downsample {time.perf_counter() - t4:.2f}s -> {result.rows_after} rows")
    assert result.rows_after == projected_rows(1_001_000, RetentionConfig())
    engine.dispose()


def test_downsample_if_due_waits_for_every_steps_of_aged_rows(engine):
    cfg = RetentionConfig(full_steps=500, mid_steps=5_000, every_steps=1_000)
    bulk_steps(engine, "due", 0, 1_400)
    with session_scope(engine) as s:
        assert downsample_if_due(s, "due", 1_399, cfg) is None  # only 900 steps aged so far
        assert downsample_if_due(s, "missing", 1_399, cfg) is None
    bulk_steps(engine, "due", 1_400, 1_600)
    with session_scope(engine) as s:
        first = downsample_if_due(s, "due", 1_599, cfg)
        assert first is not None and first.downsampled_below == 1_100
        assert downsample_if_due(s, "due", 1_599, cfg) is None  # nothing new has aged
    assert rows_per_rank(engine, "due") == projected_rows(1_600, cfg)


def test_one_far_ahead_step_does_not_fold_the_real_rows(engine):
    """One valid event with step 10^15 among real steps: retention must not age the run to it."""
    cfg = RetentionConfig(full_steps=1_000, mid_steps=5_000, every_steps=100, max_step_jump=10_000)
    with session_scope(engine) as s:
        for n in range(300):
            ingest_event(s, f.step(n, ts=f.T0 + n))
            downsample_if_due(s, "run-a", n, cfg)
        ingest_event(s, f.step(MAX_STEP, ts=f.T0 + 300))
        downsample_if_due(s, "run-a", MAX_STEP, cfg)
        downsample_all(s, cfg)
        for n in range(300, 600):
            ingest_event(s, f.step(n, ts=f.T0 + n + 1))
            downsample_if_due(s, "run-a", n, cfg)
        rows = s.execute(select(StepMetricRow.step, StepMetricRow.resolution).where(StepMetricRow.step < MAX_STEP)).all()
        assert s.scalar(select(RunRow.downsampled_below).where(RunRow.id == "run-a")) == 0
    assert sorted(rows) == [(n, 1) for n in range(600)]
