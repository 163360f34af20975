"""RunDetector (controller/detect.py): routing of events to rules, the loss rank, rollbacks, ticks,
persistence, isolation of a raising rule. Events go through the real contract (encode -> decode) as the controller sees them."""

from __future__ import annotations

import json
import logging
import math

import pytest

from cliffguard.controller.detect import RULE_ERROR, RULES, RulesConfig, RunDetector
from cliffguard.controller.rules.base import STEP_EVENTS, RankScope
from cliffguard.controller.rules.mfu import MfuConfig
from cliffguard.controller.rules.straggler import StragglerConfig
from cliffguard.controller.verdict import Action
from cliffguard.core.enums import EventType, Level
from cliffguard.core.events import decode_event, encode_event, make_event

RUN = "run-1"


def step_event(step: int, loss: float, rank: int = 0, world: int = 2, ts: float | None = None, **over):
    data = {
        "loss": loss, "loss_local": loss, "lr": 1e-3, "lr_scale": 1.0, "grad_norm": 1.0, "tokens": 4096,
        "step_time_s": 0.1, "data_wait_s": 0.0, "comm_exposed_s": 0.0, "compute_s": 0.1,
        "tokens_per_s": 40960.0, "mfu": 0.5, "mem_allocated": 0, "mem_reserved": 0, "loss_scale": 1.0,
        "skipped": False, "clipped_layers": 0, "guard": "ok",
    }
    data.update(over)
    ev = make_event(EventType.STEP, RUN, step, data, rank=rank, world=world, ts=1000.0 + step if ts is None else ts)
    return decode_event(encode_event(ev))  # exactly what the controller's edge hands over


MODERATE = 2.08
"""4σ over healthy() (σ at its floor, 1% of the median): each point warns; the third in a row
brings the evidence to the critical level (the seed calibration this early: ``core/spike.py``)."""


def healthy(i: int) -> float:
    return 2.0 + 0.02 * ((i % 5) - 2)


def run_steps(det, steps, loss_of, ranks=(0, 1), **over):
    out = []
    for s in steps:
        for r in ranks:
            out += det.on_event(step_event(s, loss_of(s), rank=r, **over))
    return out


def test_config_validation():
    with pytest.raises(ValueError, match="^evidence_last_n:"):
        RulesConfig(evidence_last_n=-1)


def test_loss_rules_use_one_event_per_step_and_name_the_onset():
    det = RunDetector()
    assert run_steps(det, range(50), healthy) == []
    out = run_steps(det, range(50, 60), lambda s: MODERATE)
    assert [(v.rule, v.level, v.step, v.onset_step, v.action) for v in out] == [
        ("loss_spike", Level.WARN, 50, 50, Action.ALERT),
        ("loss_spike", Level.CRITICAL, 52, 50, Action.RECOVER),
    ]
    assert out[1].rank is None and out[1].evidence["median"] == pytest.approx(2.0)
    ev = det.window_evidence()
    assert ev["n"] == 50 and ev["last"][-1] == [59, MODERATE] and len(ev["last"]) == 20


def test_nonfinite_loss_through_the_wire_asks_for_recovery():
    det = RunDetector()
    run_steps(det, range(30), healthy)
    (v,) = det.on_event(step_event(30, math.nan))
    assert v.rule == "nonfinite" and v.level is Level.CRITICAL and v.action is Action.RECOVER


def test_the_lowest_rank_speaks_for_the_run_even_if_it_arrives_late():
    det = RunDetector()
    for s in range(30):
        det.on_event(step_event(s, healthy(s), rank=1))
    assert det.state_dict()["loss_rank"] == 1
    # rank 0 turns up with steps the detector already judged: skipped, not a rollback
    for s in range(25, 30):
        assert det.on_event(step_event(s, MODERATE, rank=0)) == []
    assert det.rewinds == 0 and det.state_dict()["loss_rank"] == 0
    assert det.on_event(step_event(30, healthy(30), rank=0)) == []
    assert det.on_event(step_event(31, MODERATE, rank=1)) == []  # rank 1's loss no longer counts
    assert [v.level for v in det.on_event(step_event(31, MODERATE, rank=0))] == [Level.WARN]


