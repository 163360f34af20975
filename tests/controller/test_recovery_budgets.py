"""Per-rung budgets of the recovery machine (controller/recovery_budgets.py, issue 22 item 5): each
rung's per-window and per-run budget, exhausted, escalates to the rung the table declares, with an
incident naming the rung and its budget and a critical alert; a passed window frees the budget."""

from __future__ import annotations

from dataclasses import replace

import pytest

from cliffguard.controller.recovery_budgets import BUDGET, BUDGETS, describe
from cliffguard.controller.recovery_hang_types import NodeCheckIn
from cliffguard.controller.recovery_state import RecoveryState, RungUses
from cliffguard.controller.recovery_table import ENTRIES, GUARDS
from cliffguard.controller.recovery_types import (
    Alert,
    CloseIncident,
    OpenIncident,
    Phase,
    RecordTransition,
    RecoveryConfig,
    SendCommand,
    StartedIn,
    TriagedIn,
    Trigger,
    VerdictIn,
)
from cliffguard.controller.verdict import Action, Verdict
from cliffguard.core.enums import CommandType, Level
from tests.controller.test_recovery import CFG, Driver, healthy_run, recovering_after_a_rollback

P = Phase
HOUR = 3600.0


def _driver(**kw) -> Driver:
    return Driver(replace(CFG, **kw))


def _started(d: Driver, *, life: int = 0, nodes: int = 4, restarts_left: int = 5,
             caps: tuple[CommandType, ...] = tuple(CommandType)) -> None:
    d.feed(StartedIn(capabilities=caps, now=d.now, life=life, max_restarts=5, restarts_left=restarts_left,
                     nodes=nodes, min_nodes=1))


def _triaged(d: Driver, step: int, cls: str, *, rank: int = 1, node: str = "", ts: float | None = None):
    d.now += 1
    return d.feed(TriagedIn(step=step, now=d.now, cls=cls, remedy={"data": "skip_batch", "transient": "retry_step"}.get(
        cls, "rollback"), rank=rank, reason="the re-runs' verdict", reruns=2, rerun_s=0.05,
        sample_ids=(7, 8) if cls == "data" else (), update_applied=cls == "transient",
        ts=d.now if ts is None else ts, node=node))


def _moves(acts) -> list[tuple[Phase, Phase, str]]:
    return [(a.from_state, a.to_state, str(a.trigger)) for a in acts if isinstance(a, RecordTransition)]


def _evidence(acts) -> dict:
    """The budget evidence of the incident the escalation opened (or of its move)."""
    opened = [a for a in acts if isinstance(a, OpenIncident)]
    return (opened[0].evidence if opened else [a for a in acts if isinstance(a, RecordTransition)][-1].evidence)["budget"]


def _critical(acts) -> Alert:
    (alert,) = [a for a in acts if isinstance(a, Alert) and a.level == "critical"]
    return alert


def _evict_then_train(d: Driver, node: str, step: int, life: int) -> None:
    acts = _triaged(d, step, "bad_rank", node=node)
    assert _moves(acts) == [(P.RUNNING, P.RESTARTING, "evict")], _moves(acts)
    _started(d, life=life, nodes=d.s.hang.nodes - 1)
    d.steps(step, step)
    assert d.s.phase is P.RUNNING


# ---------------------------------------------------------------------------------------------
# The declared budgets
# ---------------------------------------------------------------------------------------------


def test_every_rung_is_declared_with_its_fields_guard_and_spent_trigger():
    assert [b.rung for b in BUDGETS] == ["retry", "rerun", "rollback", "restart", "evict"]
    for b in BUDGETS:
        assert b.guard in GUARDS
        for f in (b.per_window, b.window_s, b.per_run):
            assert hasattr(CFG, f), f
        assert b.escalates_to in ("rollback", "halt")
        spent = [t for t in ENTRIES.values() if t.trigger is b.spent]
        assert spent and all(f"not {b.guard}" in t.guard for t in spent), b.rung
        assert all((t.target is P.HALTED) == (b.escalates_to == "halt") for t in spent), b.rung
    # today's defaults, and the new ones: evictions 2 an hour and 4 a run, retries and re-runs 20 an hour
    cfg = RecoveryConfig()
    assert [describe(cfg, b.rung) for b in BUDGETS] == [
        "20 per 3600 s", "20 per 3600 s", "3 per 3600 s", "3 per 3600 s", "2 per 3600 s and 4 per run"]
    # a restart that leaves a node out must be within the evict budget too
    for trig in (Trigger.EVICT, Trigger.HANG_AGAIN, Trigger.NODE_CHECK_FAILED, Trigger.SUSPECT_NODE, Trigger.SDC_AGAIN):
        assert all("within_evict_budget" in t.guard for t in ENTRIES.values() if t.trigger is trig), trig


