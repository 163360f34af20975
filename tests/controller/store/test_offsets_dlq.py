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


def test_dead_letters_are_counted_per_run_by_the_message_key_with_first_and_newest_times(engine):
    from cliffguard.controller.edge_classify import DeadLetter
    from cliffguard.controller.store.dlq import count_dead_letters

    def letter(reason: str, key: bytes | None, detail: str = "d") -> DeadLetter:
        return DeadLetter(reason, detail, "p.metrics", 0, 0, b"{}", key)

    with session_scope(engine) as s:
        count_dead_letters(s, [letter("unsigned", b"run-a"), letter("unsigned", b"run-a", "newest"),
                               letter("unsigned", b"run-b"), letter("undecodable", None)], now=10.0)
    with session_scope(engine) as s:
        count_dead_letters(s, [letter("unsigned", b"run-a", "later")], now=20.0)
    with session_scope(engine) as s:
        runs = {(r["run_id"], r["reason"]): r for r in read.dlq_runs(s)}
        by_topic = {r["reason"]: r["count"] for r in read.dlq_counts(s)}
        only_a = read.dlq_runs(s, "run-a")
    assert set(runs) == {("run-a", "unsigned"), ("run-b", "unsigned")}  # a message without a key is no run's
    a = runs[("run-a", "unsigned")]
    assert (a["count"], a["first_ts"], a["last_ts"], a["last_detail"]) == (3, 10.0, 20.0, "later")
    assert by_topic == {"unsigned": 4, "undecodable": 1}
    assert [r["run_id"] for r in only_a] == ["run-a"]
