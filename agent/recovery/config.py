"""The recovery kit's settings (``[agent.recovery]``).

The guard's hold timeout and its policy stay the guard's own (``[agent.guard] hold_timeout_s``,
``on_timeout``, agent/guard.py): one place for each setting. This adds the controller-silence
timeout and what the kit keeps for rollbacks and validation in loops that have nothing of their own.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cliffguard.agent.guard import TIMEOUT_POLICIES
from cliffguard.core.declared import bounded, check_declared, one_of
from cliffguard.core.triage import TriageConfig


@dataclass(kw_only=True, slots=True)
class KitConfig:
    ring_size: int = bounded(4, ge=1)
    """In-memory snapshots kept (the newest); the bundled trainer uses ``[checkpoint] memory_ring``."""
    snapshot_every: int = bounded(10, ge=0)
    """Steps between in-memory snapshots (0 = none, and no rollback from memory)."""
    pause_timeout_s: float = bounded(300.0, ge=0)
    """Seconds a controller-initiated wait (paused, or waiting on a verdict after a validation)
    may pass with no command before ``on_pause_timeout`` applies (0 = wait for ever)."""
    on_pause_timeout: str = one_of("resume", TIMEOUT_POLICIES)
    """Policy when the controller fell silent during a pause: resume, stop or rollback."""
    val_every: int = bounded(50, ge=0)
    """Validate every this many steps (0 = only on command): the controller judges a spike's
    validation against the median of these (without one, a validation is abnormal: a rollback).
    What a validation is depends on the loop: its ``validate_fn`` (a Hugging Face run's whole
    ``evaluate()``), else the held-back training batches. The bundled trainer sets it from
    ``[train] val_every``."""
    val_max_share: float = bounded(0.1, ge=0, le=1)
    """The most periodic validation may cost, as a share of the training time between two of them
    (measured at each one, agent/recovery/cadence.py): above it the cadence turns off for the rest
    of the run, with a warning, and validations on command still run (0 = no limit). The cost
    goes into ``run.finished`` (``cliffguard status RUN`` prints it)."""
    val_keep: int = bounded(4, ge=0)
    """Recent training batches kept (on CPU) to validate on when the loop has no validation set."""
    triage: TriageConfig = field(default_factory=TriageConfig)
    """Re-run attribution's thresholds (``[agent.recovery.triage]``, core/triage.py), for a loop that
    gives the kit a ``rerun_fn`` (the bundled trainer does; a ``triage=`` argument to the kit wins)."""
    triage_max_steps: int = bounded(50, ge=0)
    """The most critical steps re-run per process (0 = triage off): past it the guard's decision
    stands, with one warning. Only a step the guard skips or holds is re-run, at most three times
    (the same shards; then rotated or a control batch; a transient's retry), so triage costs at most
    ``3 x triage_max_steps`` steps of compute per process life and nothing on a healthy step."""

    def __post_init__(self) -> None:
        check_declared(self)
