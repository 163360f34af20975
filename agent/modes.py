"""The trainer's mode as a declared table, like the controller's phases (controller/recovery.py).

``MOVES`` lists every legal move; ``ModeMachine.move`` raises ``ModeNotAllowed`` for any other,
so a bug cannot walk a trainer somewhere undeclared (a rollback after a stop, say). The machine
is the one holder of the mode: the loop moves it, and the heartbeat thread reports it as the
``state`` of each heartbeat.

- ``running``: training; a guard hold, a pause, a validation or a stop leaves it.
- ``paused``: waiting at a step boundary for commands (after ``pause``, a failed rollback, or a
  command that arrived while ``held``: the controller has taken over).
- ``held``: the guard skipped several steps in a row; waiting for the controller, with a local
  timeout policy (agent/guard.py).
- ``validating``: a forward-only pass on frozen weights; it returns to the mode it came from.
- ``stopping``: leaving the loop; terminal. Every mode may end here, because a failure can end
  the run from anywhere.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

from cliffguard.core.enums import TrainerMode

RUNNING, PAUSED, HELD = TrainerMode.RUNNING, TrainerMode.PAUSED, TrainerMode.HELD
VALIDATING, STOPPING = TrainerMode.VALIDATING, TrainerMode.STOPPING

# from mode -> the modes it may move to. The complete list of legal moves (a self-move is only
# legal where listed: resuming a running trainer or pausing a paused one is harmless).
MOVES: dict[TrainerMode, frozenset[TrainerMode]] = {
    RUNNING: frozenset({RUNNING, PAUSED, HELD, VALIDATING, STOPPING}),
    PAUSED: frozenset({PAUSED, RUNNING, VALIDATING, STOPPING}),
    HELD: frozenset({RUNNING, PAUSED, VALIDATING, STOPPING}),
    VALIDATING: frozenset({RUNNING, PAUSED, HELD, STOPPING}),
    STOPPING: frozenset({STOPPING}),
}

WAITING = frozenset({PAUSED, HELD})
"""Modes in which the loop waits at the boundary, polling for commands."""


class ModeNotAllowed(RuntimeError):
    def __init__(self, current: TrainerMode, to: TrainerMode) -> None:
        super().__init__(f"no move from {current} to {to}")
        self.current = current
        self.to = to


def allowed(current: TrainerMode, to: TrainerMode) -> bool:
    return to in MOVES[current]


class ModeMachine:
    """Holds the current mode; every change goes through ``move`` (checked against ``MOVES``)."""

    def __init__(self, mode: TrainerMode = RUNNING) -> None:
        self._mode = TrainerMode(mode)
        self.changed_at = time.monotonic()
        """When the mode last changed (the hang watchdog's mark: a pause is not a stall)."""

    @property
    def mode(self) -> TrainerMode:
        return self._mode

    def allows(self, to: TrainerMode) -> bool:
        return allowed(self._mode, to)

    def move(self, to: TrainerMode) -> TrainerMode:
        """Move to ``to``; raises ModeNotAllowed if ``MOVES`` does not declare it."""
        if not allowed(self._mode, to):
            raise ModeNotAllowed(self._mode, to)
        self._mode = to
        self.changed_at = time.monotonic()
        return to

    @contextlib.contextmanager
    def validating(self) -> Iterator[None]:
        """``validating`` for the duration of the block, then back to the mode it came from."""
        before = self._mode
        self.move(VALIDATING)
        try:
            yield
        finally:
            self.move(before)
