"""A diverged replica in the recovery machine (controller/recovery_sdc.py): straight back to the
newest stable checkpoint at or before the replicas' last agreement, with the LR kept and no data
skipped; another rank again while recovering continues the incident; no rollback possible halts;
mid-incident it is an alert only. The same rank again (a persistent SDC) has its node evicted, the
node its heartbeats named (controller/rank_nodes.py), or a human called naming the rank."""

from __future__ import annotations

import pytest

from cliffguard.controller.rank_nodes import RankNodes
from cliffguard.controller.recovery_table import sdc_node
from cliffguard.controller.recovery_types import (
    Alert,
    CheckpointIn,
    CloseIncident,
    OpenIncident,
    Phase,
    RecordSuspect,
    RecordTransition,
    SendCommand,
    StartedIn,
    VerdictIn,
)
from cliffguard.controller.rules.sdc import SdcRule
from cliffguard.controller.verdict import Action
from cliffguard.core.enums import CommandType, EventType, Level
from cliffguard.core.events import Event, make_event
from cliffguard.core.schema import SchemaError
from testing.controller_stack import step_data
from tests.controller.test_recovery import Driver, healthy_run


def _check(step: int, last_agreed: int | None, suspects=(2,)) -> Event:
    check = {"agree": False, "suspects": list(suspects), "named": len(suspects) == 1,
             "groups": [[0, 1, 3], list(suspects)] if len(suspects) == 1 else [[0], [1]], "mismatches": 1}
    if last_agreed is not None:
        check["last_agreed"] = last_agreed
    return make_event(EventType.STEP, "run-1", step, {**step_data(2.0, step), "param_check": check}, world=4)


def _beat(node: str, ranks: tuple[int, ...], life: int = 0) -> Event:
    """A node heartbeat: ``node``'s leader speaks for its ``ranks`` in ``life``."""
    n = len(ranks)
    return make_event(EventType.HEARTBEAT, "run-1", 5, {"state": "running", "ranks": list(ranks), "steps": [5] * n,
                                                        "ages_s": [0.1] * n, "collectives": [""] * n, "node": node,
                                                        "life": life}, rank=ranks[0], world=4)


def _sdc(d: Driver, step: int, last_agreed: int | None, suspects=(2,), nodes: RankNodes | None = None):
    """The rule's verdict for a disagreeing check, fed to the machine (through the edge's rank -> node
    annotation when ``nodes`` is given)."""
    (v,) = SdcRule().on_event(_check(step, last_agreed, suspects))
    inp = VerdictIn(verdict=v, now=d.now)
    return d.feed(nodes.annotate("run-1", inp) if nodes is not None else inp)


def _two_nodes(d: Driver, *, life: int = 0, restarts_left: int = 3, nodes: int = 2) -> RankNodes:
    """torchrun with restarts over ``nodes`` nodes; node-a holds ranks 0-1, node-b rank 2 alone (their
    beats; a one-rank node, so its eviction leaves the whole node out: the device-level eviction of a
    node with several ranks is tests/controller/test_recovery_evict_device.py); rank 3 never beats."""
    d.feed(StartedIn(capabilities=tuple(CommandType), now=d.now, life=life, max_restarts=3, restarts_left=restarts_left,
                     nodes=nodes, min_nodes=1))
    rn = RankNodes()
    rn.seen(_beat("node-a", (0, 1), life))
    rn.seen(_beat("node-b", (2,), life))
    return rn


def _healthy_40(d: Driver) -> None:
    healthy_run(d, 30)
    d.feed(CheckpointIn(step=30, kind="memory", verified=True, now=d.now))
    d.steps(31, 40)


def test_the_rule_names_the_suspect_and_the_last_agreement():
    (v,) = SdcRule().on_event(_check(40, 25))
    assert (v.rule, v.level, v.step, v.onset_step, v.rank, v.action) == ("sdc", Level.CRITICAL, 40, 25, 2, Action.ROLLBACK)
    assert "rank 2" in v.message and "step 25" in v.message and v.evidence["suspects"] == [2]
    (two,) = SdcRule().on_event(_check(40, None, suspects=(0, 1)))
    assert two.rank is None and two.onset_step is None and "none is named" in two.message
    agree = make_event(EventType.STEP, "r", 5, {**step_data(2.0, 5), "param_check": {"agree": True}}, world=4)
    assert SdcRule().on_event(agree) == []
    with pytest.raises(SchemaError, match="suspects"):  # from the network: checked before any rule reads it
        make_event(EventType.STEP, "r", 5, {**step_data(2.0, 5), "param_check": {"agree": False, "suspects": "2"}})


