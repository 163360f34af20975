"""What the trainer's answers and the clock do to a run's recovery: acks of the command the machine
waits on (or an operator's), and timeouts that resend it or give up."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, assert_never

from cliffguard.controller.recovery_state import Pending
from cliffguard.controller.recovery_step import Step, rolled_back, start_rollback
from cliffguard.controller.recovery_table import WAITING, rollback_target
from cliffguard.controller.recovery_types import AckIn, MarkCommand, Phase, TickIn, Trigger
from cliffguard.core.enums import (
    AckStatus,
    AlertAction,
    AlertLevel,
    CheckpointKind,
    CommandType,
    IncidentOutcome,
)


def on_ack(st: Step, inp: AckIn) -> None:
    s = st.s
    if st.holds("not is_ours", inp.cmd_id):
        if inp.status is AckStatus.APPLIED and inp.cmd_id not in s.issued:
            _operator_applied(st, inp)
        return
    pend = s.pending
    assert pend is not None
    ev = {"cmd": pend.id, "cmd_type": str(pend.type), "status": str(inp.status), "detail": inp.detail,
          "attempt": pend.attempt}
    match inp.status:
        case AckStatus.APPLIED:
            _on_applied(st, pend, ev, inp.now)
        case AckStatus.DUPLICATE:
            return  # the trainer saw this id before; the first delivery's ack decides
        case AckStatus.EXPIRED:
            _retry_or_give_up(st, f"{pend.type} expired before the trainer applied it", ev, inp.now)
        case AckStatus.FAILED if pend.type is CommandType.ROLLBACK:
            _on_rollback_failed(st, pend, inp, ev)
        case AckStatus.REJECTED | AckStatus.FAILED:  # resending the same thing cannot help
            st.halt(Trigger.COMMAND_REFUSED, f"{pend.type} was {inp.status} by the trainer: {inp.detail}", ev, inp.now)
        case _:
            assert_never(inp.status)


def _operator_applied(st: Step, inp: AckIn) -> None:
    """A command no machine sent was applied: an operator's. A resume or rollback ends a halt; an
    LR scale it set becomes the machine's (the next rollback cuts from it), recorded with who set it."""
    s = st.s
    ev = {"cmd": inp.cmd_id, "cmd_type": inp.cmd_type, "detail": inp.detail, "decided_by": "operator"}
    scale = inp.args.get("lr_scale")
    changed = isinstance(scale, (int, float)) and scale != s.lr_scale
    if changed:
        ev["lr_scale_before"], ev["lr_scale"] = s.lr_scale, float(scale)
        s.lr_scale = float(scale)
        inc = s.incident
        if inc is not None:
            s.incident = replace(inc, lr_scales=(*inc.lr_scales, float(scale)))
    if s.phase is Phase.HALTED and inp.cmd_type in (CommandType.RESUME, CommandType.ROLLBACK):
        st.move(Trigger.OPERATOR_RESUMED, f"an operator {inp.cmd_type} was applied: {inp.detail}", ev, inp.now)
        inc = s.incident
        assert inc is not None  # halted always holds the incident that halted it
        st.close(IncidentOutcome.HALTED, inp.now)
        st.alert(AlertLevel.INFO, inc.rule, f"run {s.run} resumed by an operator", inp.detail, {},
                 action=AlertAction.RESOLVE)
        s.incident = None
    elif changed:
        st.move(Trigger.OPERATOR_LR_SCALE, f"an operator {inp.cmd_type} set lr_scale {ev['lr_scale_before']:g} -> "
                f"{s.lr_scale:g}: {inp.detail}", ev, inp.now)


