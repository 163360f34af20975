"""The hang rule (controller/rules/hang.py): one episode of evidence per life, decided once."""

from __future__ import annotations

import json

from cliffguard.controller.rules.hang import HangRule, HangRuleConfig
from cliffguard.controller.verdict import Action
from cliffguard.core.enums import EventType, Level
from cliffguard.core.events import make_event

WORLD = 4


def report(rank: int, ts: float, *, seq: int = 60, done: int = 59, reason: str = "stalled", life: int = 0,
           frame: str = "probe.py:1 in step", **kw) -> object:
    data = {"reason": reason, "stalled_s": 8.0, "node": "a" if rank < 2 else "b", "local_world": 2, "pid": 100 + rank,
            "life": life, "collective": "all_reduce" if done < seq else "", "fr": True,
            "pg_status": {"0": {"enqueued": seq, "started": -1, "completed": done}},
            "in_flight": [{"pg": "0", "seq": seq, "op": "gloo:all_reduce"}] if done < seq else [], "last": [],
            "frame": frame, "stacks": [{"name": "MainThread", "main": True, "frame": frame, "frames": [frame]}], **kw}
    return make_event(EventType.HANG_EVIDENCE, "r", 27, data, rank=rank, world=WORLD, ts=ts)


def started(life: int, ts: float):
    return make_event(EventType.RUN_STARTED, "r", 0, {
        "n_params": 1, "n_layers": 1, "n_heads": 1, "head_dim": 1, "seq_len": 1, "global_batch": 8, "peak_flops": 1.0,
        "peak_source": "config", "lr_schedule": {}, "world_size": WORLD, "life": life, "max_restarts": 3, "nodes": 1,
        "min_nodes": 1}, world=WORLD, ts=ts)


def sleeping_rank_3(rule: HangRule, t: float = 100.0, life: int = 0) -> list:
    out = []
    for r in range(3):
        out += rule.on_event(report(r, t + r * 0.1, life=life))
    out += rule.on_event(report(3, t + 0.4, seq=59, done=59, frame="faults.py:123 in hang", life=life))
    return out


def test_every_rank_reported_decides_at_once_naming_the_culprit_the_collective_and_the_frame():
    rule = HangRule()
    out = sleeping_rank_3(rule)
    assert len(out) == 1
    v = out[0]
    assert (v.rule, v.level, v.action, v.rank, v.step) == ("hang", Level.CRITICAL, Action.RESTART, 3, 27)
    ev = v.evidence
    assert (ev["culprit"], ev["kind"], ev["frame"], ev["nodes"], ev["life"]) == ([3], "outside_collective",
                                                                                  "faults.py:123 in hang", ["b"], 0)
    assert ev["cause"] == "hang" and ev["first_report_ts"] == 100.0 and len(ev["table"]) == WORLD
    assert rule.tick(1e9) == [] and sleeping_rank_3(rule) == []  # once per life


def test_a_rank_that_never_reports_is_decided_without_after_the_wait():
    rule = HangRule(HangRuleConfig(evidence_wait_s=4.0))
    for r in (0, 1, 2):
        assert rule.on_event(report(r, 100.0, reason="collective_error", error="Connection closed by peer")) == []
    assert rule.tick(103.9) == []
    (v,) = rule.tick(104.0)
    assert v.evidence["culprit"] == [3] and v.evidence["kind"] == "no_evidence"
    assert v.evidence["errors"] == {"0": "Connection closed by peer", "1": "Connection closed by peer",
                                    "2": "Connection closed by peer"}


def test_no_culprit_is_an_alert_not_a_restart():
    rule = HangRule()
    out = []
    for r in range(WORLD):
        out += rule.on_event(report(r, 100.0))
    assert [(v.level, v.action) for v in out] == [(Level.WARN, Action.ALERT)]


def test_a_lone_outside_report_warns_once_and_the_waiting_ranks_later_errors_still_name_it():
    """CI's failure: the sleeper's watchdog reported at once, the waiting ranks only when their
    collective failed; the early no-culprit warn must not close the episode to them."""
    rule = HangRule(HangRuleConfig(evidence_wait_s=4.0))
    assert rule.on_event(report(3, 100.0, seq=59, done=59, frame="faults.py:123 in hang")) == []
    (warn,) = rule.tick(104.0)
    assert (warn.level, warn.action, warn.evidence["culprit"]) == (Level.WARN, Action.ALERT, [])
    assert rule.tick(110.0) == []  # said once
    out = []
    for r in range(3):
        out += rule.on_event(report(r, 130.0, reason="collective_error", error="Timed out waiting 30000ms"))
    (v,) = out
    assert (v.level, v.action, v.rank, v.evidence["kind"]) == (Level.CRITICAL, Action.RESTART, 3, "outside_collective")
    assert rule.tick(1e9) == [] and rule.on_event(report(0, 140.0)) == []  # decided: once per life


def test_an_episode_that_warned_early_and_stays_without_a_culprit_warns_once():
    rule = HangRule(HangRuleConfig(evidence_wait_s=4.0))
    rule.on_event(report(3, 100.0, seq=59, done=59))
    assert [v.level for v in rule.tick(104.0)] == [Level.WARN]
    out = []
    for r in (0, 1, 2):
        out += rule.on_event(report(r, 105.0, seq=59, done=59))  # nobody waits in a collective: still no culprit
    assert out == [] and rule.decided_life == 0


def test_a_resolved_stall_withdraws_its_rank_and_an_empty_episode_is_dropped():
    rule = HangRule()
    rule.on_event(report(1, 100.0))
    rule.on_event(report(1, 101.0, reason="resolved"))
    assert rule.reports == {} and rule.tick(1e9) == []
    out = sleeping_rank_3(rule, t=200.0)  # the same life can still hang for real later
    assert out and out[0].evidence["culprit"] == [3]


def test_a_new_life_starts_afresh_and_an_older_lifes_evidence_is_ignored():
    rule = HangRule()
    sleeping_rank_3(rule)
    rule.on_event(started(1, 150.0))
    assert rule.on_event(report(0, 151.0, life=0)) == []  # a late report of the torn-down life
    out = sleeping_rank_3(rule, t=300.0, life=1)
    assert out and out[0].evidence["life"] == 1
    rule.on_event(started(0, 400.0))  # a fresh launch of the job counts from 0 again
    assert sleeping_rank_3(rule, t=500.0, life=0)[0].evidence["life"] == 0


def test_a_later_collective_error_adds_its_text_to_the_stalls_snapshot():
    rule = HangRule()
    rule.on_event(report(0, 100.0))
    rule.on_event(report(0, 120.0, reason="collective_error", error="Timed out waiting 30000ms"))
    assert rule.reports[0]["reason"] == "stalled" and rule.reports[0]["error"] == "Timed out waiting 30000ms"


def test_state_round_trips_mid_episode():
    rule = HangRule()
    for r in range(3):
        rule.on_event(report(r, 100.0))
    twin = HangRule()
    twin.load_state_dict(json.loads(json.dumps(rule.state_dict())))
    assert twin.state_dict() == rule.state_dict()
    (v,) = twin.on_event(report(3, 100.5, seq=59, done=59))
    assert v.evidence["culprit"] == [3]


def test_disabled_reports_nothing():
    rule = HangRule(HangRuleConfig(enabled=False))
    assert sleeping_rank_3(rule) == [] and rule.tick(1e9) == []
