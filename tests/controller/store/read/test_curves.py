"""The loss curve (full resolution and bucketed), the speaking rank's step rows, redone steps."""

from __future__ import annotations

import math

import pytest

from cliffguard.controller.store import read
from cliffguard.controller.store.db import session_scope
from cliffguard.controller.store.ingest import ingest_events
from testing import store_factory as f
from tests.controller.store.read.conftest import loss_at


def test_loss_curve_at_full_resolution(run_1000):
    with session_scope(run_1000) as s:
        curve = read.loss_curve(s, "run-a", max_points=None)
    assert [p["step"] for p in curve] == list(range(1000))
    assert all(p["loss"] == p["loss_min"] == p["loss_max"] == loss_at(p["step"]) for p in curve)
    assert {p["resolution"] for p in curve} == {1}


@pytest.mark.parametrize("max_points", [1, 7, 100, 999])
def test_loss_curve_is_bounded_by_max_points_and_keeps_the_spike(run_1000, max_points):
    with session_scope(run_1000) as s:
        curve = read.loss_curve(s, "run-a", max_points=max_points)
    assert 0 < len(curve) <= max_points
    assert max(p["loss_max"] for p in curve) == pytest.approx(loss_at(437))
    assert min(p["loss_min"] for p in curve) == pytest.approx(loss_at(999))
    width = curve[0]["resolution"]
    assert width > 1 and all(p["step"] % width == 0 for p in curve)
    # the bucket mean is the mean of the raw losses in it
    first = [loss_at(i) for i in range(width)]
    assert curve[0]["loss"] == pytest.approx(sum(first) / len(first))


def test_loss_curve_step_range_and_rank(run_1000):
    with session_scope(run_1000) as s:
        window = read.loss_curve(s, "run-a", from_step=430, to_step=440, max_points=None)
        assert [p["step"] for p in window] == list(range(430, 441))
        assert read.loss_curve(s, "run-a", rank=1, from_step=999) != []
        assert read.loss_curve(s, "run-a", rank=5) == []
        assert read.loss_curve(s, "nope") == []


def _two_ranks_with_a_rollback(engine) -> None:
    """Steps 0-5 on ranks 1 and 2 only (rank 0 never reports), a rollback replaying steps 3-5
    with lower losses, per-layer norms on even steps, a NaN at step 4 and +inf at the replayed 5."""
    events = []
    for i, st in enumerate([0, 1, 2, 3, 4, 5, 3, 4, 5]):
        replay = i >= 6
        loss = math.nan if (st == 4 and not replay) else math.inf if (st == 5 and replay) else 3.0 - 0.1 * i
        norms = {"layer_grad_norms": {"h.0": 0.1 * st, "h.1": math.nan}} if st % 2 == 0 else {}
        events += [f.step(st, loss, run="rb", rank=r, world=3, ts=f.T0 + i, **norms) for r in (2, 1)]
    with session_scope(engine) as s:
        ingest_events(s, events)


def test_without_rank_0_the_lowest_rank_speaks(engine):
    _two_ranks_with_a_rollback(engine)
    with session_scope(engine) as s:
        assert read.speaker_rank(s, "rb") == 1
        assert read.speaker_rank(s, "nope") is None
        rows = read.step_rows(s, "rb")
        assert {r["rank"] for r in rows} == {1}
        assert read.loss_curve(s, "rb", max_points=None) == read.loss_curve(s, "rb", rank=1, max_points=None)


def test_step_rows_in_reported_order_with_non_finite_losses(engine):
    _two_ranks_with_a_rollback(engine)
    with session_scope(engine) as s:
        rows = read.step_rows(s, "rb")
        newest = read.step_rows(s, "rb", newest=2)
        every = read.step_rows(s, "rb", all_ranks=True, order="ingested")
        full = read.step_rows(s, "rb", full_resolution=True)
        assert read.step_rows(s, "nope") == []
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4, 5, 3, 4, 5]  # both branches of the rollback
    assert math.isnan(rows[4]["loss"]) and rows[4]["nonfinite"] == "nan"
    assert rows[8]["loss"] == math.inf and rows[8]["nonfinite"] == "inf"
    assert [r["step"] for r in newest] == [4, 5]
    assert [r["step"] for r in rows if r["layer_grad_norms"]] == [0, 2, 4, 4]
    assert rows[2]["layer_grad_norms"]["h.0"] == pytest.approx(0.2)
    assert math.isnan(rows[2]["layer_grad_norms"]["h.1"])  # stored as "NaN" in JSON
    assert rows[1]["layer_grad_norms"] is None
    assert [(r["step"], r["rank"]) for r in every[:4]] == [(0, 2), (0, 1), (1, 2), (1, 1)]  # as ingested
    assert [r["id"] for r in full] == [r["id"] for r in rows]  # nothing folded yet


def test_redone_steps_count_the_replayed_steps_of_the_speaking_rank(engine, run_1000):
    _two_ranks_with_a_rollback(engine)
    with session_scope(engine) as s:
        assert read.redone_steps(s, "rb") == 3
        assert read.redone_steps(s, "run-a") == 0
        assert read.redone_steps(s, "nope") == 0
