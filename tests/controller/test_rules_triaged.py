"""A step the kit's triage cured (``triaged``: data or transient) is not the curve's: the loss, grad
norm and held rules leave it out, so a poisoned stretch the trainer skipped itself pauses nothing;
the same stretch untriaged, or triaged to a class the kit does not cure, is answered as before."""

from __future__ import annotations

import pytest

from cliffguard.controller.detect import RulesConfig, RunDetector
from cliffguard.core.events import make_event
from testing.controller_stack import healthy_loss, step_data


def _verdicts(triaged: str | None) -> list:
    det = RunDetector(RulesConfig())
    out = []
    for step in range(120):
        bad = 100 <= step < 108  # a poisoned stretch, longer than the held rule's skips_after
        data = {**step_data(healthy_loss(step) * (40 if bad else 1), step),
                "grad_norm": 500.0 if bad else 1.0, "guard": "skip" if bad else "ok", "skipped": bad}
        if bad and triaged is not None:
            data["triaged"] = triaged
        out += det.on_event(make_event("step", "r", step, data))
    return [v for v in out if v.level.value == "critical"]


def test_a_cured_stretch_pauses_nothing() -> None:
    assert _verdicts("data") == [] and _verdicts("transient") == []


@pytest.mark.parametrize("triaged", [None, "optimizer", "bad_rank"])
def test_the_same_stretch_not_cured_is_answered(triaged) -> None:
    rules = {v.rule for v in _verdicts(triaged)}
    assert {"guard_hold", "loss_spike"} & rules, rules
