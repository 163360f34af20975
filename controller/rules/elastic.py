"""Elastic scale changes: an alert for each, with its goodput figures.

An ``elastic.scaled_down`` / ``elastic.scaled_up`` event (trainer/elastic.py) says the run
resumed at another world size with another global batch and LR. People are told (a ``warn``
alert carrying the worlds, batches, LR, steps redone and seconds lost in rendezvous and reload);
the loss rules are rebaselined by the detector (controller/detect.py), because a new batch
changes the loss's noise and a batch-size jump is not a spike.
"""

from __future__ import annotations

from typing import Any

from cliffguard.controller.rules.base import RankScope
from cliffguard.controller.verdict import Action, Verdict
from cliffguard.core.enums import EventType, Level
from cliffguard.core.events import Event

SCALE_EVENTS: frozenset[EventType] = frozenset({EventType.ELASTIC_SCALED_DOWN, EventType.ELASTIC_SCALED_UP})
VERDICT = "elastic_scale"


class ElasticScaleRule:
    name = "elastic"
    consumes = SCALE_EVENTS
    scope = RankScope.EVERY_RANK

    def __init__(self) -> None:
        self.changes = 0
        self.seconds_lost = 0.0
        self.steps_lost = 0

    def on_event(self, event: Event) -> list[Verdict]:
        d = event.data
        self.changes += 1
        self.seconds_lost += float(d["seconds_lost"])
        self.steps_lost += int(d["steps_lost"])
        way = "up" if event.type is EventType.ELASTIC_SCALED_UP else "down"
        message = (f"scaled {way}: world {d['from_world']} -> {d['to_world']}, global batch "
                   f"{d['from_global_batch']} -> {d['global_batch']}, lr {d['lr']:.3g} (x{d['lr_factor']:.3f}, "
                   f"{d['lr_rule']}); {d['steps_lost']} steps redone, {d['seconds_lost']:.1f} s lost"
                   + (f"; flapping: {d['backoff_s']:.0f} s back-off" if d["backoff_s"] else ""))
        evidence = {**d, "changes": self.changes, "total_seconds_lost": round(self.seconds_lost, 3),
                    "total_steps_lost": self.steps_lost}
        return [Verdict(rule=VERDICT, level=Level.WARN, step=event.step, message=message, action=Action.ALERT,
                        evidence=evidence)]

    def state_dict(self) -> dict[str, Any]:
        return {"changes": self.changes, "seconds_lost": self.seconds_lost, "steps_lost": self.steps_lost}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.changes = int(state.get("changes", 0))
        self.seconds_lost = float(state.get("seconds_lost", 0.0))
        self.steps_lost = int(state.get("steps_lost", 0))
