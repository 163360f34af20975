"""Applying controller commands at step boundaries, identically on every rank.

``handle_boundary(trainer)`` runs after every step: it takes the commands the agent delivered at
this boundary (the same list on every rank, see agent/hooks.py), applies each in order, and then,
if the run is paused or held by the guard, waits — polling for commands every
``command_tick_s`` with heartbeats going on — until a command (or the guard's timeout policy)
lets it continue or stop. Rank 0 acks each command after applying it.

What each command does (the protocol agreed with the controller, INTERFACES.md under D):

- ``pause``: hold at this boundary (heartbeats say ``paused``); keep polling.
- ``resume``: train on (also clears a guard hold).
- ``validate``: forward-only on the fixed validation set with the current, frozen weights →
  a ``validation`` event with ``cmd`` = the command id; the run stays in the state it was in.
- ``rollback {to_step, lr_scale, skip_data?}``: restore the checkpoint labelled ``to_step`` (the
  state before that step ran) from the memory ring when it is there, else from disk; then set
  ``lr_scale`` (absolute, cumulative — applied after the restored state, never overwritten by it),
  skip the ``[first, stop)`` sample window if given, and CONTINUE training (no separate resume).
  Ack ``applied`` with the source, or ``failed`` when the step is not available (the run stays
  paused, so the controller can pick an older step).
- ``set_lr_scale {lr_scale}``: from the next step on.
- ``checkpoint_now {kind?}``: a disk checkpoint of the current state (default ``full``); the
  ``checkpoint`` event with ``verified`` follows when the background writer has checked it.
- ``stop``: end the run cleanly after this boundary (``run.finished``).

A command that arrives while the guard holds means the controller has taken over: the hold's
timeout is cancelled and the run is ``paused`` until a resume/rollback/stop.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from core.enums import AckStatus, CommandType
from core.events import Command
from core.policy import rollback_step, rolled_back_lr_scale

if TYPE_CHECKING:
    from trainer.loop import Trainer

log = logging.getLogger(__name__)


def apply_command(tr: Trainer, cmd: Command) -> None:
    """Apply one command on this rank (all ranks call this with the same command) and ack it."""
    args = cmd.args
    status, detail = AckStatus.APPLIED, ""
    was_held = tr.mode == "held"
    try:
        if cmd.type is CommandType.PAUSE:
            tr.mode = "paused"
            detail = f"paused at step {tr.step}"
        elif cmd.type is CommandType.RESUME:
            tr.mode = "running"
            tr.agent.guard.clear_hold()
            detail = f"resumed at step {tr.step}"
        elif cmd.type is CommandType.VALIDATE:
            val = tr.validate(cmd.id, args.get("batches"))
            detail = f"val_loss={val:.6g} at step {tr.step}"
        elif cmd.type is CommandType.ROLLBACK:
            to_step = int(args["to_step"])
            source = tr.rollback(to_step, float(args["lr_scale"]), args.get("skip_data"))
            detail = f"restored step {to_step} from {source}; lr_scale={tr.lr_scale.value:g}"
            if args.get("skip_data"):
                detail += f"; skipping samples [{args['skip_data'][0]}, {args['skip_data'][1]})"
            if tr.cfg.debug_digests:
                detail += f"; param_digest={tr.param_digest()}"
        elif cmd.type is CommandType.SET_LR_SCALE:
            tr.lr_scale.set(float(args["lr_scale"]))
            tr.agent.lr_scale = tr.lr_scale.value
            detail = f"lr_scale={tr.lr_scale.value:g} from step {tr.step}"
        elif cmd.type is CommandType.CHECKPOINT_NOW:
            kind = str(args.get("kind") or "full")
            tr.checkpoint(kind)
            detail = f"{kind} checkpoint of step {tr.step} queued"
        elif cmd.type is CommandType.STOP:
            tr.mode = "stopping"
            tr.stop_reason = f"stopped by command {cmd.id}"
            detail = f"stopping at step {tr.step}"
    except Exception as exc:  # noqa: BLE001 - a failed command is acked failed; training goes on
        log.warning("command %s (%s) failed: %s", cmd.id, cmd.type, exc)
        status, detail = AckStatus.FAILED, str(exc) or type(exc).__name__
        if cmd.type is CommandType.ROLLBACK and tr.mode != "stopping":
            tr.mode = "paused"  # let the controller pick another step
    if was_held and tr.mode == "held":
        tr.mode = "paused"  # the controller has taken over; no local timeout any more
    tr.agent.ack(cmd, status, detail)


def _timeout_action(tr: Trainer, held_since: float) -> str | None:
    """Rank 0's decision, broadcast by ``exchange``: has the guard's hold timed out?"""
    if tr.rank != 0 or tr.mode != "held":
        return None
    if time.monotonic() - held_since < tr.agent.guard.config.hold_timeout_s:
        return None
    return tr.agent.guard.config.on_timeout


def apply_timeout_policy(tr: Trainer, policy: str) -> None:
    guard = tr.agent.guard
    log.warning("held %.0fs without a controller command; applying policy %r", guard.config.hold_timeout_s, policy)
    if policy == "resume":
        guard.clear_hold()
        tr.mode = "running"
    elif policy == "stop":
        tr.mode = "stopping"
        tr.stop_reason = "failed: guard held past hold_timeout_s with no controller"
    else:  # rollback
        first = guard.first_skip_step if guard.first_skip_step is not None else tr.step
        target = rollback_step(tr.available_steps(), first)
        if target is None:
            tr.mode = "stopping"
            tr.stop_reason = "failed: guard hold timed out and no checkpoint to roll back to"
            return
        scale = rolled_back_lr_scale(tr.lr_scale.value, guard.config.policy.lr_factor)
        try:
            source = tr.rollback(target, scale)
            log.warning("local rollback to step %d from %s, lr_scale=%g", target, source, scale)
        except Exception as exc:  # noqa: BLE001
            tr.mode = "stopping"
            tr.stop_reason = f"failed: local rollback to {target} failed: {exc}"


def handle_boundary(tr: Trainer) -> None:
    for cmd in tr.agent.poll_commands():
        apply_command(tr, cmd)
    if tr.mode not in ("paused", "held"):
        tr.agent.state = "running" if tr.mode == "running" else "stopping"
        return
    held_since = time.monotonic()
    tick = tr.agent.config.command_tick_s
    while tr.mode in ("paused", "held"):
        tr.agent.state = tr.mode
        time.sleep(tick)
        # Rank 0 decides the timeout (clocks differ between ranks) and broadcasts it with the commands.
        cmds, policy = tr.agent.exchange(_timeout_action(tr, held_since))
        for cmd in cmds:
            apply_command(tr, cmd)
        if policy is not None and tr.mode == "held":
            apply_timeout_policy(tr, policy)
    tr.agent.state = "running" if tr.mode == "running" else "stopping"
    tr.agent.set_step(tr.step)  # the wait is not part of the next step's time
