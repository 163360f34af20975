"""The goodput ledger on a scripted run with a known schedule of faults, and on each rule alone."""

from __future__ import annotations

import pytest

from cliffguard.controller.goodput.buckets import BUCKETS, Bucket
from cliffguard.controller.goodput.config import GoodputConfig
from cliffguard.controller.goodput.ledger import Ledger
from cliffguard.controller.goodput.summary import costs, summarize
from cliffguard.core.events import make_event
from testing.goodput_script import T0, Script, schedule

TOLERANCE_S = 1e-6
"""The schedule's timestamps are exact, so every bucket must be (floating-point rounding aside)."""


def book(events, ledger=None, incident=None):
    ledger = ledger or Ledger()
    for ev in events:
        ledger.on_event(ev, incident(ev) if callable(incident) else incident)
    return ledger


def test_the_scripted_run_books_every_second_once_in_the_bucket_the_schedule_says():
    s = schedule()
    out = summarize(book(s.events()))
    assert abs(out["booked_s"] - s.wall_s) <= 0.01 * s.wall_s  # the bound; in fact exact
    assert out["wall_s"] == pytest.approx(s.wall_s, abs=TOLERANCE_S)
    for bucket in BUCKETS:
        assert out["seconds"][bucket] == pytest.approx(s.expected.get(bucket, 0.0), abs=TOLERANCE_S), bucket
        assert out["gpu_seconds"][bucket] == pytest.approx(s.expected_gpu.get(bucket, 0.0), abs=TOLERANCE_S), bucket
    assert out["seconds"]["unknown"] == 0.0
    assert out["steps_lost"] == s.steps_lost == 45
    assert (out["rollbacks"], out["restarts"], out["scale_changes"]) == (1, 3, 2)
    assert out["ettr"] == pytest.approx(s.expected["productive"] / s.wall_s)
    assert out["checkpoints"]["disk_interval_steps"] == 10
    assert out["checkpoints"]["mean_stall_s"] == pytest.approx(0.5)


def test_a_replayed_stream_books_nothing_twice():
    s = schedule()
    once = summarize(book(s.events()))
    twice = summarize(book(s.events() + s.events()))
    assert twice["seconds"] == once["seconds"]
    assert twice["late_events"] == len(s.events())  # every copy refused, by its ts or its id


def test_state_dict_mid_run_continues_exactly():
    s = schedule()
    events = s.events()
    first = book(events[:137])
    resumed = Ledger()
    resumed.load_state_dict(first.state_dict())
    book(events[137:], resumed)
    assert summarize(resumed)["seconds"] == summarize(book(events))["seconds"]


def test_rolled_back_steps_are_charged_to_the_open_incident():
    s = schedule()
    # the controller's incident is open from the spike that led to the rollback until the replay
    rollback_window = {ev.id for ev in s.events() if 49 < ev.ts - T0 < 61}
    led = book(s.events(), incident=lambda ev: "inc-1" if ev.id in rollback_window else None)
    inc = costs(led)["inc-1"]
    assert inc["kind"] == "incident"
    assert inc["steps_lost"] == 15  # steps 30..44 redone
    assert inc["buckets"]["rolled_back"]["seconds"] == pytest.approx(9 * 0.9 + 9 * 0.1)  # 31..39 kept
    assert inc["buckets"]["checkpoint_restore"]["seconds"] == pytest.approx(2.0)
    assert inc["buckets"]["skipped"]["seconds"] == pytest.approx(5.0)  # 40..44
    assert inc["buckets"]["pause_validation"]["seconds"] == pytest.approx(0.2 + 3.0 + 0.01)
    kinds = sorted(c["kind"] for c in costs(led).values())
    assert kinds == ["elastic", "elastic", "incident", "restart"]


def _steps(run, n, *, first=0, t0=100.0, step_s=1.0, guard="ok"):
    s = Script(run=run, t=t0, step=first, world=1, step_s=step_s, wait_s=0.0)
    s.steps(n, guard=guard)
    return s


def test_a_gap_no_event_explains_is_unknown_and_heartbeats_in_a_long_one_make_it_a_hang():
    s = _steps("r", 3)
    s.t += 5.0  # 5 s with no event: unknown
    s.steps(1)
    s.t += 100.0
    s.emit("heartbeat", {"state": "running"})  # alive 100 s after the last step, still no step
    s.t += 10.0
    s.steps(1)
    out = summarize(book(s.events()))["seconds"]
    assert out["unknown"] == pytest.approx(5.0 + 10.0)
    assert out["hang"] == pytest.approx(100.0)


def test_a_hold_waits_until_the_controller_answers():
    s = _steps("r", 3)
    s.steps(1, guard="hold")  # the guard skipped and held
    s.t += 7.0
    s.emit("command.ack", {"cmd": "a" * 32, "cmd_type": "validate", "status": "applied"})  # answered: paused
    s.t += 2.0
    s.emit("command.ack", {"cmd": "b" * 32, "cmd_type": "resume", "status": "applied"})
    s.steps(2)
    out = summarize(book(s.events()))["seconds"]
    assert out["skipped"] == pytest.approx(1.0)
    assert out["hold_wait"] == pytest.approx(7.0)
    assert out["pause_validation"] == pytest.approx(2.0)
    assert out["productive"] == pytest.approx(5.0)


def test_a_redo_no_incident_explains_is_recorded_as_unexplained():
    s = _steps("r", 10)
    s.rewind(6)  # a trainer rolled itself back and nobody said why
    s.steps(4)
    led = book(s.events())
    (cost,) = costs(led).values()
    assert cost["kind"] == "unexplained" and cost["steps_lost"] == 4
    assert summarize(led)["seconds"]["rolled_back"] == pytest.approx(4.0)


