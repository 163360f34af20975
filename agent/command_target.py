"""What a training loop must offer for controller commands to be applied to it.

The bundled trainer implements ``CommandTarget`` (trainer/commands.py); the framework
integrations implement it too. ``agent/dispatch.py`` validates each command's arguments, checks
the mode move against agent/modes.py, calls one of these methods and acks with its ``Outcome``.
A method applies its command and says how it went; it never moves the mode (the dispatcher
does, so every target follows the same table). Raising is a ``failed`` ack with the message.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from cliffguard.core.enums import AckStatus, CheckpointKind
from cliffguard.core.events import Command


@dataclass(frozen=True, slots=True)
class Outcome:
    """What the ack needs: a status and a human-readable detail."""

    status: AckStatus
    detail: str = ""
    available: tuple[int, ...] | None = None
    """A failed rollback's: the steps every rank can restore (the controller forgets the others)."""

    @classmethod
    def applied(cls, detail: str = "") -> Outcome:
        return cls(AckStatus.APPLIED, detail)

    @classmethod
    def failed(cls, detail: str, available: tuple[int, ...] | None = None) -> Outcome:
        return cls(AckStatus.FAILED, detail, available)

    @classmethod
    def rejected(cls, detail: str) -> Outcome:
        return cls(AckStatus.REJECTED, detail)


class CommandTarget(Protocol):
    """One method per command type. Arguments arrive validated (see agent/dispatch.py)."""

    def pause(self) -> Outcome:
        """Hold at this step boundary (the dispatcher moves the mode to ``paused``)."""
        ...

    def resume(self) -> Outcome:
        """Train on; also clears a guard hold."""
        ...

    def validate(self, cmd_id: str, batches: int | None) -> Outcome:
        """Forward-only validation on frozen weights; a ``validation`` event carries ``cmd_id``."""
        ...

    def rollback(self, to_step: int, lr_scale: float, skip_data: tuple[int, int] | None) -> Outcome:
        """Restore the state before ``to_step``, then set ``lr_scale``, then skip ``[first, stop)``."""
        ...

    def set_lr_scale(self, lr_scale: float) -> Outcome:
        """The absolute LR scale from the next step on."""
        ...

    def checkpoint_now(self, kind: CheckpointKind) -> Outcome:
        """A checkpoint of the current state."""
        ...

    def stop(self, reason: str) -> Outcome:
        """End the run cleanly after this boundary."""
        ...

    def restart(self, cmd: Command) -> Outcome:
        """Leave this worker group for torchrun to start again (core/restart_plan.py); applied at
        the boundary on every rank, after which the loop leaves (agent/hang/part.py)."""
        ...