def test_a_diverged_replica_rolls_back_at_once_to_before_the_last_agreement_lr_kept_no_data_skipped():
    d = Driver()
    _healthy_40(d)
    acts = _sdc(d, 40, last_agreed=25)
    (opened,) = [a for a in acts if isinstance(a, OpenIncident)]
    assert (opened.rule, opened.spike_step, opened.onset_step) == ("sdc", 40, 26)
    assert opened.evidence["suspects"] == [2] and opened.evidence["last_agreed"] == 25
    # the checkpoint at 30 is newer than the last agreement: the newest stable one at or before 25 is 20
    assert d.commands() == [("rollback", {"to_step": 20, "lr_scale": 1.0})]  # no pause, no validate, no skip_data
    assert d.triggers() == ["sdc"] and d.s.phase is Phase.ROLLING_BACK
    assert [a.level for a in acts if isinstance(a, Alert)] == ["critical"]
    assert _sdc(d, 45, last_agreed=25) == []  # the next check's echo: the rollback on its way answers it
    d.ack()
    assert d.s.phase is Phase.RECOVERING
    d.steps(20, 26)
    assert d.s.phase is Phase.RUNNING
    closes = [a for a in d.actions if isinstance(a, CloseIncident)]
    assert [(c.id, c.outcome, c.lr_scale) for c in closes] == [(opened.id, "rolled_back", 1.0)]


def test_another_rank_diverging_while_recovering_continues_the_incident_until_the_budget_halts():
    d = Driver()  # rollback_budget 2
    _healthy_40(d)
    _sdc(d, 40, last_agreed=25)
    d.ack()
    d.steps(20, 22)
    acts = _sdc(d, 22, last_agreed=20, suspects=(1,))  # another rank diverged: the same incident, another rollback
    assert not [a for a in acts if isinstance(a, OpenIncident)]
    assert d.commands()[-1] == ("rollback", {"to_step": 20, "lr_scale": 1.0})
    d.ack()
    d.steps(20, 21)
    acts = _sdc(d, 21, last_agreed=20, suspects=(3,))
    assert d.s.phase is Phase.HALTED and d.triggers()[-1] == "budget_exhausted"
    assert "left running on the diverged replica" in [a for a in acts if isinstance(a, RecordTransition)][-1].reason
    assert len({a.id for a in d.actions if isinstance(a, OpenIncident)}) == 1


def test_no_agreement_ever_or_no_rollback_declared_halts_with_the_job_left_running():
    d = Driver()
    _healthy_40(d)
    _sdc(d, 40, last_agreed=None, suspects=(0, 1))
    assert d.s.phase is Phase.HALTED and d.triggers() == ["no_target"]
    assert not d.commands()
    e = Driver()
    e.feed(StartedIn(capabilities=(CommandType.PAUSE, CommandType.VALIDATE, CommandType.RESUME), now=e.now))
    _healthy_40(e)
    _sdc(e, 40, last_agreed=35)
    assert e.s.phase is Phase.HALTED and e.triggers() == ["rollback_unsupported"] and not e.commands()


def test_mid_incident_a_divergence_is_a_critical_alert_and_moves_nothing():
    d = Driver()
    _healthy_40(d)
    d.spike(step=41)
    assert d.s.phase is Phase.PAUSING
    acts = _sdc(d, 42, last_agreed=30)
    assert not [a for a in acts if isinstance(a, (RecordTransition, SendCommand))]
    (alert,) = [a for a in acts if isinstance(a, Alert)]
    assert alert.level == "critical" and alert.rule == "sdc" and "after the incident in progress" in alert.title


def test_a_divergence_while_recovering_from_a_spike_closes_that_incident_and_opens_its_own():
    d = Driver()
    _healthy_40(d)
    d.spike(step=41, onset=39)
    d.ack()
    d.answer_validate(9.0)
    d.ack()
    assert d.s.phase is Phase.RECOVERING
    spike_incident = d.s.incident.id
    d.steps(30, 33)
    acts = _sdc(d, 33, last_agreed=30)
    assert [(c.id, c.outcome) for c in acts if isinstance(c, CloseIncident)] == [(spike_incident, "rolled_back")]
    assert [a.rule for a in acts if isinstance(a, OpenIncident)] == ["sdc"]
    assert d.s.phase is Phase.ROLLING_BACK and d.commands()[-1][1]["to_step"] == 30
    assert d.commands()[-1][1]["lr_scale"] == d.s.lr_scale < 1.0  # the spike's cut stays; the SDC adds none


PERSISTENT = "rank 2 diverged again after a rollback: persistent silent data corruption"