def test_rollback_replays_are_judged_afresh_and_late_ranks_do_not_confuse_them():
    det = RunDetector()
    run_steps(det, range(60), healthy)
    crit = run_steps(det, range(60, 64), lambda s: MODERATE, ranks=(0,))
    assert [v.level for v in crit] == [Level.WARN, Level.CRITICAL]
    # the trainer rolls back to step 55: rank 0 replays while rank 1's old step 63 is still in flight
    assert det.on_event(step_event(56, healthy(56), rank=0)) == []
    assert det.on_event(step_event(63, MODERATE, rank=1)) == []
    assert det.rewinds == 1
    assert run_steps(det, range(57, 70), healthy) == []
    again = run_steps(det, range(70, 74), lambda s: MODERATE)  # a second spike after the rollback
    assert [(v.level, v.onset_step) for v in again] == [(Level.WARN, 70), (Level.CRITICAL, 70)]


def test_backtest_entry_point_rewinds_on_steps_going_backwards():
    det = RunDetector()
    for s in range(40):
        det.observe_loss(s, healthy(s))
    det.observe_loss(20, healthy(20))
    assert det.rewinds == 1


def test_grad_norm_and_loss_scale_come_from_the_loss_rank_only():
    det = RunDetector()
    run_steps(det, range(40), healthy)
    out = det.on_event(step_event(40, healthy(40), rank=1, grad_norm=500.0))
    assert out == []
    out = det.on_event(step_event(40, healthy(40), rank=0, grad_norm=500.0,
                                  layer_grad_norms={"h.0": 1.0}))
    assert [(v.rule, v.level) for v in out] == [("grad_norm", Level.CRITICAL)]
    out = det.on_event(step_event(41, healthy(41), rank=0, loss_scale=float("inf")))
    assert [(v.rule, v.level) for v in out] == [("loss_scale", Level.CRITICAL)]


def test_per_rank_rules_see_every_rank():
    det = RunDetector(RulesConfig(straggler=StragglerConfig(window=10), mfu=MfuConfig(window=10)))
    out = []
    for s in range(40):
        out += det.on_event(step_event(s, healthy(s), rank=0, step_time_s=0.4, comm_exposed_s=0.3, mfu=0.1))
        out += det.on_event(step_event(s, healthy(s), rank=1, step_time_s=0.4, comm_exposed_s=0.0, mfu=0.1))
    rules = {v.rule: v for v in out}
    assert rules["straggler"].rank == 1
    assert rules["mfu_low"].evidence["cause"] == "straggler"
    growth = [det.on_event(step_event(40 + s, healthy(s), rank=0, mem_allocated=2**30,
                                      mem_reserved=2**30 + s * 2**24)) for s in range(200)]
    assert [v.rule for vs in growth for v in vs] == ["memory_growth"]


def test_heartbeat_loss_via_tick_and_silence_after_the_run_ends():
    det = RunDetector()
    det.on_event(step_event(1, 2.0, rank=0, ts=1000.0))
    det.on_event(step_event(1, 2.0, rank=1, ts=1000.0))
    hb = make_event(EventType.HEARTBEAT, RUN, 1, {"state": "paused"}, rank=0, world=2, ts=1100.0)
    assert det.on_event(hb) == []
    out = det.tick(1125.0)
    assert [(v.rule, v.rank, v.level) for v in out] == [("heartbeat", 1, Level.CRITICAL)]
    fin = make_event(EventType.RUN_FINISHED, RUN, 2, {}, rank=0, world=2, ts=1126.0)
    assert det.on_event(fin) == []
    assert det.tick(5000.0) == []
    started = make_event(EventType.RUN_STARTED, RUN, 0, {
        "n_params": 1, "n_layers": 1, "n_heads": 1, "head_dim": 1, "seq_len": 8, "global_batch": 1,
        "peak_flops": 1.0, "peak_source": "config", "lr_schedule": {}, "world_size": 2}, rank=0, world=2, ts=6000.0)
    assert det.on_event(started) == []
    assert [(v.rank, v.level) for v in det.tick(6040.0)] == [(0, Level.WARN)]  # awake; rank 1 forgotten


