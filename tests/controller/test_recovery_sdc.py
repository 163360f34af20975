"""A diverged replica in the recovery machine (controller/recovery_sdc.py): straight back to the
newest stable checkpoint at or before the replicas' last agreement, with the LR kept and no data
skipped; again while recovering continues the incident; no rollback possible halts; mid-incident
it is an alert only."""

from __future__ import annotations

import pytest

from cliffguard.controller.recovery_types import (
    Alert,
    CheckpointIn,
    CloseIncident,
    OpenIncident,
    Phase,
    RecordTransition,
    SendCommand,
    StartedIn,
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


def _sdc(d: Driver, step: int, last_agreed: int | None, suspects=(2,)):
    """The rule's verdict for a disagreeing check, fed to the machine."""
    from cliffguard.controller.recovery_types import VerdictIn

    (v,) = SdcRule().on_event(_check(step, last_agreed, suspects))
    return d.feed(VerdictIn(verdict=v, now=d.now))


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


def test_diverging_again_while_recovering_continues_the_incident_until_the_budget_halts():
    d = Driver()  # rollback_budget 2
    _healthy_40(d)
    _sdc(d, 40, last_agreed=25)
    d.ack()
    d.steps(20, 22)
    acts = _sdc(d, 22, last_agreed=20)  # diverged again: the same incident, another rollback
    assert not [a for a in acts if isinstance(a, OpenIncident)]
    assert d.commands()[-1] == ("rollback", {"to_step": 20, "lr_scale": 1.0})
    d.ack()
    d.steps(20, 21)
    acts = _sdc(d, 21, last_agreed=20)
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


def take_every_sdc_transition() -> None:
    """For the coverage test of every declared transition (tests/controller/test_recovery_held.py)."""
    test_a_diverged_replica_rolls_back_at_once_to_before_the_last_agreement_lr_kept_no_data_skipped()
    test_diverging_again_while_recovering_continues_the_incident_until_the_budget_halts()
    test_no_agreement_ever_or_no_rollback_declared_halts_with_the_job_left_running()
    test_a_divergence_while_recovering_from_a_spike_closes_that_incident_and_opens_its_own()
    # the rest: from recovering, each halt; from running, a spent budget
    d = Driver()
    _healthy_40(d)
    _sdc(d, 40, last_agreed=25)
    d.ack()
    d.steps(20, 21)
    _sdc(d, 21, last_agreed=None)
    assert d.triggers()[-1] == "no_target" and d.s.phase is Phase.HALTED
    e = Driver()
    _healthy_40(e)
    _sdc(e, 40, last_agreed=25)
    e.ack()
    e.feed(StartedIn(capabilities=(CommandType.PAUSE, CommandType.VALIDATE, CommandType.RESUME), now=e.now))
    e.steps(20, 21)
    _sdc(e, 21, last_agreed=20)
    assert e.triggers()[-1] == "rollback_unsupported"
    f = Driver()
    _healthy_40(f)
    for _ in range(2):
        _sdc(f, 40, last_agreed=25)
        f.ack()
        f.steps(20, 40)
        assert f.s.phase is Phase.RUNNING
    _sdc(f, 40, last_agreed=25)
    assert f.triggers()[-1] == "budget_exhausted" and f.s.phase is Phase.HALTED
