"""Step bounds and integer ranges (controller/bounds.py); through classify in test_edge.py."""

from __future__ import annotations

import pytest

from cliffguard.controller.bounds import StepBounds, out_of_range
from cliffguard.core.events import make_event
from tests.core.test_events import STEP


def test_a_lone_forged_first_step_does_not_lock_the_real_steps_out():
    """Without event signatures a forged event can be a run's first; it never gets confirmed."""
    bounds = StepBounds(max_step_jump=1_000)
    ev = [make_event("step", "run-1", n, STEP) for n in (2**31 - 1, 5, 6, 7)]
    assert [bounds.check(e) for e in ev] == [None] * 4
    assert bounds.high("run-1") == 7
    assert bounds.check(make_event("step", "run-1", 2**31 - 1, STEP)).startswith("step:")


def test_the_remembered_runs_are_bounded():
    bounds = StepBounds(max_step_jump=10, max_runs=2)
    for run in ("a", "b", "c"):
        bounds.check(make_event("step", run, 5, STEP))
    assert [bounds.high(r) for r in ("a", "b", "c")] == [None, 5, 5]


def test_max_step_jump_is_checked():
    with pytest.raises(ValueError, match="^max_step_jump:"):
        StepBounds(0)


def test_out_of_range_names_the_field():
    assert out_of_range(make_event("step", "r", 1, {**STEP, "clipped_layers": -(2**31) - 1})).startswith(
        "data.clipped_layers:")
    assert out_of_range(make_event("step", "r", 1, {**STEP, "sample_range": [0, 2**64]})).startswith(
        "data.sample_range:")
    assert out_of_range(make_event("step", "r", 1, STEP)) is None