def test_the_same_rank_diverging_again_while_recovering_evicts_its_node_and_the_incident_says_why():
    d = Driver()
    rn = _two_nodes(d)
    _healthy_40(d)
    acts = _sdc(d, 40, last_agreed=25, nodes=rn)  # the first divergence: rolled back, as ever
    (opened,) = [a for a in acts if isinstance(a, OpenIncident)]
    assert d.commands() == [("rollback", {"to_step": 20, "lr_scale": 1.0})] and d.triggers() == ["sdc"]
    assert d.s.hang.diverged == ((2, 0, "node-b"),)
    d.ack()
    d.steps(20, 22)
    acts = _sdc(d, 22, last_agreed=20, nodes=rn)  # rank 2 again: not another rollback, its node leaves
    assert not [a for a in acts if isinstance(a, OpenIncident)] and d.s.incident.id == opened.id  # the same incident
    (cmd,) = [a for a in acts if isinstance(a, SendCommand)]
    assert (cmd.type, cmd.args["mode"], cmd.args["exclude_nodes"], cmd.args["ranks"]) == (
        "restart", "exclude", ["node-b"], [2])
    assert not [a for a in acts if isinstance(a, SendCommand) and a.type == "rollback"]
    (rec,) = [a for a in acts if isinstance(a, RecordSuspect)]
    assert (rec.node, rec.cause, rec.incident_id) == ("node-b", "sdc", opened.id) and PERSISTENT in rec.reason
    (move,) = [a for a in acts if isinstance(a, RecordTransition)]
    assert (move.from_state, move.to_state, move.trigger) == (Phase.RECOVERING, Phase.RESTARTING, "sdc_again")
    assert PERSISTENT in move.reason and "restarting without node node-b" in move.reason
    assert move.evidence["node"] == "node-b" and move.evidence["culprit"] == [2]
    assert [a.rule for a in acts if isinstance(a, Alert)] == ["sdc"]
    assert _sdc(d, 23, last_agreed=20, nodes=rn) == []  # its echo while the group restarts: a human need not hear it twice
    d.feed(StartedIn(capabilities=tuple(CommandType), now=d.now, life=1, max_restarts=3, restarts_left=2, nodes=1,
                     min_nodes=1))
    d.steps(20, 20)
    assert d.s.phase is Phase.RUNNING
    assert [(c.id, c.outcome) for c in d.actions if isinstance(c, CloseIncident)] == [(opened.id, "restarted")]


def test_the_same_rank_in_a_later_incident_is_evicted_too():
    d = Driver()
    rn = _two_nodes(d)
    _healthy_40(d)
    _sdc(d, 40, last_agreed=25, nodes=rn)
    d.ack()
    d.steps(20, 40)
    assert d.s.phase is Phase.RUNNING and d.s.incident is None  # recovered: the incident closed rolled_back
    acts = _sdc(d, 40, last_agreed=35, nodes=rn)
    (opened,) = [a for a in acts if isinstance(a, OpenIncident)]
    assert opened.rule == "sdc" and opened.evidence["persistent"] is True
    assert d.triggers()[-1] == "sdc_again" and d.s.phase is Phase.RESTARTING
    assert [c[1]["exclude_nodes"] for c in d.commands() if c[0] == "restart"] == [["node-b"]]


def test_another_rank_diverging_after_a_rollback_is_rolled_back_again():
    d = Driver()
    rn = _two_nodes(d)
    _healthy_40(d)
    _sdc(d, 40, last_agreed=25, nodes=rn)
    d.ack()
    d.steps(20, 22)
    _sdc(d, 22, last_agreed=20, suspects=(1,), nodes=rn)  # rank 1 (node-a) is new: a rollback, no restart
    assert d.triggers() == ["sdc", "rollback_applied", "sdc"] and d.s.phase is Phase.ROLLING_BACK
    assert [c[0] for c in d.commands()] == ["rollback", "rollback"]
    assert not [a for a in d.actions if isinstance(a, RecordSuspect)]
    assert d.s.hang.diverged == ((2, 0, "node-b"), (1, 0, "node-a"))


