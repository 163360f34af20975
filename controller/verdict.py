"""What a rule concludes about one run: the currency between detectors and the state machine."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from cliffguard.core.enums import Level


class Action(StrEnum):
    RECOVER = "recover"  # start the pause -> validate -> (rollback | resume) pipeline
    ALERT = "alert"  # tell people; training goes on
    RESTART = "restart"  # a hung worker group: the recovery table picks the remedy (controller/recovery_hang.py)
    ROLLBACK = "rollback"  # the weights are known bad (a replica diverged): roll back, no validation (recovery_sdc.py)


@dataclass(frozen=True, slots=True)
class Verdict:
    rule: str
    """Rule name: loss_spike, divergence, nonfinite, grad_norm, layer_grad_norm, loss_scale,
    mfu_low, straggler, heartbeat, memory_growth."""
    level: Level
    step: int
    """The step at which the rule fired."""
    message: str
    action: Action = Action.ALERT
    onset_step: int | None = None
    """First step of the excursion (the rollback target must be at or before it)."""
    rank: int | None = None
    evidence: dict[str, Any] = field(default_factory=dict)
    """Window stats and whatever else justified the verdict; persisted with the incident."""