def _on_rollback_failed(st: Step, pend: Pending, inp: AckIn, ev: dict[str, Any]) -> None:
    """The trainer could not restore the target: forget it and roll back to an older one, if any."""
    cfg, s = st.cfg, st.s
    failed_step = int(pend.args["to_step"])
    failed_kind = next((c.kind for c in s.checkpoints if c.step == failed_step), None)
    # a memory ring forgets its oldest first: when one memory snapshot is gone, every older one is too
    memory = CheckpointKind.MEMORY
    s.checkpoints = tuple(c for c in s.checkpoints if c.step != failed_step
                          and not (failed_kind == memory and c.kind == memory and c.step < failed_step)
                          # the trainer said what it holds (its retention pruned the rest): no blind retries
                          and (inp.available is None or c.step in inp.available))
    if st.holds("not rollback_target", failed_step - 1):
        st.halt(Trigger.NO_TARGET, f"rollback to {failed_step} failed ({inp.detail}) and no older stable checkpoint",
                ev, inp.now)
        return
    target = rollback_target(cfg, s, failed_step - 1)
    assert target is not None
    start_rollback(st, Trigger.ROLLBACK_FAILED, target, f"rollback to {failed_step} failed ({inp.detail})", ev, inp.now)


def _on_applied(st: Step, pend: Pending, ev: dict[str, Any], now: float) -> None:
    s = st.s
    match pend.type:
        case CommandType.PAUSE:
            if st.holds("escalation_spent"):
                inc = s.incident
                assert inc is not None
                st.halt(Trigger.ESCALATION_SPENT, f"the trainer paused; rung {inc.rung} of the escalation ladder: "
                        "the run went off again too soon after each recovery, a human decides",
                        {**ev, "escalation": inc.rung, "follows": inc.follows, "lr_scales": list(inc.lr_scales)}, now)
                return
            st.move(Trigger.PAUSE_APPLIED, "the trainer paused; validating the frozen weights", ev, now)
            st.send(CommandType.VALIDATE, {}, now, "validate the frozen weights")
        case CommandType.VALIDATE:
            s.pending = replace(pend, acked=True)  # the validation event itself decides
        case CommandType.ROLLBACK:
            inc = s.incident
            assert inc is not None
            st.move(Trigger.ROLLBACK_APPLIED,
                    f"rolled back to step {inc.rollback_to} ({ev['detail']}); training continues", ev, now)
            s.pending = None
            rolled_back(st, int(pend.args["to_step"]), now)
        case CommandType.RESUME:
            inc = s.incident
            assert inc is not None
            st.move(Trigger.RESUME_APPLIED, "resumed: the spike was transient", ev, now)
            s.pending = None
            st.close(IncidentOutcome.RESUMED, now)
            st.alert(AlertLevel.INFO, inc.rule, f"run {s.run} resumed", "validation was normal; the spike was transient",
                     ev, action=AlertAction.RESOLVE)
            s.incident = None
        case _:  # only the pause cycle and rollbacks are ever pending (_Step.send)
            raise AssertionError(f"a {pend.type} command was pending")


def on_tick(st: Step, inp: TickIn) -> None:
    s = st.s
    if s.phase not in WAITING or not st.holds("timed_out", inp.now):
        return
    pend = s.pending
    assert pend is not None
    ev = {"cmd": pend.id, "cmd_type": str(pend.type), "attempt": pend.attempt, "waited_s": inp.now - pend.sent_at}
    _retry_or_give_up(st, f"no answer to {pend.type} after {inp.now - pend.sent_at:.0f}s", ev, inp.now)


def _retry_or_give_up(st: Step, why: str, ev: dict[str, Any], now: float) -> None:
    cfg, s = st.cfg, st.s
    pend = s.pending
    assert pend is not None
    st.actions.append(MarkCommand(id=pend.id, status="timeout", detail=why))
    if st.holds("can_retry"):
        st.move(Trigger.COMMAND_RETRY, f"{why}; resending (attempt {pend.attempt + 1} of {cfg.max_attempts})", ev, now)
        st.send(pend.type, pend.args, now, why, attempt=pend.attempt + 1)
        st.alert(AlertLevel.WARN, "command_timeout", f"run {s.run}: {pend.type} unanswered, resent", why, ev)
        return
    st.halt(Trigger.COMMAND_GAVE_UP, f"{why}; gave up after {pend.attempt} attempts", ev, now)
