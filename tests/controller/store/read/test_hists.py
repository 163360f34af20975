"""Gradient histograms: newest first, at or before a step, of the speaking rank by default."""

from __future__ import annotations

import pytest

from cliffguard.controller.store import read
from cliffguard.controller.store.db import session_scope
from cliffguard.controller.store.ingest import ingest_events
from testing import store_factory as f


def test_grad_hists_newest_first_at_or_before_a_step(run_1000):
    with session_scope(run_1000) as s:
        assert [h["step"] for h in read.grad_hists(s, "run-a")] == [900]
        assert [h["step"] for h in read.grad_hists(s, "run-a", step=450, limit=2)] == [400, 300]
        assert len(read.grad_hists(s, "run-a", limit=None)) == 10
        assert read.grad_hists(s, "run-a", rank=1) == []
        h = read.grad_hists(s, "run-a", step=100)[0]
    assert h["layers"]["h.0"]["p99"] == pytest.approx(1e-3 * 101) and h["edges"][0] == 1e-6


def test_grad_hists_of_the_lowest_rank_that_sent_any(engine):
    with session_scope(engine) as s:
        ingest_events(s, [f.grad_hist(20, rank=1)])
        assert [(h["rank"], h["step"]) for h in read.grad_hists(s, "run-a")] == [(1, 20)]
        ingest_events(s, [f.grad_hist(10, rank=0)])
        assert [(h["rank"], h["step"]) for h in read.grad_hists(s, "run-a")] == [(0, 10)]
        assert read.grad_hists(s, "nope") == []
