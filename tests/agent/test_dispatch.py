"""Commands applied by the table in agent/dispatch.py: every type routed, arguments and mode moves
checked before anything changes, unknown types rejected, the hold taken over."""

from __future__ import annotations

import dataclasses
import math

import pytest

from cliffguard.agent.command_target import Outcome
from cliffguard.agent.dispatch import ROUTES, apply, dispatch
from cliffguard.agent.modes import ModeMachine
from cliffguard.core.enums import AckStatus, CheckpointKind, CommandType
from cliffguard.core.enums import TrainerMode as M
from cliffguard.core.events import make_command


class RecordingTarget:
    """A CommandTarget that records what it was asked; ``fail`` makes one method raise."""

    def __init__(self, fail: str = "") -> None:
        self.calls: list[tuple] = []
        self.fail = fail

    def _did(self, *call) -> Outcome:
        self.calls.append(call)
        if call[0] == self.fail:
            raise RuntimeError(f"{call[0]} broke")
        return Outcome.applied(call[0])

    def pause(self):
        return self._did("pause")

    def resume(self):
        return self._did("resume")

    def validate(self, cmd_id, batches):
        return self._did("validate", cmd_id, batches)

    def rollback(self, to_step, lr_scale, skip_data):
        return self._did("rollback", to_step, lr_scale, skip_data)

    def set_lr_scale(self, lr_scale):
        return self._did("set_lr_scale", lr_scale)

    def checkpoint_now(self, kind):
        return self._did("checkpoint_now", kind)

    def stop(self, reason):
        return self._did("stop", reason)


def _run(ctype, args=None, mode=M.RUNNING, target=None):
    target = target or RecordingTarget()
    modes = ModeMachine(mode)
    acks: list[tuple] = []
    cmd = make_command(ctype, "r", args or {})
    out = dispatch(cmd, target, modes, lambda c, s, d: acks.append((c.id, s, d)))
    assert acks == [(cmd.id, out.status, out.detail)]  # acked exactly once, with the outcome
    return out, target, modes


def test_every_command_type_has_a_route():
    assert set(ROUTES) == set(CommandType)


@pytest.mark.parametrize(("ctype", "args", "call"), [
    (CommandType.PAUSE, {}, ("pause",)),
    (CommandType.RESUME, {}, ("resume",)),
    (CommandType.VALIDATE, {"batches": 2}, ("validate", "<id>", 2)),
    (CommandType.ROLLBACK, {"to_step": 4, "lr_scale": 0.5, "skip_data": [8, 16]}, ("rollback", 4, 0.5, (8, 16))),
    (CommandType.SET_LR_SCALE, {"lr_scale": 0.25}, ("set_lr_scale", 0.25)),
    (CommandType.CHECKPOINT_NOW, {}, ("checkpoint_now", CheckpointKind.FULL)),
    (CommandType.STOP, {}, ("stop", "stopped by command <id>")),
])
def test_each_type_reaches_its_target_method_with_parsed_arguments(ctype, args, call):
    target = RecordingTarget()
    cmd = make_command(ctype, "r", args)
    out = apply(cmd, target, ModeMachine())
    assert out.status is AckStatus.APPLIED
    assert target.calls == [tuple(str(a).replace("<id>", cmd.id) if isinstance(a, str) else a for a in call)]


@pytest.mark.parametrize(("ctype", "mode", "after"), [
    (CommandType.PAUSE, M.RUNNING, M.PAUSED),
    (CommandType.RESUME, M.PAUSED, M.RUNNING),
    (CommandType.RESUME, M.HELD, M.RUNNING),
    (CommandType.STOP, M.PAUSED, M.STOPPING),
    (CommandType.SET_LR_SCALE, M.RUNNING, M.RUNNING),
    (CommandType.SET_LR_SCALE, M.HELD, M.PAUSED),  # answered while held: the controller took over
    (CommandType.VALIDATE, M.HELD, M.PAUSED),
    (CommandType.ROLLBACK, M.PAUSED, M.RUNNING),
])
def test_mode_after_an_applied_command(ctype, mode, after):
    args = {"lr_scale": 0.5, "to_step": 0} if ctype in (CommandType.ROLLBACK, CommandType.SET_LR_SCALE) else {}
    out, _, modes = _run(ctype, args, mode)
    assert out.status is AckStatus.APPLIED and modes.mode is after


def test_a_failed_rollback_pauses_and_a_failed_checkpoint_keeps_the_mode():
    out, _, modes = _run(CommandType.ROLLBACK, {"to_step": 3, "lr_scale": 0.5}, M.RUNNING, RecordingTarget("rollback"))
    assert (out.status, out.detail, modes.mode) == (AckStatus.FAILED, "rollback broke", M.PAUSED)
    out, _, modes = _run(CommandType.CHECKPOINT_NOW, {}, M.RUNNING, RecordingTarget("checkpoint_now"))
    assert (out.status, modes.mode) == (AckStatus.FAILED, M.RUNNING)


@pytest.mark.parametrize(("ctype", "args", "reason"), [
    (CommandType.ROLLBACK, {"to_step": 3, "lr_scale": 0.0}, "lr_scale"),
    (CommandType.ROLLBACK, {"to_step": 3, "lr_scale": math.inf}, "lr_scale"),
    (CommandType.ROLLBACK, {"to_step": -1, "lr_scale": 0.5}, "to_step"),
    (CommandType.ROLLBACK, {"to_step": 3, "lr_scale": 0.5, "skip_data": [16, 8]}, "skip_data"),
    (CommandType.ROLLBACK, {"to_step": 3, "lr_scale": 0.5, "skip_data": [1, 2, 3]}, "skip_data"),
    (CommandType.SET_LR_SCALE, {"lr_scale": -1.0}, "lr_scale"),
    (CommandType.SET_LR_SCALE, {"lr_scale": math.nan}, "lr_scale"),
    (CommandType.VALIDATE, {"batches": 0}, "batches"),
])
def test_invalid_arguments_are_rejected_before_anything_changes(ctype, args, reason):
    # The wire schema (core/events.py) already refuses wrong types; these pass it but are out of range.
    out, target, modes = _run(ctype, args, M.HELD)
    assert out.status is AckStatus.REJECTED and reason in out.detail
    assert target.calls == [] and modes.mode is M.HELD  # nothing applied, not even the hold taken over


@pytest.mark.parametrize(("ctype", "args"), [
    (CommandType.ROLLBACK, {"to_step": 3, "lr_scale": 0.5}),
    (CommandType.RESUME, {}),
    (CommandType.PAUSE, {}),
    (CommandType.VALIDATE, {}),
])
def test_a_command_whose_move_is_illegal_is_rejected_unapplied(ctype, args):
    out, target, modes = _run(ctype, args, M.STOPPING)
    assert out.status is AckStatus.REJECTED and "not allowed while stopping" in out.detail
    assert target.calls == [] and modes.mode is M.STOPPING


def test_an_unrouted_type_is_rejected_not_applied():
    cmd = make_command(CommandType.PAUSE, "r")
    unknown = dataclasses.replace(cmd, type="reboot")
    target, modes = RecordingTarget(), ModeMachine()
    out = apply(unknown, target, modes)
    assert out.status is AckStatus.REJECTED and "no handler" in out.detail and "reboot" in out.detail
    # A type in the enum that a deployment's table leaves out is rejected the same way.
    partial = {t: r for t, r in ROUTES.items() if t is not CommandType.PAUSE}
    out = apply(cmd, target, modes, partial)
    assert out.status is AckStatus.REJECTED and target.calls == [] and modes.mode is M.RUNNING
