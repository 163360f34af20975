"""Per-rank arrays: the loss summary's outliers, and every array bounded and checked at decode."""

from __future__ import annotations

import math

import pytest

from cliffguard.core.enums import EventType
from cliffguard.core.events import MAX_STEP, SchemaError, decode_event, encode_event, make_event
from cliffguard.core.floats import dumps
from cliffguard.core.rank_arrays import (
    MAX_OUTLIERS,
    MAX_RANKS_PER_EVENT,
    check_node_heartbeat,
    is_detail,
    is_run_level,
    rank_entries,
    summarize_losses,
)
from tests.core.test_events import PAYLOADS, STEP


def ranks_data(n: int, first: int = 0) -> dict:
    return {"first_rank": first, "steps": 10, "step_time_s": [0.1] * n, "data_wait_s": [0.0] * n,
            "comm_exposed_s": [0.01] * n, "mfu": [0.4] * n, "tokens_per_s": [1e3] * n,
            "mem_allocated": [1] * n, "mem_reserved": [2] * n, "loss_local": [2.0] * n}


def test_healthy_losses_have_no_outlier_and_no_vector():
    losses = [2.0 + 0.01 * (r % 5) for r in range(64)]
    s = summarize_losses(losses)
    assert s["outliers"] == [] and "losses" not in s
    assert s["min"] == 2.0 and s["max"] == 2.04 and losses[s["argmax"]] == 2.04 and s["argmin"] == 0


def test_an_outlier_and_a_nan_are_named_worst_first_with_the_full_vector():
    losses = [2.0 + 0.01 * (r % 3) for r in range(16)]
    losses[5], losses[9] = 9.0, float("nan")
    s = summarize_losses(losses)
    assert s["outliers"] == [9, 5] and s["outlier_losses"][1] == 9.0 and math.isnan(s["outlier_losses"][0])
    assert s["argmax"] == 5 and len(s["losses"]) == 16


def test_the_relative_floor_keeps_identical_ranks_quiet():
    losses = [2.0] * 7 + [2.05]  # MAD 0: without the floor any difference would be an outlier
    assert summarize_losses(losses)["outliers"] == []
    assert summarize_losses([2.0] * 7 + [2.5])["outliers"] == [7]


def test_all_nonfinite_and_caps():
    s = summarize_losses([float("nan")] * 3)
    assert s["outliers"] == [0, 1, 2] and math.isnan(s["median"])
    many = [2.0] * 200 + [float("inf")] * 100
    assert len(summarize_losses(many)["outliers"]) == MAX_OUTLIERS
    big = [2.0] * (MAX_RANKS_PER_EVENT + 1)
    big[0] = 100.0
    assert "losses" not in summarize_losses(big)  # only the named outliers beyond the bound


def test_a_run_level_step_round_trips_and_is_checked_against_world():
    losses = [2.0, 2.0, 2.0, 9.0]
    data = {**STEP, "rank_losses": summarize_losses(losses)}
    ev = make_event(EventType.STEP, "r", 3, data, world=4)
    back = decode_event(encode_event(ev))
    assert is_run_level(back.data) and not is_detail(back.data) and back.data["rank_losses"]["outliers"] == [3]
    with pytest.raises(SchemaError, match="argmax"):
        make_event(EventType.STEP, "r", 3, data, world=3)
    bad = {**data, "rank_losses": {**data["rank_losses"], "losses": [2.0]}}
    with pytest.raises(SchemaError, match="losses"):
        make_event(EventType.STEP, "r", 3, bad, world=4)
    bad = {**data, "rank_losses": {**data["rank_losses"], "outlier_losses": []}}
    with pytest.raises(SchemaError, match="outlier_losses"):
        make_event(EventType.STEP, "r", 3, bad, world=4)
    assert not is_run_level(STEP) and is_detail({**STEP, "detail": True})


