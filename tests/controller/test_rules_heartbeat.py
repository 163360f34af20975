"""Heartbeat loss (controller/rules/heartbeat.py): every branch and persistence."""

from __future__ import annotations

import json

import pytest

from cliffguard.controller.rules.heartbeat import PERSIST_S, HeartbeatConfig, HeartbeatRule
from cliffguard.core.enums import Level
from cliffguard.core.ranks import rank_spans


def test_config_rejects_bad_values_naming_the_field():
    with pytest.raises(ValueError, match="^warn_after_s:"):
        HeartbeatConfig(warn_after_s=0)
    with pytest.raises(ValueError, match="^warn_after_s:"):
        HeartbeatConfig(warn_after_s=60, critical_after_s=30)


def test_silence_warns_then_goes_critical_once_per_rank():
    rule = HeartbeatRule(HeartbeatConfig(warn_after_s=30, critical_after_s=120))
    rule.seen(0, 1000.0, 10)
    rule.seen(1, 1000.0, 10)
    assert rule.tick(1029.0) == []
    warn = rule.tick(1031.0)  # one verdict names both
    assert [(v.rule, v.rank, v.level, v.step) for v in warn] == [("heartbeat", 0, Level.WARN, 10)]
    assert warn[0].evidence["ranks"] == "0-1" and warn[0].evidence["count"] == 2
    assert warn[0].evidence["silent_s"] == [pytest.approx(31.0)] * 2 and "ranks 0-1 (2 ranks) silent for 31s" in warn[0].message
    assert rule.tick(1050.0) == []
    rule.seen(1, 1100.0, 12)  # rank 1 speaks again: re-armed
    crit = rule.tick(1121.0)
    assert [(v.rank, v.level) for v in crit] == [(0, Level.CRITICAL)]
    assert [(v.rank, v.level) for v in rule.tick(1200.0)] == [(1, Level.WARN)]  # rank 0: reported once
    assert [(v.rank, v.level) for v in rule.tick(1221.0)] == [(1, Level.CRITICAL)]
    assert rule.tick(5000.0) == []


def test_out_of_order_timestamps_do_not_move_the_clock_back():
    rule = HeartbeatRule()
    rule.seen(0, 100.0, 5)
    rule.seen(0, 90.0, 4)
    assert rule._last == {0: (100.0, 5)}


def test_packed_state_round_trips_and_the_older_layouts_still_load():
    rule = HeartbeatRule()
    for r in range(4):
        rule.seen(r, 100.0 + r, 7, "all_reduce" if r else "")
    rule.tick(140.0)
    again = HeartbeatRule()
    again.load_state_dict(json.loads(json.dumps(rule.state_dict())))
    assert again.state_dict() == rule.state_dict() and again.tick(300.0) == rule.tick(300.0)
    assert again._collective == {r: c for r, c in rule._collective.items() if c} and again._reported == rule._reported
    for stored in ({"last": {"2": [50.0, 3]}, "progress": {"2": [3, 40.0]}},
                   {"last": {"ranks": [2], "a": [50.0], "b": [3]}, "progress": {"ranks": [2], "a": [3], "b": [40.0]}}):
        older = HeartbeatRule()
        older.load_state_dict(stored)
        assert older._last == {2: (50.0, 3)} and older._progress == {2: (3, 40.0)}


def test_a_large_run_state_is_small_and_re_encoded_only_when_it_must_be():
    rule = HeartbeatRule()
    for r in range(16_384):
        rule.seen(r, 1000.0, 5, "")
    first = rule.state_dict()
    assert len(json.dumps(first)) < 20_000  # packed: not 16k numbers per column
    rule.seen(3, 1001.0, 6)  # the run's time moved less than PERSIST_S: the snapshot stands
    assert rule.state_dict() is first
    rule.seen(3, 1000.0 + PERSIST_S, 7)
    second = rule.state_dict()
    assert second is not first and rule.state_dict() is second
    rule.seen(20_000, 1000.0 + PERSIST_S, 7)  # a new rank waits for the next snapshot too
    assert rule.state_dict() is second
    rule.tick(1000.0 + PERSIST_S + 31)  # silences reported: at once
    assert rule.state_dict() is not second
    twin = HeartbeatRule()
    twin.load_state_dict(json.loads(json.dumps(rule.state_dict())))
    assert twin._last == rule._last and twin._progress == rule._progress


