"""A scale change is an alert with its goodput figures, and the loss rules rebaseline across it:
the loss level and noise of the new global batch are not a spike."""

from __future__ import annotations

import random

from cliffguard.controller.detect import RunDetector
from cliffguard.controller.verdict import Action
from cliffguard.core.enums import EventType, Level
from cliffguard.core.events import make_event
from tests.controller.test_detect import RUN, step_event

SCALE = {"from_world": 4, "to_world": 2, "from_global_batch": 16, "global_batch": 8, "grad_accum": 1, "lr": 2e-3,
         "lr_factor": 0.7071, "steps_lost": 3, "seconds_lost": 41.5, "backoff_s": 0.0, "policy": "proportional",
         "lr_rule": "sqrt"}


def _feed(det: RunDetector, steps, level: float, noise: float, rng: random.Random) -> list:
    out = []
    for s in steps:
        out += det.on_event(step_event(s, level * (1 + noise * rng.uniform(-1, 1))))
    return out


def _critical(verdicts) -> list:
    return [v for v in verdicts if v.level is Level.CRITICAL]


def test_the_batch_jump_after_a_scale_change_is_not_a_spike_and_is_one_alert():
    rng = random.Random(3)
    det = RunDetector()
    assert not _critical(_feed(det, range(0, 120), 2.0, 0.01, rng))
    scaled = det.on_event(make_event(EventType.ELASTIC_SCALED_DOWN, RUN, 117, SCALE, rank=0, world=2, ts=1200.0))
    assert [(v.rule, v.level, v.action) for v in scaled] == [("elastic_scale", Level.WARN, Action.ALERT)]
    assert "world 4 -> 2" in scaled[0].message and scaled[0].evidence["seconds_lost"] == 41.5
    assert scaled[0].evidence["total_seconds_lost"] == 41.5 and scaled[0].evidence["changes"] == 1
    # half the batch: a higher, noisier loss from the restored step on (replayed steps included)
    assert not _critical(_feed(det, range(117, 200), 2.3, 0.05, rng))


def test_without_the_scale_event_the_same_jump_is_a_spike():
    rng = random.Random(3)
    det = RunDetector()
    _feed(det, range(0, 120), 2.0, 0.01, rng)
    assert _critical(_feed(det, range(120, 200), 2.3, 0.05, rng))
