"""controller.runstate: a run's saved state is plain JSON, whether or not it holds non-finite floats."""

from __future__ import annotations

import json
import math

from controller.detect import RunDetector
from controller.recovery import new_state
from controller.runstate import RunSlot
from core.events import make_event
from core.floats import to_json
from tests.controller.store import factory as f


def _slot(losses: list[float]) -> RunSlot:
    det = RunDetector()
    for step, loss in enumerate(losses):
        det.on_event(make_event("step", "r", step, f.step(step, loss).data))
    return RunSlot("r", det, new_state("r", "salt"))


def test_finite_state_is_the_same_json_as_the_python_walk():
    slot = _slot([2.0 - 0.01 * i for i in range(40)])
    state = slot.to_json()
    assert json.dumps(state, sort_keys=True) == json.dumps(to_json({
        "v": state["v"], "partition": None, "detector": slot.detector.state_dict(),
        "recovery": slot.recovery.state_dict()}), sort_keys=True)


def test_non_finite_floats_take_the_wire_spelling():
    slot = _slot([2.0] * 30 + [math.nan, math.inf])
    text = json.dumps(slot.to_json(), allow_nan=False)  # would raise on a bare NaN
    assert '"NaN"' in text or '"Infinity"' in text