def test_a_stopped_fleet_is_one_alert_per_level_and_tick_naming_rank_ranges():
    rule = HeartbeatRule(HeartbeatConfig(warn_after_s=30, critical_after_s=120, hung_after_s=0))
    for r in range(4096):
        rule.seen(r, 1000.0 + (r // 1024) * 0.25, 9, "all_reduce")  # nodes beat at 4 times
    rule.seen(5000, 1000.0, 9)
    warn = rule.tick(1031.0)
    assert len(warn) == 1 and warn[0].level is Level.WARN and warn[0].rank == 0
    assert warn[0].evidence["ranks"] == "0-4095, 5000" and warn[0].evidence["count"] == 4097
    assert "ranks 0-4095, 5000 (4097 ranks) silent for 30-31s (last step 9, inside all_reduce)" in warn[0].message
    assert rule.tick(1032.0) == []
    crit = rule.tick(1130.0)
    assert [(v.level, v.evidence["count"]) for v in crit] == [(Level.CRITICAL, 4097)]
    assert rank_spans([7, 1, 2, 3, 9, 10]) == "1-3, 7, 9-10" and rank_spans([]) == ""


def test_finished_runs_and_disabled_rule_report_nothing():
    rule = HeartbeatRule()
    rule.seen(0, 0.0, 1)
    rule.ended()
    assert rule.tick(1e6) == []
    rule.started()  # a new life: old ranks are forgotten until they speak
    assert rule.tick(1e6) == []
    rule.seen(1, 1e6, 0)
    assert [v.rank for v in rule.tick(1e6 + 31)] == [1]
    off = HeartbeatRule(HeartbeatConfig(enabled=False))
    off.seen(0, 0.0, 1)
    assert off.tick(1e6) == []


def test_state_dict_round_trips_through_json():
    rule = HeartbeatRule()
    rule.seen(0, 0.0, 1)
    rule.seen(1, 0.0, 1)
    rule.tick(40.0)
    twin = HeartbeatRule()
    twin.load_state_dict(json.loads(json.dumps(rule.state_dict())))
    assert twin.tick(50.0) == []  # the warn was already reported
    assert [(v.rank, v.level, v.evidence["ranks"]) for v in twin.tick(130.0)] == [(0, Level.CRITICAL, "0-1")]


def test_ranks_passing_hung_after_s_seconds_apart_do_not_name_the_waiting_ranks():
    # 4 nodes of 2 ranks beat 1 s apart; rank 5 hangs outside any collective at step 7 while
    # the others wait in all_reduce: the first waiting ranks to pass hung_after_s are not named.
    rule = HeartbeatRule(HeartbeatConfig(hung_after_s=45.0))
    for node in range(4):
        for r in (2 * node, 2 * node + 1):
            rule.seen(r, 100.0 + node, 7, "" if r == 5 else "all_reduce")
    named = []
    for t in range(140, 160):
        for node in range(4):  # every node keeps beating (alive), still at step 7
            for r in (2 * node, 2 * node + 1):
                rule.seen(r, t - 0.5 + node * 0.1, 7, "" if r == 5 else "all_reduce")
        named += [v for v in rule.tick(float(t)) if v.rule == "rank_hung"]
    assert [v.evidence["ranks"] for v in named] == [[5]]


def test_a_ranks_chunk_marks_its_ranks_exactly_as_one_sign_of_life_each():
    """``seen_span`` (a ``ranks`` chunk's ranks in one loop) leaves the rule as ``seen`` per rank
    does: newest times and steps, progress, re-armed silences and hung ranks cleared, whatever
    order the signs came in."""
    import random

    rng = random.Random(5)
    for _ in range(30):
        one, span = (HeartbeatRule(HeartbeatConfig(warn_after_s=5, critical_after_s=10, hung_after_s=3))
                     for _ in range(2))
        for _ in range(40):
            ts, step = 1000 + rng.uniform(0, 200), rng.randrange(0, 50)
            if rng.random() < 0.5:
                rank, coll = rng.randrange(0, 20), rng.choice([None, "", "all_reduce"])
                for rule in (one, span):
                    rule.seen(rank, ts, step, coll)
                continue
            first, n = rng.randrange(0, 16), rng.randrange(0, 8)
            for rank in range(first, first + n):
                one.seen(rank, ts, step)
            span.seen_span(first, n, ts, step)
            if rng.random() < 0.3:
                now = ts + rng.uniform(0, 30)
                assert one.tick(now) == span.tick(now)
        assert (one._last, one._progress, one._reported, one._hung, one._newest) == \
            (span._last, span._progress, span._reported, span._hung, span._newest)
