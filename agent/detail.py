"""Per-rank detail on demand: a ``detail`` command makes every rank publish its own ``step`` event
(``detail: true``) for the next N steps, beside rank 0's run-level one, e.g. to debug a straggler.

The agent opens the window itself, on every rank at the same step boundary, when
``Agent.poll_commands`` hands out the command (agent/hooks.py); the dispatch table only checks the
arguments and acks it (agent/dispatch.py), so a loop implements nothing for it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cliffguard.core.rank_arrays import MAX_DETAIL_STEPS


def detail_steps(args: Mapping[str, Any]) -> int:
    """A detail command's ``steps``, checked (ValueError = rejected)."""
    steps = args["steps"]
    if not 1 <= steps <= MAX_DETAIL_STEPS:
        raise ValueError(f"steps: must be in [1, {MAX_DETAIL_STEPS}], got {steps}")
    return steps


class DetailWindow:
    """The steps for which this rank publishes per-rank step events: [opened at, until)."""

    def __init__(self) -> None:
        self.until = 0

    def open(self, step: int, steps: int) -> None:
        self.until = max(self.until, step + steps)

    def active(self, step: int) -> bool:
        return step < self.until
