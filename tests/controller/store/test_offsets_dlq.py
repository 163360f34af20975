"""Consumer offsets and dead-letter counters; SQLite and PostgreSQL."""

from __future__ import annotations

import pytest

from cliffguard.controller.store import read
from cliffguard.controller.store.db import session_scope
from cliffguard.controller.store.dlq import MAX_DETAIL_CHARS, count_dead_letter
from cliffguard.controller.store.ingest import ingest_events
from cliffguard.controller.store.offsets import load_offsets, save_offsets
from testing import store_factory as f


def test_offsets_round_trip_and_newer_values_replace_older(engine):
    with session_scope(engine) as s:
        save_offsets(s, "ctl", {("m", 0): 10, ("m", 1): 20, ("other", 0): 5}, now=1.0)
    with session_scope(engine) as s:
        save_offsets(s, "ctl", {("m", 0): 42}, now=2.0)
    with session_scope(engine) as s:
        assert load_offsets(s, "ctl", "m") == {0: 42, 1: 20}
        assert load_offsets(s, "ctl", "other") == {0: 5}
        assert load_offsets(s, "another-group", "m") == {}


def test_negative_offset_is_rejected(engine):
    with session_scope(engine) as s, pytest.raises(ValueError, match="^offset: "):
        save_offsets(s, "ctl", {("m", 0): -1})


def test_offsets_commit_or_roll_back_together_with_the_state_they_produced(engine):
    batch = [f.step(1), f.step(2)]
    with pytest.raises(RuntimeError):
        with session_scope(engine) as s:
            ingest_events(s, batch)
            save_offsets(s, "ctl", {("m", 0): 2})
            raise RuntimeError("crash before commit")
    with session_scope(engine) as s:
        assert load_offsets(s, "ctl", "m") == {}  # so the batch is re-read...
        assert read.loss_curve(s, "run-a") == []  # ...and nothing of it was applied
    with session_scope(engine) as s:
        ingest_events(s, batch)
        save_offsets(s, "ctl", {("m", 0): 2})
    with session_scope(engine) as s:
        assert load_offsets(s, "ctl", "m") == {0: 2}
        assert [p["step"] for p in read.loss_curve(s, "run-a")] == [1, 2]


def test_dead_letters_are_counted_per_topic_and_reason_with_the_newest_detail(engine):
    with session_scope(engine) as s:
        count_dead_letter(s, "p.metrics", "invalid_json", "line 1 column 2", now=10.0)
        count_dead_letter(s, "p.metrics", "invalid_json", "line 3 column 1", now=11.0)
        count_dead_letter(s, "p.metrics", "oversized", "x" * (MAX_DETAIL_CHARS + 50), n=3, now=12.0)
    with session_scope(engine) as s:
        rows = read.dlq_counts(s)
    assert [(r["reason"], r["count"]) for r in rows] == [("oversized", 3), ("invalid_json", 2)]
    assert rows[1]["last_detail"] == "line 3 column 1" and rows[1]["last_ts"] == 11.0
    assert len(rows[0]["last_detail"]) == MAX_DETAIL_CHARS


def test_dead_letter_count_must_be_positive(engine):
    with session_scope(engine) as s, pytest.raises(ValueError, match="^n: "):
        count_dead_letter(s, "t", "r", "d", n=0)