def test_ranks_arrays_are_bounded_and_consistent():
    ev = make_event(EventType.RANKS, "r", 10, ranks_data(4, first=4), world=8)
    assert [r for r, _ in rank_entries(ev.data)] == [4, 5, 6, 7]
    assert dict(rank_entries(ev.data))[5]["step_time_s"] == 0.1
    with pytest.raises(SchemaError, match="first_rank"):
        make_event(EventType.RANKS, "r", 10, ranks_data(4, first=5), world=8)
    uneven = {**ranks_data(4), "mfu": [0.4] * 3}
    with pytest.raises(SchemaError, match="different lengths"):
        make_event(EventType.RANKS, "r", 10, uneven, world=8)
    with pytest.raises(SchemaError, match="at least one"):
        make_event(EventType.RANKS, "r", 10, ranks_data(0), world=8)
    with pytest.raises(SchemaError, match="exceed"):
        make_event(EventType.RANKS, "r", 10, ranks_data(MAX_RANKS_PER_EVENT + 1), world=10**6)
    with pytest.raises(SchemaError, match=r"mem_allocated\[0\]"):
        make_event(EventType.RANKS, "r", 10, {**ranks_data(1), "mem_allocated": [1.5]}, world=1)


def test_node_heartbeats_are_bounded_and_all_or_nothing():
    beat = {"state": "running", "ranks": [0, 1], "steps": [5, 4], "ages_s": [0.1, 31.0], "collectives": ["", "all_reduce"]}
    ev = decode_event(encode_event(make_event(EventType.HEARTBEAT, "r", 5, beat, world=2)))
    assert ev.data["collectives"] == ["", "all_reduce"]
    assert make_event(EventType.HEARTBEAT, "r", 5, PAYLOADS[EventType.HEARTBEAT]).data == {"state": "running"}
    for field, value, match in [("ranks", [0, 2], "outside world"), ("steps", [5, MAX_STEP + 1], r"steps\[1\]"),
                                ("ages_s", [0.1, -1.0], r"ages_s\[1\]"), ("collectives", ["", "x" * 65], "longer"),
                                ("steps", [5], "different lengths")]:
        with pytest.raises(SchemaError, match=match):
            make_event(EventType.HEARTBEAT, "r", 5, {**beat, field: value}, world=2)
    partial = {k: v for k, v in beat.items() if k != "ages_s"}
    with pytest.raises(SchemaError, match="ages_s"):
        make_event(EventType.HEARTBEAT, "r", 5, partial, world=2)
    raw = dumps({**make_event(EventType.HEARTBEAT, "r", 5, beat, world=2).to_dict(),
                 "data": {**beat, "ages_s": [0.1, "NaN"]}})
    with pytest.raises(SchemaError, match="finite"):
        decode_event(raw)


def test_the_node_heartbeat_check_finds_the_first_bad_element_as_element_by_element():
    """``check_node_heartbeat`` skips its per-element loop when no element can fail: on random
    arrays (NaN, infinities, huge ages, ranks and steps at and past their bounds, long names) it
    accepts and rejects exactly as checking each element in order does, with the same reason."""
    import random

    rng = random.Random(5)

    def reference(data, world):
        for i, (r, s, age, coll) in enumerate(zip(data["ranks"], data["steps"], data["ages_s"], data["collectives"],
                                                  strict=True)):
            if not 0 <= r < world:
                return (f"data.ranks[{i}]", f"rank {r} outside world of {world}")
            if not 0 <= s <= MAX_STEP:
                return (f"data.steps[{i}]", f"must be in [0, {MAX_STEP}]")
            if not (math.isfinite(age) and age >= 0):
                return (f"data.ages_s[{i}]", "must be finite and >= 0")
            if len(coll) > 64:
                return (f"data.collectives[{i}]", "longer than 64 characters")
        return None

    def outcome(data, world):
        try:
            check_node_heartbeat(data, world, MAX_STEP)
        except SchemaError as exc:
            return (exc.field, exc.reason)
        return None

    def pick(good, bad):
        return rng.choice(bad) if rng.random() < 0.08 else rng.choice(good)

    failures = 0
    for _ in range(3000):
        n, world = rng.randint(1, 6), rng.choice([1, 4, 8])
        data = {"state": "running", "ranks": [pick([0, world - 1], [world, -1, 7]) for _ in range(n)],
                "steps": [pick([0, 5, MAX_STEP], [MAX_STEP + 1, -1]) for _ in range(n)],
                "ages_s": [pick([0.0, 0.5, 1e308, -0.0], [math.nan, math.inf, -math.inf, -1e-9]) for _ in range(n)],
                "collectives": [pick(["", "allreduce", "x" * 64], ["x" * 65]) for _ in range(n)]}
        want = reference(data, world)
        failures += want is not None
        assert outcome(data, world) == want, data
    assert 500 < failures < 2500  # both outcomes were exercised
