"""What ``RecoveryKit.at_boundary()`` tells the loop: go on or stop, and the step to run next.

The kit's counter is the run's one step counter: a rollback moves it back, a resume leaves it.
A loop with a counter of its own (nanoGPT's ``iter_num`` drives its LR schedule, its evals and
its end) must take the step from the boundary, or a rollback leaves it on the old step while
the weights, the optimizer and the scheduler are back at the restored one::

    while True:
        boundary = kit.at_boundary()
        if not boundary:                 # a stop command (or a timeout policy that failed the run)
            break
        iter_num = boundary.step         # the step this iteration runs (moved back after a rollback)
        ...

A ``Boundary`` is truthy when the loop goes on, so ``while kit.at_boundary():`` reads as before.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Boundary:
    go_on: bool
    """False: the run must stop (a stop command, or a timeout policy that failed the run)."""
    step: int
    """The step the loop runs next (the kit's counter: after a rollback, the restored step)."""
    moved_from: int | None = None
    """The step the loop was at before this boundary when a rollback moved it (None: it did not move)."""

    def __bool__(self) -> bool:
        return self.go_on

    @property
    def rolled_back(self) -> bool:
        """Whether a rollback at this boundary moved the step."""
        return self.moved_from is not None
