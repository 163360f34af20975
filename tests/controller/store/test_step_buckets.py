"""Step rows written at a coarser resolution (``RetentionConfig.write_bucket``): what is folded,
what stays exact, and that retention's buckets come out as if every step had been written."""

from __future__ import annotations

import math

import pytest
from sqlalchemy import select

from cliffguard.controller.store import read
from cliffguard.controller.store.db import session_scope
from cliffguard.controller.store.ingest import ingest_events, ingest_steps
from cliffguard.controller.store.models import StepMetricRow
from cliffguard.controller.store.retention import RetentionConfig, downsample
from cliffguard.controller.store.step_buckets import bucket_rows
from cliffguard.core.enums import GuardDecision
from testing import store_factory as f

SM = StepMetricRow


def _loss(n: int) -> float:
    return 2.0 + 1.0 / (n + 1) + (4.0 if n == 13 else 0.0)


def _events(n: int = 25, run: str = "run-a"):
    evs = [f.step(s, _loss(s), run=run, tokens=100 + s, grad_norm=1.0 + s % 7, lr_scale=1.0 if s < 17 else 0.5)
           for s in range(n)]
    evs[7] = f.step(7, math.nan, run=run)
    evs[5] = f.step(5, _loss(5), run=run, guard=GuardDecision.SKIP, skipped=True)
    return evs


def _rows(session, run="run-a"):
    return session.execute(select(SM.step, SM.resolution, SM.loss, SM.loss_min, SM.loss_max, SM.tokens, SM.grad_norm,
                                  SM.lr_scale, SM.skipped, SM.event_id).where(SM.run_id == run)
                           .order_by(SM.step)).all()


def test_width_one_writes_every_step_and_a_wider_bucket_keeps_the_exact_ones(engine):
    evs = _events()
    spike = evs[13].id
    with session_scope(engine) as s:
        ingest_events(s, evs, steps=False)
        assert ingest_steps(s, evs, write_bucket=10, exact={spike}) == 7
        rows = _rows(s)
    by_step = {r.step: r for r in rows}
    # exact: the guard's skip (5), the NaN (7), the named spike (13), the newest step (24)
    for step in (5, 7, 13, 24):
        assert by_step[step].resolution == 1 and by_step[step].event_id == evs[step].id
    assert by_step[13].loss == pytest.approx(_loss(13))
    # folded: [0, 10) without 5 and 7, [10, 20) without 13, [20, 24)
    folded = {0: [0, 1, 2, 3, 4, 6, 8, 9], 10: [10, 11, 12, 14, 15, 16, 17, 18, 19], 20: [20, 21, 22, 23]}
    for first, steps in folded.items():
        r = by_step[first]
        assert r.resolution == len(steps)
        assert r.loss == pytest.approx(sum(_loss(n) for n in steps) / len(steps))
        assert (r.loss_min, r.loss_max) == (pytest.approx(min(map(_loss, steps))), pytest.approx(max(map(_loss, steps))))
        assert r.tokens == sum(100 + n for n in steps)  # a sum
        assert r.grad_norm == max(1.0 + n % 7 for n in steps)  # a peak
        assert r.lr_scale == min(1.0 if n < 17 else 0.5 for n in steps)  # the lowest scale in force
        assert r.skipped is False
    assert len(rows) == 7


def test_the_same_batch_again_writes_nothing_and_the_curve_reads_the_buckets(engine):
    evs = _events()
    with session_scope(engine) as s:
        ingest_events(s, evs, steps=False)
        ingest_steps(s, evs, write_bucket=10)
        assert ingest_steps(s, evs, write_bucket=10) == 0  # a retried batch: the same bucket ids
        curve = read.loss_curve(s, "run-a")
    assert [p["step"] for p in curve] == [0, 5, 7, 10, 20, 24]
    assert [p["resolution"] for p in curve] == [8, 1, 1, 10, 4, 1]
    assert math.isnan(curve[2]["loss"])
    assert curve[3]["loss_max"] == pytest.approx(_loss(13))  # a step no one named exact: still the bucket's peak


def test_retention_completes_written_buckets_as_if_every_step_had_been_written(engine):
    """Written at 5 steps (with one batch boundary splitting a bucket) and aged by retention into
    10-step buckets, the rows equal those of the same steps written one by one and aged alike."""
    cfg = RetentionConfig(full_steps=0, mid_steps=1_000, mid_bucket=10, far_bucket=100, write_bucket=5)
    exact_run, bucket_run = _events(300, "exact"), _events(300, "bucket")
    with session_scope(engine) as s:
        ingest_events(s, exact_run)
        ingest_events(s, bucket_run, steps=False)
        for lo, hi in ((0, 123), (123, 300)):
            ingest_steps(s, bucket_run[lo:hi], write_bucket=cfg.write_bucket)
        assert len(_rows(s, "bucket")) < len(_rows(s, "exact")) / 4
        downsample(s, "exact", cfg, newest_step=299)
        downsample(s, "bucket", cfg, newest_step=299)
        exact, bucketed = _rows(s, "exact"), _rows(s, "bucket")
    assert [(r.step, r.resolution) for r in exact] == [(r.step, r.resolution) for r in bucketed]
    for a, b in zip(exact, bucketed, strict=True):
        assert (b.loss, b.loss_min, b.loss_max, b.grad_norm, b.lr_scale) == pytest.approx(
            (a.loss, a.loss_min, a.loss_max, a.grad_norm, a.lr_scale), nan_ok=True)
        assert (b.tokens, b.skipped) == (a.tokens, a.skipped)


def test_per_rank_rows_and_ranks_are_bucketed_apart():
    rows = [{"event_id": f"e{r}{s}", "run_id": "r", "rank": r, "step": s, "resolution": 1, "nonfinite": None,
             "guard": "ok", "loss": 1.0, "ts": float(s), **{k: None for k in ("rule_median", "rule_sigma", "rule_level")}}
            for r in (0, 1) for s in range(4)]
    for row in rows:
        row.update({m: 1.0 for m in ("loss_local", "lr", "lr_scale", "grad_norm", "tokens_per_s", "mfu", "step_time_s",
                                     "data_wait_s", "comm_exposed_s", "compute_s", "loss_scale")},
                   tokens=1, mem_allocated=1, mem_reserved=1, clipped_layers=0, skipped=False, layer_grad_norms=None)
    out = bucket_rows(rows, 10)
    assert sorted((r["rank"], r["step"], r["resolution"]) for r in out) == [(0, 0, 3), (0, 3, 1), (1, 0, 3), (1, 3, 1)]
    assert bucket_rows(rows, 1) is rows


def test_write_bucket_must_divide_the_mid_bucket():
    with pytest.raises(ValueError, match="write_bucket"):
        RetentionConfig(mid_bucket=10, write_bucket=3)
    with pytest.raises(ValueError, match="write_bucket"):
        RetentionConfig(write_bucket=0)