@pytest.mark.parametrize("field", [f for b in BUDGETS for f in (b.per_window, b.per_run)])
def test_config_rejects_a_negative_budget_naming_the_field(field):
    with pytest.raises(ValueError, match=f"^{field}: must be >= 0"):
        RecoveryConfig(**{field: -1})


@pytest.mark.parametrize("field", [b.window_s for b in BUDGETS])
def test_config_rejects_a_window_that_is_not_positive(field):
    with pytest.raises(ValueError, match=f"^{field}: must be > 0"):
        RecoveryConfig(**{field: 0})


# ---------------------------------------------------------------------------------------------
# evict -> halt for a human, the node named
# ---------------------------------------------------------------------------------------------


def test_a_spent_evict_window_halts_for_a_human_naming_the_node():
    d = _driver(evict_budget=1, evict_run_budget=0)
    _started(d)
    healthy_run(d, 30)
    _evict_then_train(d, "node-b", 31, life=1)
    assert d.s.rungs.evict.total == 1 and d.s.rungs.restart.total == 1
    acts = _triaged(d, 32, "bad_rank", node="node-c")
    assert _moves(acts) == [(P.RUNNING, P.HALTED, "evict_budget_spent")] and d.s.phase is P.HALTED
    ev = _evidence(acts)
    assert (ev["rung"], ev["budget"], ev["in_window"], ev["escalates_to"]) == ("evict", "1 per 3600 s", 1, "halt")
    alert = _critical(acts)
    assert "human needed" in alert.title and "node node-c should be left out" in alert.body
    assert "evict budget (1 per 3600 s) is spent" in alert.body
    (cmd,) = [a for a in acts if isinstance(a, SendCommand)]
    assert cmd.args["mode"] == "halt" and "exclude_nodes" not in cmd.args  # no node left out: a human decides
    assert [a.node for a in acts if type(a).__name__ == "RecordSuspect"] == ["node-c"]  # judged bad: recorded
    assert [c.outcome for c in acts if isinstance(c, CloseIncident)] == ["halted"]


def test_a_spent_evict_run_budget_halts_even_with_the_window_free():
    d = _driver(evict_budget=10, evict_run_budget=2)
    _started(d)
    healthy_run(d, 30)
    _evict_then_train(d, "node-b", 31, life=1)
    d.now += 2 * HOUR  # the window is free; the run's budget is not
    _evict_then_train(d, "node-c", 32, life=2)
    d.now += 2 * HOUR
    acts = _triaged(d, 33, "bad_rank", node="node-d")
    assert _moves(acts) == [(P.RUNNING, P.HALTED, "evict_budget_spent")]
    ev = _evidence(acts)
    assert (ev["budget"], ev["in_window"], ev["in_run"]) == ("2 per run", 0, 2)
    assert "evict budget (2 per run) is spent" in _critical(acts).body


def test_a_passed_evict_window_frees_the_budget():
    d = _driver(evict_budget=1, evict_run_budget=0)
    _started(d)
    healthy_run(d, 30)
    _evict_then_train(d, "node-b", 31, life=1)
    d.now += HOUR + 1
    _evict_then_train(d, "node-c", 32, life=2)
    assert d.s.rungs.evict.total == 2


def test_a_hang_again_and_a_failed_node_check_past_the_evict_budget_halt_too():
    d = _driver(evict_budget=0)  # no eviction at all: every node to leave out is a human's
    _started(d)
    healthy_run(d, 30)
    d.feed(VerdictIn(verdict=Verdict(rule="hang", level=Level.CRITICAL, step=31, rank=3, onset_step=31,
                                     action=Action.RESTART, message="rank 3 hung",
                                     evidence={"cause": "hang", "culprit": [3], "nodes": ["node-b"], "life": 0}),
                     now=d.now))
    assert d.s.phase is P.RESTARTING  # a first hang: in place, no eviction
    _started(d, life=1)
    assert d.s.phase is P.REJOINING
    acts = d.feed(NodeCheckIn(ok=False, life=1, slow=(3,), slow_nodes=("node-b",), detail="matmul slow", now=d.now))
    assert _moves(acts) == [(P.REJOINING, P.HALTED, "evict_budget_spent")]
    assert _evidence(acts)["budget"] == "0 per 3600 s"