def test_other_event_types_feed_no_rule():
    det = RunDetector()
    ev = make_event(EventType.VALIDATION, RUN, 5, {"val_loss": math.nan, "batches": 4})
    assert det.on_event(ev) == []


def test_state_dict_round_trips_through_json_mid_incident():
    det = RunDetector()
    run_steps(det, range(50), healthy)
    run_steps(det, range(50, 52), lambda s: MODERATE)  # warn reported, critical pending
    twin = RunDetector()
    twin.load_state_dict(json.loads(json.dumps(det.state_dict())))
    a = run_steps(det, range(52, 55), lambda s: MODERATE)
    b = run_steps(twin, range(52, 55), lambda s: MODERATE)
    assert [(v.rule, v.level, v.step, v.onset_step) for v in a] == [(v.rule, v.level, v.step, v.onset_step) for v in b]
    assert [(v.level, v.onset_step) for v in b] == [(Level.CRITICAL, 50)]
    assert twin.state_dict() == json.loads(json.dumps(det.state_dict()))


# -- registered rules, isolation ------------------------------------------------------------------


class Boom:
    """A rule that raises on every step event and every tick."""

    name = "boom"
    consumes = STEP_EVENTS
    scope = RankScope.EVERY_RANK

    def on_event(self, event):
        raise ZeroDivisionError("boom")

    def tick(self, now):
        raise RuntimeError("tick boom")

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


def spike_run(det):
    return run_steps(det, range(50), healthy) + run_steps(det, range(50, 60), lambda s: MODERATE)


def test_a_raising_rule_does_not_stop_the_loss_rule_and_is_reported(caplog):
    det = RunDetector(registry=RULES.with_rule("boom", lambda c: Boom()))
    with caplog.at_level(logging.ERROR, logger="cliffguard.controller.detect"):
        out = spike_run(det)
    loss = [(v.rule, v.level, v.step) for v in out if v.rule != RULE_ERROR]
    assert loss == [(v.rule, v.level, v.step) for v in spike_run(RunDetector())]
    assert ("loss_spike", Level.CRITICAL, 52) in loss
    assert det.rule_errors == {"boom": 120}  # 60 steps x 2 ranks
    errors = [v for v in out if v.rule == RULE_ERROR]
    assert [(v.evidence["errors"], v.step, v.level, v.action) for v in errors] == [
        (1, 0, Level.WARN, Action.ALERT), (10, 4, Level.WARN, Action.ALERT), (100, 49, Level.WARN, Action.ALERT)]
    assert errors[0].evidence["rule"] == "boom" and errors[0].evidence["error"] == "ZeroDivisionError: boom"
    logged = [r for r in caplog.records if "rule boom raised on run run-1" in r.getMessage()]
    assert len(logged) == 3 and logged[0].exc_info is not None


def test_a_raising_tick_does_not_stop_the_heartbeat_rule():
    det = RunDetector(registry=RULES.with_rule("boom", lambda c: Boom()))
    det.on_event(make_event(EventType.HEARTBEAT, RUN, 1, {"state": "running"}, rank=0, world=1, ts=1000.0))
    out = det.tick(1100.0)
    assert [(v.rule, v.rank) for v in out] == [("heartbeat", 0), (RULE_ERROR, None)]
    assert "RuntimeError: tick boom" in out[1].message and det.rule_errors["boom"] == 1


def test_rule_error_counts_persist_so_reports_stay_rate_limited_after_a_restart():
    det = RunDetector(registry=RULES.with_rule("boom", lambda c: Boom()))
    run_steps(det, range(3), healthy)
    twin = RunDetector(registry=RULES.with_rule("boom", lambda c: Boom()))
    twin.load_state_dict(json.loads(json.dumps(det.state_dict())))
    assert twin.rule_errors == {"boom": 6}
    assert [v.evidence["errors"] for v in run_steps(twin, range(3, 6), healthy)] == [10]


