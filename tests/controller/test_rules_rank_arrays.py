"""The rules on run-level events: the per-rank rules read ``ranks`` arrays, the loss rules the
run-level ``step`` event, the heartbeat rule node heartbeats; older per-rank step events still work
(mixed fleets), and detail events feed no rule."""

from __future__ import annotations

from cliffguard.controller.detect import RulesConfig, RunDetector
from cliffguard.controller.rules.heartbeat import HeartbeatConfig, HeartbeatRule
from cliffguard.controller.rules.memory import MemoryConfig
from cliffguard.controller.rules.mfu import MfuConfig
from cliffguard.controller.rules.straggler import StragglerConfig
from cliffguard.core.enums import EventType
from cliffguard.core.events import make_event
from cliffguard.core.rank_arrays import summarize_losses
from tests.core.test_events import STEP

WORLD = 8


def ranks_event(step: int, busy: dict[int, float], *, first: int = 0, n: int = WORLD, mfu: float = 0.5,
                reserved: int = 4 << 30, ts: float = 1000.0):
    slowest = max(busy.get(r, 0.1) for r in range(WORLD))
    times = [busy.get(r, 0.1) for r in range(first, first + n)]
    data = {"first_rank": first, "steps": 10, "step_time_s": [slowest] * n,
            "comm_exposed_s": [slowest - t for t in times], "data_wait_s": [0.0] * n, "mfu": [mfu] * n,
            "tokens_per_s": [1e3] * n, "mem_allocated": [1 << 30] * n, "mem_reserved": [reserved] * n,
            "loss_local": [2.0] * n}
    return make_event(EventType.RANKS, "r", step, data, rank=first, world=WORLD, ts=ts)


def run_step(step: int, loss: float = 2.0, **extra):
    data = {**STEP, "loss": loss, "rank_losses": summarize_losses([loss] * WORLD), **extra}
    return make_event(EventType.STEP, "r", step, data, rank=0, world=WORLD, ts=1000.0 + step)


def detector(**rules) -> RunDetector:
    return RunDetector(RulesConfig(**rules))


def test_a_straggler_is_found_from_the_arrays_in_chunks():
    det = detector(straggler=StragglerConfig(window=8, confirm=2))
    verdicts = []
    for k in range(1, 12):
        for first in (4, 0):  # two node leaders' chunks, in either order
            verdicts += det.on_event(ranks_event(10 * k, {5: 0.4}, first=first, n=4))
    found = [v for v in verdicts if v.rule == "straggler"]
    assert [v.rank for v in found] == [5] and found[0].evidence["world_seen"] == WORLD


def test_low_mfu_and_memory_growth_from_the_arrays():
    det = detector(mfu=MfuConfig(window=4), memory=MemoryConfig(window=4, min_growth_bytes=1 << 20))
    verdicts = []
    for k in range(1, 12):
        verdicts += det.on_event(ranks_event(10 * k, {}, mfu=0.5 if k < 4 else 0.2,
                                             reserved=(4 << 30) + (k * (1 << 28) if k > 6 else 0)))
    rules = {v.rule for v in verdicts}
    assert {"mfu_low", "memory_growth"} <= rules
    assert sorted(v.rank for v in verdicts if v.rule == "memory_growth") == list(range(WORLD))


def test_run_level_and_detail_steps_feed_no_per_rank_rule_but_the_loss_rules_read_the_run_level_one():
    det = detector(straggler=StragglerConfig(window=4, confirm=1), mfu=MfuConfig(window=4))
    for s in range(40):
        det.on_event(run_step(s, step_time_s=5.0))  # rank 0's own slow step time is not a straggler sample
        detail = {**STEP, "detail": True, "step_time_s": 9.0}
        for r in range(1, 3):
            det.on_event(make_event(EventType.STEP, "r", s, detail, rank=r, world=WORLD))
    assert det.rules["straggler"].list_state_dict()["busy"] == {} and det.rules["mfu"].list_state_dict()["recent"] == {}
    assert det.loss.window_evidence()["n"] > 0 and det.state_dict()["loss_rank"] == 0
    spike = []
    for s in range(40, 45):
        spike += det.on_event(run_step(s, loss=50.0))
    assert any(v.rule == "loss_spike" for v in spike)


