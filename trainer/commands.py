"""The bundled trainer's side of the command protocol: its ``CommandTarget`` and the boundary wait.

``handle_boundary`` runs after every step: it takes the commands the agent delivered at this
boundary (the same list on every rank, see agent/hooks.py) and dispatches each in order through
the table in agent/dispatch.py, which checks the arguments and the mode move, calls
``TrainerCommands`` and acks (rank 0 speaks). Then, while the run is ``paused`` or ``held``
(agent/modes.py), it waits, polling for commands every ``command_tick_s`` with heartbeats going
on, until a command (or the guard's timeout policy) lets it continue or stop.

What each command does (the protocol agreed with the controller):

- ``pause``: hold at this boundary (heartbeats say ``paused``); keep polling.
- ``resume``: train on (also clears a guard hold).
- ``validate {batches?}``: forward-only on the fixed validation set with the current, frozen
  weights -> a ``validation`` event with ``cmd`` = the command id; the run stays in its mode.
- ``rollback {to_step, lr_scale, skip_data?}``: restore the checkpoint labelled ``to_step`` (the
  state before that step ran) from the memory ring when it is there, else from disk; then set
  ``lr_scale`` (absolute, cumulative — applied after the restored state, never overwritten by it),
  skip the ``[first, stop)`` sample window if given, and CONTINUE training (no separate resume).
  Ack ``applied`` with the source, or ``failed`` when the step is not available (the run is
  ``paused``, so the controller can pick an older step).
- ``set_lr_scale {lr_scale}``: from the next step on.
- ``checkpoint_now {kind?}``: a checkpoint of the current state (default ``full``); the
  ``checkpoint`` event with ``verified`` follows when the background writer has checked it.
- ``stop``: end the run cleanly after this boundary (``run.finished``).

A command answered while the guard holds means the controller has taken over: the hold's
timeout no longer applies and the run is ``paused`` until a resume/rollback/stop. Held past
``hold_timeout_s`` with no command, rank 0 decides the guard's ``on_timeout`` policy and every
rank applies it at the same tick; its local rollback takes the target step and the LR cut from
core/policy.py, the controller's own rollback policy.
"""

from __future__ import annotations

import logging
import time
from typing import Protocol

from agent.command_target import CommandTarget, Outcome
from agent.dispatch import dispatch
from agent.hooks import Agent
from agent.modes import HELD, RUNNING, STOPPING, WAITING
from core.enums import CheckpointKind
from core.policy import rollback_step, rolled_back_lr_scale
from trainer.config import TrainConfig

log = logging.getLogger(__name__)


class TrainerParts(Protocol):
    """What the commands need from the bundled trainer (trainer/loop.py's ``Trainer``)."""

    agent: Agent
    cfg: TrainConfig
    rank: int
    step: int
    stop_reason: str

    def validate(self, cmd_id: str | None = None, batches: int | None = None) -> float: ...

    def rollback(self, to_step: int, lr_scale: float, skip_data: tuple[int, int] | None = None) -> str: ...

    def checkpoint(self, kind: CheckpointKind) -> None: ...

    def available_steps(self) -> list[int]: ...

    def param_digest(self) -> str: ...


class TrainerCommands:
    """The bundled trainer's ``CommandTarget`` (agent/command_target.py)."""

    def __init__(self, tr: TrainerParts) -> None:
        self.tr = tr

    def pause(self) -> Outcome:
        return Outcome.applied(f"paused at step {self.tr.step}")

    def resume(self) -> Outcome:
        self.tr.agent.guard.clear_hold()
        return Outcome.applied(f"resumed at step {self.tr.step}")

    def validate(self, cmd_id: str, batches: int | None) -> Outcome:
        val = self.tr.validate(cmd_id, batches)
        return Outcome.applied(f"val_loss={val:.6g} at step {self.tr.step}")

    def rollback(self, to_step: int, lr_scale: float, skip_data: tuple[int, int] | None) -> Outcome:
        source = self.tr.rollback(to_step, lr_scale, skip_data)
        detail = f"restored step {to_step} from {source}; lr_scale={self.tr.agent.lr_scale.value:g}"
        if skip_data:
            detail += f"; skipping samples [{skip_data[0]}, {skip_data[1]})"
        if self.tr.cfg.debug_digests:
            detail += f"; param_digest={self.tr.param_digest()}"
        return Outcome.applied(detail)

    def set_lr_scale(self, lr_scale: float) -> Outcome:
        self.tr.agent.lr_scale.set(lr_scale)
        return Outcome.applied(f"lr_scale={self.tr.agent.lr_scale.value:g} from step {self.tr.step}")

    def checkpoint_now(self, kind: CheckpointKind) -> Outcome:
        self.tr.checkpoint(kind)
        return Outcome.applied(f"{kind} checkpoint of step {self.tr.step} queued")

    def stop(self, reason: str) -> Outcome:
        self.tr.stop_reason = reason
        return Outcome.applied(f"stopping at step {self.tr.step}")


def _timeout_action(tr: TrainerParts, held_since: float) -> str | None:
    """Rank 0's decision, broadcast by ``exchange``: has the guard's hold timed out?"""
    if tr.rank != 0 or tr.agent.modes.mode is not HELD:
        return None
    if time.monotonic() - held_since < tr.agent.guard.config.hold_timeout_s:
        return None
    return tr.agent.guard.config.on_timeout


def _fail(tr: TrainerParts, reason: str) -> None:
    tr.stop_reason = f"failed: {reason}"
    tr.agent.modes.move(STOPPING)


def apply_timeout_policy(tr: TrainerParts, target: CommandTarget, policy: str) -> None:
    guard, modes = tr.agent.guard, tr.agent.modes
    log.warning("held %.0fs without a controller command; applying policy %r", guard.config.hold_timeout_s, policy)
    if policy == "resume":
        target.resume()
        modes.move(RUNNING)
        return
    if policy == "stop":
        _fail(tr, "guard held past hold_timeout_s with no controller")
        return
    first = guard.first_skip_step if guard.first_skip_step is not None else tr.step
    to_step = rollback_step(tr.available_steps(), first)
    if to_step is None:
        _fail(tr, "guard hold timed out and no checkpoint to roll back to")
        return
    scale = rolled_back_lr_scale(tr.agent.lr_scale.value, guard.config.policy.lr_factor)
    try:
        outcome = target.rollback(to_step, scale, None)
    except Exception as exc:  # noqa: BLE001 - no controller to tell: end the run as failed
        _fail(tr, f"local rollback to {to_step} failed: {exc}")
        return
    log.warning("local rollback: %s", outcome.detail)
    modes.move(RUNNING)


def handle_boundary(tr: TrainerParts, target: CommandTarget) -> None:
    agent = tr.agent
    for cmd in agent.poll_commands():
        dispatch(cmd, target, agent.modes, agent.ack)
    if agent.modes.mode not in WAITING:
        return
    held_since = time.monotonic()
    while agent.modes.mode in WAITING:
        time.sleep(agent.config.command_tick_s)
        # Rank 0 decides the timeout (clocks differ between ranks) and broadcasts it with the commands.
        cmds, policy = agent.exchange(_timeout_action(tr, held_since))
        for cmd in cmds:
            dispatch(cmd, target, agent.modes, agent.ack)
        if policy is not None and agent.modes.mode is HELD:
            apply_timeout_policy(tr, target, policy)
    agent.set_step(tr.step)  # the wait is not part of the next step's time