def test_state_stored_before_rule_registration_loads():
    """The stored layout (rule states under their names beside the detector's keys) is the one
    written before rules were registered; such a state has no rule_errors and loads as is."""
    det = RunDetector()
    run_steps(det, range(50), healthy)
    run_steps(det, range(50, 52), lambda s: MODERATE)
    old = json.loads(json.dumps(det.state_dict()))
    del old["rule_errors"]
    del old["elastic"]  # a rule registered later (controller/rules/elastic.py): absent from older states
    del old["hang"]  # ... and controller/rules/hang.py
    del old["held"]  # ... and controller/rules/held.py
    del old["data"]  # the same (controller/rules/data_quality.py)
    del old["sdc"]  # ... and controller/rules/sdc.py
    assert set(old) == {"loss", "grad_norm", "loss_scale", "straggler", "mfu", "heartbeat", "memory",
                        "loss_rank", "last_step", "catching_up", "rewinds"}
    twin = RunDetector()
    twin.load_state_dict(old)
    assert [(v.level, v.onset_step) for v in run_steps(twin, range(52, 55), lambda s: MODERATE)] == [(Level.CRITICAL, 50)]
    assert twin.rule_errors == {}


def test_a_rule_registered_after_the_state_was_stored_starts_fresh():
    det = RunDetector()
    run_steps(det, range(10), healthy)
    grown = RunDetector(registry=RULES.with_rule("boom", lambda c: Boom()))
    grown.load_state_dict(json.loads(json.dumps(det.state_dict())))  # no "boom" key
    assert grown.state_dict()["boom"] == {} and grown.state_dict()["loss_rank"] == 0


def test_without_the_loss_rule_the_others_still_run_and_loss_entry_points_say_why():
    det = RunDetector(RulesConfig(straggler=StragglerConfig(window=10)), registry=RULES.without("loss"))
    out = []
    for s in range(40):
        out += det.on_event(step_event(s, math.nan, rank=0, step_time_s=0.1))
        out += det.on_event(step_event(s, math.nan, rank=1, step_time_s=0.4))
    assert {v.rule for v in out} == {"straggler"}
    with pytest.raises(LookupError):
        det.window_evidence()


def test_per_rank_metric_rules_are_not_called_for_events_without_rank_samples():
    from cliffguard.core.rank_arrays import summarize_losses
    from testing import store_factory as f

    det = RunDetector()
    det.changed.clear()
    data = {**f.step(1, 2.0).data, "rank_losses": summarize_losses([2.0, 2.0])}
    det.on_event(make_event("step", "r", 1, data, rank=0, world=2))  # run-level: the arrays come in `ranks`
    assert not det.changed & {"straggler", "mfu", "memory"} and "loss" in det.changed


def _falling(i: int) -> float:
    """A loss still coming down (0.005 a step) with small noise: a replay's steps sit far above the
    later steps' window."""
    return 3.0 - 0.005 * i + 0.01 * ((i * 7) % 5 - 2)


def _checkpoint(step: int):
    from tests.core.test_events import PAYLOADS

    return make_event(EventType.CHECKPOINT, RUN, step, {**PAYLOADS[EventType.CHECKPOINT], "kind": "memory"},
                      world=2, ts=2000.0 + step)


@pytest.mark.parametrize("marked", [True, False])
def test_a_replay_after_a_long_rollback_is_judged_against_the_window_its_steps_first_met(marked):
    """A rollback 100 steps back (the SDC watch's) replays steps whose loss is higher than the
    abandoned timeline's later steps. With the checkpoint boundary's state kept, the replay is
    judged as at its first pass: nothing. Without it (no checkpoint event seen), the window of the
    later steps called step 100 a critical spike."""
    det = RunDetector()
    first_105 = None
    out = []
    for s in range(200):
        if s % 10 == 0 and marked:
            det.on_event(_checkpoint(s))
        out += run_steps(det, [s], _falling)
        if s == 105:
            first_105 = det.loss.spike.state_dict()
    assert [v for v in out if v.rule.startswith("loss")] == []
    replay = run_steps(det, range(100, 106), _falling)
    if marked:  # the replay met the very window its steps first met
        assert det.loss.spike.state_dict() == first_105 and det.rewinds == 1
    replay += run_steps(det, range(106, 130), _falling)
    loss_verdicts = [(v.rule, v.level) for v in replay if v.rule in ("loss_spike", "divergence")]
    if marked:
        assert loss_verdicts == []
    else:
        assert ("loss_spike", Level.CRITICAL) in loss_verdicts  # the bug the marks fix
