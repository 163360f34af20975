"""Triage verdicts in the recovery machine (controller/recovery_others.py ``on_triaged``): a step the
kit cured itself is an incident opened and closed ``cured`` at once, with an info alert; the ladder's
memory is kept; a class the kit does not cure, a re-read, or a verdict mid-incident moves nothing."""

from __future__ import annotations

from cliffguard.controller.recovery_types import (
    Alert,
    CloseIncident,
    OpenIncident,
    Phase,
    RecordTransition,
    SendCommand,
    TriagedIn,
)
from tests.controller.test_recovery import Driver, healthy_run


def _triaged(d: Driver, step: int, cls: str = "data", *, ts: float = 5000.0):
    return d.feed(TriagedIn(step=step, now=d.now, cls=cls, remedy="skip_batch" if cls == "data" else "retry_step",
                            rank=1, reason="rank 1's shard is bad on rank 0 too", reruns=2, rerun_s=0.05,
                            sample_ids=(41, 42) if cls == "data" else (), update_applied=cls == "transient", ts=ts))


def test_a_cured_step_is_an_incident_closed_cured_at_once_with_an_info_alert():
    d = Driver()
    healthy_run(d, 30)
    acts = _triaged(d, 31)
    (opened,) = [a for a in acts if isinstance(a, OpenIncident)]
    assert (opened.rule, opened.level, opened.spike_step) == ("triage", "warn", 31)
    assert opened.evidence["cause"] == "data" and opened.evidence["sample_ids"] == [41, 42]
    rec = [a for a in acts if isinstance(a, RecordTransition)]
    assert [(r.from_state, r.to_state, r.trigger) for r in rec] == [(Phase.RUNNING, Phase.RUNNING, "triage_cured")]
    assert [(c.id, c.outcome) for c in acts if isinstance(c, CloseIncident)] == [(opened.id, "cured")]
    (alert,) = [a for a in acts if isinstance(a, Alert)]
    assert alert.level == "info" and "cured" in alert.title
    assert not any(isinstance(a, SendCommand) for a in acts)  # the trainer cured it: nothing to send
    assert d.s.phase is Phase.RUNNING and d.s.incident is None
    assert _triaged(d, 31) == []  # a re-read of the same report
    assert [a for a in _triaged(d, 35, "transient", ts=5010.0) if isinstance(a, CloseIncident)][0].outcome == "cured"


def test_a_class_the_kit_does_not_cure_and_a_verdict_mid_incident_move_nothing():
    d = Driver()
    healthy_run(d, 30)
    for cls in ("bad_rank", "optimizer", "unclear"):
        assert _triaged(d, 31, cls) == []
    d.spike(31)  # an incident of the machine's own: pausing
    assert d.s.phase is not Phase.RUNNING
    inc = d.s.incident
    assert _triaged(d, 32, ts=6000.0) == [] and d.s.incident == inc


def take_every_triage_transition() -> None:
    """For the coverage test of every declared transition (tests/controller/test_recovery_held.py)."""
    test_a_cured_step_is_an_incident_closed_cured_at_once_with_an_info_alert()
