"""Straggler ranks (controller/rules/straggler.py): branches, persistence, suite figures."""

from __future__ import annotations

import json

import pytest

from cliffguard.controller.rules.straggler import StragglerConfig, StragglerRule, busy_time
from cliffguard.core.enums import Level
from tests.controller.synthetic_metrics import rank_suite


@pytest.mark.parametrize(
    "kwargs, field",
    [({"window": 3}, "window"), ({"ratio": 1.0}, "ratio"), ({"min_excess_s": -1}, "min_excess_s")],
)
def test_config_rejects_bad_values_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=f"^{field}:"):
        StragglerConfig(**kwargs)


def step(busy: float, wait: float = 0.0) -> dict:
    return {"step_time_s": busy + wait, "comm_exposed_s": wait}


def test_busy_time_excludes_exposed_communication():
    assert busy_time({"step_time_s": 1.0, "comm_exposed_s": 0.25}) == 0.75
    assert busy_time({"step_time_s": 1.0, "comm_exposed_s": 2.0}) == 1.0  # inconsistent: whole step
    assert busy_time({"step_time_s": 0.0}) is None
    assert busy_time({"step_time_s": float("nan")}) is None


def feed(rule, steps, times):
    """times: rank -> busy seconds (the others wait in communication for the slowest)."""
    out = []
    for s in steps:
        slowest = max(times.values())
        for r, t in sorted(times.items()):
            out += rule.observe(s, r, step(t, slowest - t))
    return out


def test_slow_rank_is_flagged_once_with_its_onset_and_re_armed_after_recovery():
    rule = StragglerRule(StragglerConfig(window=10))
    assert feed(rule, range(20), {0: 0.1, 1: 0.1, 2: 0.1}) == []
    out = feed(rule, range(20, 40), {0: 0.1, 1: 0.3, 2: 0.1})
    assert [(v.rule, v.rank, v.level) for v in out] == [("straggler", 1, Level.WARN)]
    assert out[0].onset_step == 20 and out[0].evidence["ratio"] >= 1.5
    assert out[0].step == 27  # the common-step median crosses at 25, confirmed 3 steps later
    assert "rank 1" in out[0].message
    assert feed(rule, range(40, 60), {0: 0.1, 1: 0.1, 2: 0.1}) == []  # recovered: re-armed
    assert [v.rank for v in feed(rule, range(60, 80), {0: 0.1, 1: 0.3, 2: 0.1})] == [1]


def test_small_absolute_excess_and_single_rank_runs_are_not_stragglers():
    rule = StragglerRule(StragglerConfig(window=10, min_excess_s=0.005))
    assert feed(rule, range(30), {0: 0.001, 1: 0.003}) == []  # x3 but only 2 ms
    solo = StragglerRule(StragglerConfig(window=10))
    assert feed(solo, range(30), {0: 0.5}) == []
    assert solo.worst() is None


def test_disabled_and_unusable_events_report_nothing():
    rule = StragglerRule(StragglerConfig(enabled=False, window=4))
    assert feed(rule, range(10), {0: 0.1, 1: 1.0}) == []
    rule = StragglerRule(StragglerConfig(window=4))
    assert rule.observe(0, 0, {"step_time_s": 0.0}) == []


def test_state_dict_round_trips_through_json():
    rule = StragglerRule(StragglerConfig(window=10))
    feed(rule, range(20), {0: 0.1, 1: 0.1})
    feed(rule, range(20, 24), {0: 0.1, 1: 0.5})
    twin = StragglerRule(rule.config)
    twin.load_state_dict(json.loads(json.dumps(rule.state_dict())))
    a = feed(rule, range(24, 40), {0: 0.1, 1: 0.5})
    b = feed(twin, range(24, 40), {0: 0.1, 1: 0.5})
    assert [(v.step, v.rank, v.onset_step) for v in a] == [(v.step, v.rank, v.onset_step) for v in b]
    assert len(b) == 1


def test_defaults_on_the_rank_suite():
    runs = rank_suite(6, 3, seed=9)  # held out: tuned on seed 1
    hits = false = 0
    for run in runs:
        rule = StragglerRule()
        out = [v for s, r, d in run.events for v in rule.observe(s, r, d)]
        lab = run.labels[0] if run.labels else None
        if run.cause == "straggler":
            hits += any(v.rank == run.slow_rank and lab.onset <= v.step <= lab.deadline for v in out)
            false += sum(v.rank != run.slow_rank or v.step < lab.onset for v in out)
        else:
            false += len(out)  # healthy, or slowed for another reason: no straggler
    assert hits == 3 and false == 0


def test_config_rejects_bad_confirm():
    with pytest.raises(ValueError, match="^confirm:"):
        StragglerConfig(confirm=0)


def test_a_blip_shorter_than_confirm_is_not_reported():
    rule = StragglerRule(StragglerConfig(window=4, confirm=3))
    feed(rule, range(10), {0: 0.1, 1: 0.1})
    assert feed(rule, range(10, 12), {0: 0.1, 1: 0.5}) == []  # two slow steps: a blip
    assert feed(rule, range(12, 30), {0: 0.1, 1: 0.1}) == []
    assert feed(rule, range(30, 40), {0: 0.1, 1: 0.5}) != []  # sustained: reported