def test_a_persistent_sdc_that_cannot_be_evicted_halts_for_a_human_naming_the_rank():
    # no node heartbeat named rank 2's node: never guessed, a human is called with the rank named
    d = Driver()
    _two_nodes(d)
    _healthy_40(d)
    _sdc(d, 40, last_agreed=25)
    d.ack()
    d.steps(20, 22)
    acts = _sdc(d, 22, last_agreed=20)
    assert d.s.phase is Phase.HALTED and d.triggers()[-1] == "exclude_unavailable"
    reason = [a for a in acts if isinstance(a, RecordTransition)][-1].reason
    assert PERSISTENT in reason and "its node is not known" in reason and "node is unknown" in reason
    assert [c[1]["mode"] for c in d.commands() if c[0] == "restart"] == ["halt"]  # no exclude restart, no rollback
    assert not [a for a in acts if isinstance(a, RecordSuspect)]
    # no restart to give (torchrun without restarts), and too few nodes: the hangs' halts, the node named
    for restarts_left, nodes, trigger, why in ((0, 2, "restart_unavailable", "evict node node-b by hand"),
                                               (3, 1, "exclude_unavailable", "cannot keep 1 node(s)")):
        e = Driver()
        rn = _two_nodes(e, restarts_left=restarts_left, nodes=nodes)
        _healthy_40(e)
        _sdc(e, 40, last_agreed=25, nodes=rn)
        e.ack()
        e.steps(20, 22)
        acts = _sdc(e, 22, last_agreed=20, nodes=rn)
        assert e.s.phase is Phase.HALTED and e.triggers()[-1] == trigger
        reason = [a for a in acts if isinstance(a, RecordTransition)][-1].reason
        assert PERSISTENT in reason and why in reason, reason
        assert [(r.node, r.cause) for r in acts if isinstance(r, RecordSuspect)] == [("node-b", "sdc")]
        assert not [c for c in e.commands() if c[0] == "restart" and c[1]["mode"] != "halt"]


def test_the_edge_names_a_ranks_node_from_the_heartbeats_and_an_old_lifes_word_is_not_used():
    rn = RankNodes()
    rn.seen(_beat("node-b", (2, 3), life=0))
    (v,) = SdcRule().on_event(_check(40, 25))
    annotated = rn.annotate("run-1", VerdictIn(verdict=v, now=0.0))
    assert (annotated.verdict.evidence["node"], annotated.verdict.evidence["node_life"]) == ("node-b", 0)
    assert rn.annotate("run-2", VerdictIn(verdict=v, now=0.0)).verdict.evidence.get("node") is None  # another run
    (unnamed,) = SdcRule().on_event(_check(40, 25, suspects=(0, 1)))
    assert "node" not in rn.annotate("run-1", VerdictIn(verdict=unnamed, now=0.0)).verdict.evidence
    d = Driver()
    d.feed(StartedIn(capabilities=tuple(CommandType), now=d.now, life=1, max_restarts=3, restarts_left=2))
    assert sdc_node(d.s, annotated.verdict) == ""  # seen in life 0, the group is in life 1: rank 2 may be elsewhere
    rn.seen(_beat("node-c", (2, 3), life=1))
    assert sdc_node(d.s, rn.annotate("run-1", VerdictIn(verdict=v, now=0.0)).verdict) == "node-c"


def take_every_sdc_transition() -> None:
    """For the coverage test of every declared transition (tests/controller/test_recovery_held.py)."""
    test_a_diverged_replica_rolls_back_at_once_to_before_the_last_agreement_lr_kept_no_data_skipped()
    test_another_rank_diverging_while_recovering_continues_the_incident_until_the_budget_halts()
    test_the_same_rank_diverging_again_while_recovering_evicts_its_node_and_the_incident_says_why()
    test_the_same_rank_in_a_later_incident_is_evicted_too()
    test_a_persistent_sdc_that_cannot_be_evicted_halts_for_a_human_naming_the_rank()
    test_no_agreement_ever_or_no_rollback_declared_halts_with_the_job_left_running()
    test_a_divergence_while_recovering_from_a_spike_closes_that_incident_and_opens_its_own()
    # the rest: from recovering, each halt; from running, a spent budget
    d = Driver()
    _healthy_40(d)
    _sdc(d, 40, last_agreed=25)
    d.ack()
    d.steps(20, 21)
    _sdc(d, 21, last_agreed=None, suspects=(1,))
    assert d.triggers()[-1] == "no_target" and d.s.phase is Phase.HALTED
    e = Driver()
    _healthy_40(e)
    _sdc(e, 40, last_agreed=25)
    e.ack()
    e.feed(StartedIn(capabilities=(CommandType.PAUSE, CommandType.VALIDATE, CommandType.RESUME), now=e.now))
    e.steps(20, 21)
    _sdc(e, 21, last_agreed=20, suspects=(1,))
    assert e.triggers()[-1] == "rollback_unsupported"
    f = Driver()
    _healthy_40(f)
    for rank in (1, 2):
        _sdc(f, 40, last_agreed=25, suspects=(rank,))
        f.ack()
        f.steps(20, 40)
        assert f.s.phase is Phase.RUNNING
    _sdc(f, 40, last_agreed=25, suspects=(3,))
    assert f.triggers()[-1] == "budget_exhausted" and f.s.phase is Phase.HALTED