# ---------------------------------------------------------------------------------------------
# restart, rollback -> halt (today's), per run now too
# ---------------------------------------------------------------------------------------------


def test_a_spent_restart_run_budget_halts():
    d = _driver(restart_budget=10, restart_run_budget=1, repeat_window_s=0)
    _started(d)
    healthy_run(d, 30)

    def hang(step: int, life: int):
        v = Verdict(rule="hang", level=Level.CRITICAL, step=step, rank=3, onset_step=step, action=Action.RESTART,
                    message="rank 3 hung", evidence={"cause": "hang", "culprit": [3], "nodes": ["node-b"], "life": life})
        return d.feed(VerdictIn(verdict=v, now=d.now))

    assert _moves(hang(31, 0)) == [(P.RUNNING, P.RESTARTING, "hang")]
    _started(d, life=1)
    d.steps(31, 32)
    d.now += 2 * HOUR
    acts = hang(33, 1)
    assert _moves(acts) == [(P.RUNNING, P.HALTED, "restart_budget_spent")]
    ev = _evidence(acts)
    assert (ev["rung"], ev["budget"], ev["in_run"]) == ("restart", "1 per run", 1)
    assert "restart budget (1 per run) is spent" in _critical(acts).body


def _rollback_and_recover(d: Driver, step: int) -> None:
    d.spike(step, onset=step - 1)
    d.ack()
    d.answer_validate(9.0)
    assert d.s.phase is P.ROLLING_BACK
    d.ack()
    d.steps(d.s.last_step + 1, d.s.last_step + d.cfg.recover_window)
    assert d.s.phase is P.RUNNING


def test_a_spent_rollback_run_budget_halts_naming_it():
    d = _driver(rollback_budget=5, rollback_run_budget=1)
    healthy_run(d, 40)
    _rollback_and_recover(d, 41)
    assert d.s.rungs.rollback.total == 1
    d.now += 2 * HOUR
    d.steps(d.s.last_step + 1, 60)
    d.spike(61, onset=60)
    d.ack()
    acts = d.answer_validate(9.0)
    assert _moves(acts)[-1] == (P.VALIDATING, P.HALTED, "budget_exhausted")
    halt = [a for a in acts if isinstance(a, RecordTransition)][-1]
    assert halt.evidence["budget"]["budget"] == "1 per run" and halt.evidence["rollbacks_in_window"] == 0
    assert "rollback budget (1 per run) is spent" in _critical(acts).body


def test_the_rollback_window_still_halts_with_its_budget_named():
    d = _driver(rollback_budget=1)
    healthy_run(d, 40)
    _rollback_and_recover(d, 41)
    d.steps(d.s.last_step + 1, 60)
    d.spike(61, onset=60)
    d.ack()
    acts = d.answer_validate(9.0)
    assert _moves(acts)[-1][2] == "budget_exhausted"
    assert "rollback budget (1 per 3600 s) is spent: 1 in the last 3600 s" in _critical(acts).body


# ---------------------------------------------------------------------------------------------
# retry, rerun -> the spike's path (pause, validate, roll back with the LR cut)
# ---------------------------------------------------------------------------------------------


def test_a_spent_retry_window_pauses_then_rolls_back_with_the_lr_cut():
    d = _driver(retry_budget=2)
    healthy_run(d, 40)
    for step, rank in ((31, 1), (33, 2)):  # two ranks: no rank reaches its own transient budget
        assert _moves(_triaged(d, step, "transient", rank=rank)) == [(P.RUNNING, P.RUNNING, "triage_cured")]
    acts = _triaged(d, 35, "transient", rank=3)
    assert _moves(acts) == [(P.RUNNING, P.PAUSING, "retry_budget_spent")]
    (opened,) = [a for a in acts if isinstance(a, OpenIncident)]
    assert (opened.rule, opened.level, opened.spike_step) == ("triage", "critical", 35)
    ev = opened.evidence["budget"]
    assert (ev["rung"], ev["budget"], ev["in_window"], ev["escalates_to"]) == ("retry", "2 per 3600 s", 2, "rollback")
    alert = _critical(acts)
    assert "retry budget is spent" in alert.title and "retry budget (2 per 3600 s) is spent" in alert.body
    assert [(c.type, c.incident_id) for c in acts if isinstance(c, SendCommand)] == [("pause", opened.id)]
    assert not [a for a in acts if isinstance(a, CloseIncident)]  # not taken as cured
    d.ack()
    d.answer_validate(9.0)  # the weights are off: today's rollback with the LR cut
    (rollback,) = [a for a in d.actions if isinstance(a, SendCommand) and a.type == "rollback"]
    assert rollback.args["lr_scale"] == pytest.approx(d.cfg.policy.lr_factor) and d.s.phase is P.ROLLING_BACK
    assert d.s.rungs.retry.total == 3 and d.s.rungs.rerun.total == 3