def test_old_per_rank_step_events_still_find_a_straggler():
    det = detector(straggler=StragglerConfig(window=8, confirm=2))
    verdicts = []
    for s in range(20):
        for r in range(4):
            busy = 0.4 if r == 2 else 0.1
            data = {**STEP, "step_time_s": 0.4, "comm_exposed_s": 0.4 - busy}
            verdicts += det.on_event(make_event(EventType.STEP, "r", s, data, rank=r, world=4))
    assert [v.rank for v in verdicts if v.rule == "straggler"] == [2]


def beat(ts: float, steps: list[int], ages: list[float], collectives: list[str], state: str = "running"):
    data = {"state": state, "ranks": list(range(len(steps))), "steps": steps, "ages_s": ages,
            "collectives": collectives}
    return make_event(EventType.HEARTBEAT, "r", max(steps), data, rank=0, world=len(steps), ts=ts)


def test_a_dead_rank_is_named_by_its_node_heartbeat_once():
    rule = HeartbeatRule(HeartbeatConfig(warn_after_s=30, critical_after_s=120, hung_after_s=0))
    rule.on_event(beat(1000.0, [7, 7, 7], [0.0, 0.0, 0.0], ["", "", "all_reduce"]))
    named = []
    for k in range(1, 10):  # rank 2 stopped writing at 1000; the leader goes on beating
        t = 1000.0 + 5 * k
        rule.on_event(beat(t, [7 + k, 7 + k, 7], [0.0, 0.0, 5.0 * k + 1e-6], ["", "", "all_reduce"]))
        named += rule.tick(t)
    assert [(v.rule, v.rank, v.step) for v in named] == [("heartbeat", 2, 7)]
    assert "inside all_reduce" in named[0].message and named[0].evidence["silent_s"] >= 30


def test_a_hung_rank_is_named_with_its_step_and_what_the_others_wait_in():
    rule = HeartbeatRule(HeartbeatConfig(hung_after_s=45))
    for k in range(4):
        rule.on_event(beat(1000.0 + k, [k, k, k, k], [0.0] * 4, [""] * 4))
    out = []
    for k in range(1, 14):  # from 1003 on: step 3 forever; rank 1 is not in a collective
        t = 1003.0 + 5 * k
        rule.on_event(beat(t, [3, 3, 3, 3], [0.0] * 4, ["all_reduce", "", "all_reduce", "all_reduce"]))
        out += rule.tick(t)
    assert [(v.rule, v.rank, v.step) for v in out] == [("rank_hung", 1, 3)]
    v = out[0]
    assert v.evidence["waiting"] == 3 and v.evidence["waiting_in"] == ["all_reduce"] and 45 <= v.evidence["stalled_s"] < 60
    assert "rank 1 hung at step 3" in v.message and "3 ranks wait in all_reduce" in v.message
    rule.on_event(beat(1100.0, [3, 3, 3, 3], [0.0] * 4, [""] * 4, state="paused"))
    assert rule.tick(1110.0) == []  # a paused run is not hung


def test_the_hung_state_round_trips():
    import json

    rule = HeartbeatRule()
    rule.on_event(beat(1000.0, [3, 3], [0.0, 0.0], ["all_reduce", ""]))
    rule.tick(1050.0)
    again = HeartbeatRule()
    again.load_state_dict(json.loads(json.dumps(rule.state_dict())))
    assert again.state_dict() == rule.state_dict() and again.tick(1051.0) == []


def test_new_settings_are_validated_naming_the_field():
    import pytest

    from cliffguard.controller.recovery_types import RecoveryConfig

    with pytest.raises(ValueError, match="^hung_after_s:"):
        HeartbeatConfig(hung_after_s=-1)
    with pytest.raises(ValueError, match="^detail_steps:"):
        RecoveryConfig(detail_steps=0)
