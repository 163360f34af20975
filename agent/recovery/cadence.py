"""When the kit validates on its own, and what its validations cost the run.

A periodic validation (``[agent.recovery] val_every``) is the controller's yardstick: a spike's
validation is judged against the median of recent periodic ones (controller/recovery.py). It
costs the run whatever the loop's validation costs, which the kit cannot know in advance: a
Hugging Face run validates with the Trainer's whole ``evaluate()``. So the kit measures it: the
training time between two boundaries is the loop's own time (the kit's commands, waits, snapshots
and validations excluded), and after each periodic validation its seconds over the training
seconds since the previous one is its *share*. Above ``val_max_share`` the cadence turns off for
the rest of the run, loudly (one warning naming the setting); validations on command still run.
The first periodic validation is the measurement, and it stays the controller's baseline.

``summary()`` is what ``run.finished`` carries as ``validation`` (and ``cliffguard status RUN``
prints): how many validations of each kind, their seconds, the share of training time, and why
the cadence is off when it is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class Tally:
    count: int = 0
    seconds: float = 0.0


@dataclass(slots=True)
class ValidationCadence:
    """See the module docstring. ``every`` = 0: no periodic validation; ``max_share`` = 0: no limit."""

    every: int
    max_share: float
    periodic: Tally = field(default_factory=Tally)
    on_command: Tally = field(default_factory=Tally)
    train_s: float = 0.0
    """The loop's own time so far (between the kit's boundaries)."""
    off: str = ""
    """Why the cadence turned off ("" while on)."""
    _left_at: float | None = None
    _train_at_last: float = 0.0
    _steps_at_last: int = 0

    def enter(self, now: float) -> None:
        """The loop reached a boundary: the time since the kit last left one was training."""
        if self._left_at is not None:
            self.train_s += max(0.0, now - self._left_at)
            self._left_at = None

    def leave(self, now: float) -> None:
        """The kit hands the loop back."""
        self._left_at = now

    def due(self, step: int) -> bool:
        return bool(self.every and step and step % self.every == 0 and not self.off)

    def record(self, seconds: float, *, periodic: bool) -> None:
        tally = self.periodic if periodic else self.on_command
        tally.count += 1
        tally.seconds += seconds

    def over_budget(self, step: int, seconds: float) -> str:
        """After a periodic validation of ``seconds`` at ``step``: why it costs too much ("" if not)."""
        train = self.train_s - self._train_at_last
        steps = step - self._steps_at_last
        self._train_at_last, self._steps_at_last = self.train_s, step
        if not self.max_share or train <= 0:
            return ""
        share = seconds / train
        if share <= self.max_share:
            return ""
        return (
            f"a validation took {seconds:.2f} s, {share:.0%} of the {train:.1f} s the {steps} steps before it "
            f"trained (over [agent.recovery] val_max_share = {self.max_share:g})"
        )

    def turn_off(self, reason: str) -> None:
        self.off = reason

    def summary(self) -> dict[str, Any]:
        spent = self.periodic.seconds + self.on_command.seconds
        return {
            "every": self.every,
            "max_share": self.max_share,
            "periodic": self.periodic.count,
            "periodic_s": round(self.periodic.seconds, 3),
            "on_command": self.on_command.count,
            "on_command_s": round(self.on_command.seconds, 3),
            "train_s": round(self.train_s, 3),
            "share": round(spent / self.train_s, 4) if self.train_s > 0 else 0.0,
            "off": self.off,
        }


def describe(summary: dict[str, Any]) -> str:
    """One line for a person: ``cliffguard status RUN`` and the agent's log at the end."""
    cadence = f"every {summary['every']} steps" if summary.get("every") else "only on command"
    if summary.get("off"):
        cadence = f"turned off: {summary['off']}"
    return (
        f"validation {cadence}; {summary.get('periodic', 0)} periodic ({summary.get('periodic_s', 0.0):.1f} s), "
        f"{summary.get('on_command', 0)} on command ({summary.get('on_command_s', 0.0):.1f} s), "
        f"{summary.get('share', 0.0):.1%} of {summary.get('train_s', 0.0):.0f} s of training"
    )