def test_a_run_whose_start_was_never_seen_opens_at_its_first_step():
    s = _steps("r", 3, first=40)
    out = summarize(book(s.events()))
    assert out["saw_start"] is False and out["wall_s"] == pytest.approx(3.0)
    assert out["seconds"]["productive"] == pytest.approx(3.0)


def test_only_the_run_rank_books_time():
    s = _steps("r", 2)
    other = make_event("step", "r", 2, s.out[-1].data, rank=1, world=2, ts=s.t + 50)
    out = summarize(book([*s.events(), other]))
    assert out["wall_s"] == pytest.approx(2.0)


def test_the_ettr_alert_fires_below_the_floor_and_rearms_above_it():
    cfg = GoodputConfig(ettr_floor=0.8, ettr_window_s=20.0, ettr_rearm=0.05)
    led, alerts = Ledger(cfg), []
    s = _steps("r", 30)
    s.t += 15.0  # a 15 s stall: the last 20 s are 25 % productive
    s.steps(1)
    s.steps(40)
    for ev in s.events():
        alerts += led.on_event(ev)
    assert [a.kind for a in alerts] == ["low", "recovered"]
    assert alerts[0].ettr < 0.8 <= alerts[1].ettr - 0.05


def test_every_bucket_has_a_label_and_a_colour():
    from cliffguard.controller.goodput.buckets import COLORS, LABELS

    assert set(LABELS) == set(COLORS) == set(Bucket)


def test_skips_the_run_went_on_from_count_as_rollbacks_avoided_at_the_measured_rollback_cost():
    s = schedule()  # one run of skips (step 30) absorbed: the run resumed; one (40..44) rolled back
    led = book(s.events(), incident=lambda ev: "inc-1" if 49 < ev.ts - T0 < 61 else None)
    g = summarize(led)["guard"]
    assert (g["skip_episodes"], g["absorbed"]) == (2, 1)
    paid = costs(led)["inc-1"]["seconds"]
    assert g["rollback_cost_s"] == pytest.approx(paid)
    assert g["estimated_saved_s"] == pytest.approx(paid - 6.0)  # less the 6 s the skipped steps took


def test_a_restart_on_a_host_whose_clock_is_behind_still_starts_a_restart():
    s = _steps("r", 5)
    s.t -= 30.0  # the new rank 0's clock is 30 s behind
    s.start()
    s.t += 40.0
    s.steps(2)
    led = book(s.events())
    out = summarize(led)
    assert out["clock_steps"] == 1 and out["restarts"] == 1
    assert out["wall_s"] == pytest.approx(5.0 + 10.0 + 2.0)  # the cursor never went back
    assert out["seconds"]["checkpoint_restore"] == pytest.approx(10.0)  # the new process's start to its first step


def test_a_preemption_books_the_save_and_the_time_down_until_the_restart_as_preemption():
    s = Script(run="r", t=100.0, step=0, world=1, step_s=1.0, wait_s=0.0)
    s.start()
    s.steps(5)
    s.t += 1.5  # the step in flight finished, then the save
    s.emit("run.preempted", {"signal": "SIGTERM", "deadline_s": 30.0, "save_s": 1.5, "margin_s": 28.5,
                             "verified": True, "wait_s": 0.2, "exit_code": 75})
    s.t += 60.0  # requeued, waiting for the nodes
    s.start()
    s.t += 2.0  # loading the checkpoint
    s.steps(3)
    out = summarize(book(s.events()))["seconds"]
    assert out["preemption"] == pytest.approx(61.5)
    assert out["restart"] == 0.0
    assert out["checkpoint_restore"] == pytest.approx(2.0)
    assert out["productive"] == pytest.approx(8.0)


def test_a_hang_books_its_wait_until_detection_then_the_restart_and_the_node_check():
    from tests.core.test_events import PAYLOADS

    s = _steps("r", 5)
    s.t += 8.0  # the watchdog dumps 8 s after the last step
    s.emit("hang.evidence", {**PAYLOADS["hang.evidence"], "reason": "stalled"})
    s.t += 3.0  # the culprit named, rank 0 told to leave
    s.emit("run.failed", {"error": "restart in_place of life 0 requested"})
    s.t += 20.0  # torchrun starts the next life
    s.start()
    s.t += 1.5
    s.emit("node.check", {**PAYLOADS["node.check"], "ok": True, "slow": [], "slow_nodes": []})
    s.t += 2.0  # the checkpoint's restore
    s.steps(2)
    out = summarize(book(s.events()))["seconds"]
    assert out["hang"] == pytest.approx(11.0)  # until detection (8 s) and until the group was torn down (3 s)
    assert out["restart"] == pytest.approx(21.5)  # the restart and the node check
    assert out["checkpoint_restore"] == pytest.approx(2.0)
    assert out["productive"] == pytest.approx(7.0)


def test_a_stall_that_ends_by_itself_trains_on():
    from tests.core.test_events import PAYLOADS

    s = _steps("r", 2)
    s.t += 9.0
    s.emit("hang.evidence", {**PAYLOADS["hang.evidence"], "reason": "stalled"})
    s.t += 1.0
    s.emit("hang.evidence", {**PAYLOADS["hang.evidence"], "reason": "resolved"})
    s.steps(1)
    out = summarize(book(s.events()))["seconds"]
    assert out["hang"] == pytest.approx(10.0) and out["restart"] == 0.0