def test_a_spent_retry_run_budget_pauses_even_with_the_window_free():
    d = _driver(retry_budget=50, retry_run_budget=1)
    healthy_run(d, 40)
    assert _moves(_triaged(d, 31, "transient"))[0][2] == "triage_cured"
    d.now += 2 * HOUR
    acts = _triaged(d, 35, "transient", rank=2)
    assert _moves(acts) == [(P.RUNNING, P.PAUSING, "retry_budget_spent")]
    assert _evidence(acts)["budget"] == "1 per run"


def test_a_spent_rerun_window_answers_a_cure_as_if_no_triage_had_happened():
    d = _driver(rerun_budget=2)
    healthy_run(d, 40)
    assert _triaged(d, 31, "optimizer") == [] and d.s.rungs.rerun.total == 1  # every report counts
    assert _moves(_triaged(d, 33, "data"))[0][2] == "triage_cured"
    acts = _triaged(d, 36, "data")
    assert _moves(acts) == [(P.RUNNING, P.PAUSING, "rerun_budget_spent")]
    ev = _evidence(acts)
    assert (ev["rung"], ev["budget"], ev["in_window"]) == ("rerun", "2 per 3600 s", 2)
    assert "rerun budget (2 per 3600 s) is spent" in _critical(acts).body
    assert [c.type for c in acts if isinstance(c, SendCommand)] == ["pause"]
    assert d.s.rungs.retry.total == 0  # data cures retry nothing


def test_a_spent_rerun_run_budget_pauses_and_a_re_read_report_counts_once():
    d = _driver(rerun_budget=50, rerun_run_budget=2)
    healthy_run(d, 40)
    _triaged(d, 31, "data", ts=7000.0)
    assert _triaged(d, 31, "data", ts=7000.0) == [] and d.s.rungs.rerun.total == 1  # a re-read
    _triaged(d, 32, "unclear", ts=7001.0)  # not cured, counted
    d.now += 2 * HOUR
    acts = _triaged(d, 40, "data", ts=7002.0)
    assert _moves(acts) == [(P.RUNNING, P.PAUSING, "rerun_budget_spent")]
    assert _evidence(acts)["budget"] == "2 per run"


def test_a_passed_retry_window_frees_the_budget():
    d = _driver(retry_budget=1)
    healthy_run(d, 40)
    assert _moves(_triaged(d, 31, "transient"))[0][2] == "triage_cured"
    d.now += HOUR + 1
    assert _moves(_triaged(d, 35, "transient", rank=2))[0][2] == "triage_cured"
    d.now += 10
    assert _moves(_triaged(d, 38, "transient", rank=3))[0][2] == "retry_budget_spent"


def test_a_run_that_cannot_pause_records_the_cure_with_a_critical_alert_naming_the_budget():
    d = _driver(retry_budget=1)
    d.feed(StartedIn(capabilities=(CommandType.DETAIL,), now=d.now))
    healthy_run(d, 40)
    _triaged(d, 31, "transient")
    acts = _triaged(d, 35, "transient", rank=2)
    assert _moves(acts) == [(P.RUNNING, P.RUNNING, "triage_cured")]
    assert [c.outcome for c in acts if isinstance(c, CloseIncident)] == ["cured"]
    alert = _critical(acts)
    assert "cannot pause" in alert.title and alert.evidence["budget"]["budget"] == "1 per 3600 s"
    assert not [a for a in acts if isinstance(a, SendCommand)]


# ---------------------------------------------------------------------------------------------
# Memory
# ---------------------------------------------------------------------------------------------


def test_the_rungs_uses_round_trip_the_state_dict_and_an_old_state_loads():
    d = _driver(retry_budget=5)
    _started(d)
    healthy_run(d, 30)
    _triaged(d, 31, "transient")
    _evict_then_train(d, "node-b", 32, life=1)
    s = d.s
    assert (s.rungs.retry.total, s.rungs.rerun.total, s.rungs.evict.total, s.rungs.restart.total) == (1, 2, 1, 1)
    restored = RecoveryState.from_state_dict(s.state_dict())
    assert restored.rungs == s.rungs and restored.state_dict() == s.state_dict()
    blank = RecoveryState(run="r", salt="s")
    restored.load_state_dict(blank.state_dict())
    assert restored.rungs == RungUses()
    old = s.state_dict()
    del old["rungs"]  # a state saved before the budgets
    assert RecoveryState.from_state_dict(old).rungs == RungUses()


