"""The recovery kit's settings (``[agent.recovery]``).

The guard's hold timeout and its policy stay the guard's own (``[agent.guard] hold_timeout_s``,
``on_timeout``, agent/guard.py): one place for each setting. This adds the controller-silence
timeout and what the kit keeps for rollbacks and validation in loops that have nothing of their own.
"""

from __future__ import annotations

from dataclasses import dataclass

from cliffguard.agent.guard import TIMEOUT_POLICIES


@dataclass(kw_only=True, slots=True)
class KitConfig:
    ring_size: int = 4
    """In-memory snapshots kept (the newest); the bundled trainer uses ``[checkpoint] memory_ring``."""
    snapshot_every: int = 10
    """Steps between in-memory snapshots (0 = none, and no rollback from memory)."""
    pause_timeout_s: float = 300.0
    """Seconds a controller-initiated wait (paused, or waiting on a verdict after a validation)
    may pass with no command before ``on_pause_timeout`` applies (0 = wait for ever)."""
    on_pause_timeout: str = "resume"
    """Policy when the controller fell silent during a pause: resume, stop or rollback."""
    val_every: int = 50
    """Validate every this many steps (0 = only on command): the controller judges a validation
    against a baseline of these. The bundled trainer has its own ``[train] val_every``."""
    val_keep: int = 4
    """Recent training batches kept (on CPU) to validate on when the loop has no validation set."""

    def __post_init__(self) -> None:
        if self.ring_size < 1:
            raise ValueError("ring_size: must be >= 1")
        if self.snapshot_every < 0:
            raise ValueError("snapshot_every: must be >= 0")
        if self.pause_timeout_s < 0:
            raise ValueError("pause_timeout_s: must be >= 0")
        if self.on_pause_timeout not in TIMEOUT_POLICIES:
            raise ValueError(f"on_pause_timeout: must be one of {', '.join(TIMEOUT_POLICIES)}")
        if self.val_every < 0:
            raise ValueError("val_every: must be >= 0")
        if self.val_keep < 0:
            raise ValueError("val_keep: must be >= 0")
