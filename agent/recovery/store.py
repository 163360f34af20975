"""Where rollback targets come from: the ``StateStore`` protocol and the kit's memory-only store.

The bundled trainer's ``CheckpointManager`` (trainer/checkpoint.py: memory ring + verified disk
checkpoints) is a ``StateStore``; loops without one get ``RingStore``, the memory ring alone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from cliffguard.agent.recovery.ring import MemoryRing
from cliffguard.core.enums import CheckpointKind


class StateStore(Protocol):
    def available_steps(self) -> list[int]:
        """Steps a rollback can reach, ascending."""
        ...

    def restore(self, step: int, discard_newer: bool = True) -> tuple[dict[str, Any], str]:
        """(an independent copy of the state labelled ``step``, its source); KeyError if absent."""
        ...

    def discard_after(self, step: int) -> None:
        """Forget states newer than ``step`` (the abandoned timeline)."""
        ...

    def on_step(self, step: int, state_fn: Callable[[], dict[str, Any]]) -> list[CheckpointKind]:
        """Take whatever is due before step ``step``; ``state_fn`` is called at most once."""
        ...

    def save(self, step: int, state: dict[str, Any], kind: CheckpointKind | str = CheckpointKind.FULL) -> None:
        """A checkpoint now (``checkpoint_now``)."""
        ...


class RingStore:
    """A ``StateStore`` holding only a ``MemoryRing``, snapshotting every ``every`` steps (step 0 too).

    Disk kinds are asked of ``disk`` when given (e.g. a Trainer's own save); without it a
    ``checkpoint_now`` of any kind takes a memory snapshot, and says so."""

    def __init__(self, ring: MemoryRing, every: int, on_snapshot: Callable[[int, list[int]], None] | None = None) -> None:
        self.ring = ring
        self.every = every
        self.on_snapshot = on_snapshot or (lambda step, steps: None)

    def available_steps(self) -> list[int]:
        return self.ring.steps()

    def restore(self, step: int, discard_newer: bool = True) -> tuple[dict[str, Any], str]:
        state = self.ring.restore(step) if discard_newer else self.ring.get(step)
        if state is None:
            raise KeyError(f"step {step}: not in the memory ring (have {self.ring.steps()})")
        return state, "memory"

    def discard_after(self, step: int) -> None:
        self.ring.discard_after(step)

    def on_step(self, step: int, state_fn: Callable[[], dict[str, Any]]) -> list[CheckpointKind]:
        if not self.every or step % self.every:
            return []
        self.save(step, state_fn(), CheckpointKind.MEMORY)
        return [CheckpointKind.MEMORY]

    def save(self, step: int, state: dict[str, Any], kind: CheckpointKind | str = CheckpointKind.MEMORY) -> None:
        self.ring.snapshot(step, state)
        self.on_snapshot(step, self.ring.steps())