def test_the_remembered_times_are_bounded():
    d = _driver(rerun_budget=3, rerun_run_budget=0)
    healthy_run(d, 40)
    for _ in range(20):
        _triaged(d, 31, "optimizer")
        d.now += HOUR  # never in one window
    assert len(d.s.rungs.rerun.times) <= 6 and d.s.rungs.rerun.total == 20
    assert BUDGET["rerun"].spent is Trigger.RERUN_BUDGET_SPENT


def take_every_budget_transition() -> None:
    """For the coverage test of every declared transition (tests/controller/test_recovery_held.py)."""
    test_a_spent_evict_window_halts_for_a_human_naming_the_node()
    test_a_hang_again_and_a_failed_node_check_past_the_evict_budget_halt_too()
    test_a_spent_retry_window_pauses_then_rolls_back_with_the_lr_cut()
    test_a_spent_rerun_window_answers_a_cure_as_if_no_triage_had_happened()
    d = _driver(evict_budget=0)  # a bad rank while recovering from a rollback, no eviction left
    _started(d)
    recovering_after_a_rollback(d)
    acts = _triaged(d, 36, "bad_rank", node="node-b")
    assert _moves(acts)[-1] == (P.RECOVERING, P.HALTED, "evict_budget_spent")


def test_left_says_each_rungs_uses_and_room_from_a_stored_state():
    from cliffguard.controller.recovery_budgets import left
    from cliffguard.controller.recovery_state import RungUse

    cfg = RecoveryConfig(evict_budget=2, evict_window_s=3600, evict_run_budget=4, retry_budget=20,
                         retry_window_s=3600)
    s = RecoveryState(run="r", salt="s", rollback_times=(1_000.0, 4_000.0))
    s.rungs = replace(s.rungs, evict=RungUse(times=(100.0, 4_500.0), total=3), rollback=RungUse(total=2),
                      retry=RungUse(times=tuple(4_000.0 + i for i in range(19)), total=19))
    found = left(cfg, {"recovery": s.state_dict()}, now=5_000.0)
    by = {r["rung"]: r for r in found["rungs"]}
    assert [r["rung"] for r in found["rungs"]] == [b.rung for b in BUDGETS] and found["source"] == "config"
    assert (by["rollback"]["in_window"], by["rollback"]["left"], by["rollback"]["escalates_to"]) == (1, 2, "halt")
    # evict: 1 in the window of 2 leaves 1, and 3 of 4 in the run leave 1 as well
    assert (by["evict"]["in_window"], by["evict"]["in_run"], by["evict"]["left"]) == (1, 3, 1)
    assert by["evict"]["budget"] == "2 per 3600 s and 4 per run"
    assert (by["retry"]["left"], by["retry"]["escalates_to"]) == (1, "rollback")
    assert by["restart"]["left"] == cfg.restart_budget
    fresh = {r["rung"]: r["left"] for r in left(cfg, None, now=5_000.0)["rungs"]}  # no stored state yet
    assert fresh["evict"] == 2 and fresh["rollback"] == cfg.rollback_budget


def test_the_limits_the_controller_stored_win_over_the_readers_and_a_bad_doc_is_not_used():
    from cliffguard.controller.recovery_budgets import left, limits_doc

    enforced = RecoveryConfig(rollback_budget=1, evict_run_budget=9)
    s = RecoveryState(run="r", salt="s", rollback_times=(4_900.0,))
    state = {"recovery": s.state_dict(), "budget_limits": limits_doc(enforced)}
    found = left(RecoveryConfig(), state, now=5_000.0)  # the reader's own config: the defaults
    by = {r["rung"]: r for r in found["rungs"]}
    assert found["source"] == "controller" and (by["rollback"]["per_window"], by["rollback"]["left"]) == (1, 0)
    assert by["evict"]["per_run"] == 9
    for bad in ({"rollback": [1, 3600]}, {**limits_doc(enforced), "evict": ["2", 3600, 0]},
                {**limits_doc(enforced), "rollback": [1, -5.0, 0]}, "junk"):
        assert left(RecoveryConfig(), {**state, "budget_limits": bad}, now=5_000.0)["source"] == "config", bad
