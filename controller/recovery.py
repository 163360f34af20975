"""The recovery state machine of one run: a declared table and a pure ``transition`` (no I/O).

The table (phases, triggers, guards, actions) is ``controller/recovery_table.py``; its diagram
and a table of every transition are ``docs/recovery-policy.md``, generated from it
(``python -m cliffguard.controller.recovery_diagram --write``).

``transition(state, input) -> (state, actions)`` maps each input (a verdict, a step, a checkpoint,
an ack, a validation result, a tick, the run's end) to at most one trigger of the table; the
handlers ask the guard terms the table names for it (``Step.holds``, ``controller/recovery_step.py``) and a move checks they held.
Inputs that do not concern the current phase (a stale ack, a second spike while already pausing)
change nothing. ``fire(phase, trigger)`` raises
``TransitionNotAllowed`` for a move the table does not declare, so a bug can never walk the
machine somewhere undeclared. Every transition yields a ``RecordTransition`` with its reason and
evidence (window stats, verdict, validation numbers).

Rollback target: the newest *stable* checkpoint at or before the incident's onset step (the first
step of the excursion). A checkpoint becomes stable after ``stable_window`` healthy steps follow
it, or when a validation passes after it. Each rollback multiplies the LR scale by ``[policy] lr_factor``
(cumulative; the command carries the absolute scale).

A run that ends (finished or failed) mid-incident leaves no trainer to answer: the incident closes
as ``abandoned`` (a halted one keeps ``halted`` and gets its close time), an unanswered command
is marked ``cancelled``, and the machine goes back to ``running`` with no incident, which is what
a restarted run under the same id needs and what a late event finds harmless.

Hangs (``controller/recovery_hang.py``): the hang rule's verdict opens an incident and the table
picks the remedy (restart in place, without the culprit's node, or halt); ``restarting`` waits for
the next life's ``run.started``, ``rejoining`` for its node check and first step.

Capabilities: the machine sends a run only the commands its ``run.started`` declared
(``StartedIn``; every command until one says otherwise). A run that cannot pause, validate and
resume gets no incident and no command for a spike, only a critical alert saying what it cannot
do (an alert-only run, e.g. the Accelerate tracker); a run that can pause but cannot roll back is
paused and validated as usual, and an abnormal validation halts it (``rollback_unsupported``: still
paused, a human decides) instead of sending a rollback it would refuse.

Validation without a healthy baseline (no periodic validation seen yet) counts as abnormal: a
rollback to a stable checkpoint costs some steps, resuming a damaged model costs the run.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from cliffguard.controller import recovery_budgets as budgets
from cliffguard.controller import recovery_hang as hang
from cliffguard.controller.recovery_acks import on_ack, on_tick
from cliffguard.controller.recovery_hang_types import NodeCheckIn, SuspectJoinedIn
from cliffguard.controller.recovery_others import on_trainer_timeout, on_triaged
from cliffguard.controller.recovery_preempt import on_run_preempted, on_training_again
from cliffguard.controller.recovery_sdc import on_sdc_verdict
from cliffguard.controller.recovery_state import Checkpoint, RecoveryState
from cliffguard.controller.recovery_step import Step, open_incident, start_rollback
from cliffguard.controller.recovery_suspect import on_check_cleared, on_suspect_joined
from cliffguard.controller.recovery_table import (
    PAUSE_CYCLE,
    WAITING,
    is_abnormal,
    is_stable,
    rollback_bound,
    rollback_target,
    rung_of,
)
from cliffguard.controller.recovery_types import (
    AckIn,
    ActionT,
    CheckpointIn,
    FlagSamples,
    Input,
    MarkCommand,
    MarkStable,
    Phase,
    ProgressIn,
    RecoveryConfig,
    RunEndedIn,
    RunPreemptedIn,
    SendCommand,
    StartedIn,
    TickIn,
    TrainerTimeoutIn,
    TriagedIn,
    Trigger,
    ValidationIn,
    VerdictIn,
)
from cliffguard.controller.rules.held import GUARD_HOLD
from cliffguard.controller.verdict import Action, Verdict
from cliffguard.core.capabilities import normalize as normalize_capabilities
from cliffguard.core.enums import (
    AlertAction,
    AlertLevel,
    CheckpointKind,
    CommandType,
    IncidentOutcome,
    Level,
)

# An enum member read through its class costs ~10x a module global; these are read for every step.
_RECOVERING = Phase.RECOVERING
_PREEMPTED = Phase.PREEMPTED
_REJOINING = Phase.REJOINING
_HALTED = Phase.HALTED
_OK = Level.OK

UNHEALTHY_KEEP = 64


def transition(cfg: RecoveryConfig, state: RecoveryState, inp: Input) -> tuple[RecoveryState, list[ActionT]]:
    """Pure: the next state and the actions for one input. ``state`` is not modified."""
    if type(inp) is ProgressIn and state.phase is not _RECOVERING and state.phase is not _PREEMPTED and \
            state.phase is not _REJOINING and state.phase is not _HALTED and state.flagging is None and (
            not state.checkpoints or all(c.stable for c in state.checkpoints)):
        # The common case, a step with no checkpoint to stabilise, no recovery to finish and no
        # excursion to flag: _on_progress's effect then, without a Step and its action list.
        s = state.clone()
        _note_step(s, inp)
        return s, []
    st = Step(cfg, state)
    match inp:
        case VerdictIn():
            _on_verdict(st, inp)
        case ProgressIn():
            if st.s.phase is _REJOINING:
                hang.on_progress(st, inp)  # the restarted group's first step: training again
            elif st.holds("trains_on", inp):
                hang.on_trains_on(st, inp)  # a stall a halt left running ended by itself
            _on_progress(st, inp)
        case CheckpointIn():
            _on_checkpoint(st, inp)
        case AckIn():
            on_ack(st, inp)
        case ValidationIn():
            _on_validation(st, inp)
        case TickIn():
            if st.s.phase in hang.HANG_PHASES:
                hang.on_tick(st, inp)
            else:
                on_tick(st, inp)
        case RunEndedIn():
            if st.s.phase in hang.HANG_PHASES:
                hang.on_run_ended(st, inp)
            else:
                _on_run_ended(st, inp)
        case StartedIn():
            st.s.capabilities = normalize_capabilities(inp.capabilities)
            hang.on_started(st, inp)
        case NodeCheckIn():
            hang.on_node_check(st, inp)
            on_check_cleared(st, inp)  # a suspect node an operator asked to re-admit passed it
        case SuspectJoinedIn():
            on_suspect_joined(st, inp)  # a node the suspect-node store holds beats in the run
        case TrainerTimeoutIn():
            on_trainer_timeout(st, inp)
        case RunPreemptedIn():
            on_run_preempted(st, inp)
        case TriagedIn():
            on_triaged(st, inp)
        case _:
            raise TypeError(f"not a recovery input: {type(inp).__name__}")
    return st.s, st.actions


def _verdict_evidence(v: Any) -> dict[str, Any]:
    return {"rule": v.rule, "level": str(v.level), "step": v.step, "onset_step": v.onset_step,
            "rank": v.rank, "message": v.message, "window": v.evidence}


def _on_verdict(st: Step, inp: VerdictIn) -> None:
    cfg, s, v = st.cfg, st.s, inp.verdict
    if v.action is Action.RESTART:
        hang.on_restart_verdict(st, inp)  # a hung worker group (controller/recovery_hang.py)
        return
    if v.action is Action.ROLLBACK:
        on_sdc_verdict(st, inp)  # a diverged replica (controller/recovery_sdc.py)
        return
    if v.rule in cfg.health_rules and v.level is not Level.OK:
        s.unhealthy_steps = (*s.unhealthy_steps, v.step)[-UNHEALTHY_KEEP:]
    if v.action is not Action.RECOVER:
        if v.level is not Level.OK:
            st.alert(AlertLevel(v.level), v.rule, f"{v.rule} on run {s.run} at step {v.step}", v.message, _verdict_evidence(v))
            if v.rule in cfg.detail_rules:
                _ask_detail(st, v)
        return
    trigger = Trigger.HOLD if v.rule == GUARD_HOLD else Trigger.SPIKE
    if not st.holds("starts_incident", inp):
        if trigger is Trigger.HOLD and s.phase in WAITING and s.incident is not None:
            # the trainer holds while the command the machine waits on is on its way: it answers the hold
            st.move(Trigger.HOLD, f"the guard holds at step {v.step} ({v.message}); the pending "
                    f"{s.pending.type if s.pending else 'command'} answers it", _verdict_evidence(v), inp.now,
                    step=v.step)
        return  # already handling an incident (or halted): the verdict is in the stored metrics
    evidence = _verdict_evidence(v)
    if not st.holds("can_pause_cycle"):
        missing = ", ".join(str(c) for c in PAUSE_CYCLE if not s.can(c))
        evidence["capabilities"] = [str(c) for c in s.capabilities]
        st.alert(AlertLevel.CRITICAL, v.rule, f"{v.rule} on run {s.run} at step {v.step}: the run cannot {missing}; "
                 "look at it", v.message, evidence)
        return
    onset = v.onset_step if v.onset_step is not None else v.step
    s.flagging = None  # a resumed excursion that turns into a new incident is that incident's now
    if s.incident is None:
        reason = f"{v.rule} {v.level} at step {v.step} (onset {onset}): {v.message}"
        open_incident(st, v.rule, str(v.level), v.step, onset, evidence, inp.now)
        if s.incident is not None and s.incident.rung:
            reason += f"; rung {s.incident.rung} of the escalation ladder ({rung_of(s.incident.rung).why})"
    else:
        # A new spike while recovering continues the same incident a rung up: its rollbacks count
        # together, and the rollback that did not cure the run is not tried again as it was.
        level = s.incident.rung + 1
        s.incident = replace(s.incident, spike_step=v.step, onset_step=onset, sample_end=s.last_sample_end, rung=level)
        evidence["escalation"] = {"level": level, "why": "again while recovering from the incident's rollback"}
        reason = (f"{v.rule} again at step {v.step} (onset {onset}) while recovering: {v.message}; "
                  f"rung {level} of the escalation ladder ({rung_of(level).why})")
    st.move(trigger, reason, evidence, inp.now, step=v.step)
    st.send(CommandType.PAUSE, {"reason": reason[:200]}, inp.now, reason)
    st.alert(AlertLevel.CRITICAL, v.rule, f"{v.rule} on run {s.run} at step {v.step}: pausing", v.message, evidence)


def _ask_detail(st: Step, v: Verdict) -> None:
    """Per-rank step events for the next steps: a side request, never the pending command (no
    ack is awaited; the recovery commands keep their slot)."""
    s = st.s
    st.actions.append(SendCommand(
        id=s.new_id("cmd"), type=CommandType.DETAIL, args={"steps": st.cfg.detail_steps},
        incident_id=s.incident.id if s.incident else None, attempt=1, ttl_s=st.cfg.policy.command_ttl_s,
        reason=f"per-rank detail after {v.rule} at step {v.step}"))


def _on_progress(st: Step, inp: ProgressIn) -> None:
    cfg, s = st.cfg, st.s
    if s.phase is Phase.PREEMPTED:
        on_training_again(st, inp)
    flagging = s.flagging
    _note_step(s, inp)
    _flag_samples(st, inp, flagging)
    _mark_stable(st, f"{cfg.stable_window} healthy steps followed it")
    if s.phase is Phase.RECOVERING and st.holds("is_recovered"):
        inc = s.incident
        assert inc is not None
        ev = {"rollback_to": inc.rollback_to, "step": s.last_step, "lr_scale": s.lr_scale,
              "healthy_steps": cfg.recover_window}
        st.move(Trigger.RECOVERED, f"{cfg.recover_window} healthy steps since the rollback to step {inc.rollback_to}",
                ev, inp.now)
        st.close(IncidentOutcome.ROLLED_BACK, inp.now)
        st.alert(AlertLevel.INFO, inc.rule, f"run {s.run} recovered",
                 f"healthy since the rollback to step {inc.rollback_to}", ev, action=AlertAction.RESOLVE)
        s.incident = None


def _note_step(s: RecoveryState, inp: ProgressIn) -> None:
    """What every step does to the state: the newest step and sample, and the samples of a step
    in an excursion (the spike rule reports only an excursion's onset and its critical step; the
    steps between, warn or critical, took the same suspect data). A step the loss rule did not
    judge counts too."""
    s.last_step = max(s.last_step, inp.step) if s.phase is not _RECOVERING else inp.step
    if inp.sample_end is not None:
        s.last_sample_end = inp.sample_end
    if inp.loss_level is not _OK and inp.sample_start is not None and inp.sample_end is not None:
        s.unhealthy_samples = (*s.unhealthy_samples, (inp.step, inp.sample_start, inp.sample_end))[-UNHEALTHY_KEEP:]


def _flag_samples(st: Step, inp: ProgressIn, flagging: tuple[int, float, str] | None) -> None:
    """While a resumed transient excursion (``flagging``, as it was before this step) goes on,
    its further bad steps are flagged as they come; the first healthy (or unjudged) step ends that."""
    if flagging is None:
        return
    s = st.s
    if inp.loss_level not in (Level.WARN, Level.CRITICAL):
        s.flagging = None
    if inp.loss_level is _OK or inp.sample_start is None or inp.sample_end is None:
        return
    if s.flagging is not None and s.phase in (Phase.RESUMING, Phase.RUNNING):
        _, score, reason = s.flagging
        st.actions.append(FlagSamples(step=inp.step, ranges=((inp.sample_start, inp.sample_end),), score=score,
                                      reason=reason))


def _mark_stable(st: Step, reason: str, upto: int | None = None) -> None:
    """Stabilise checkpoints: by the healthy window, or all at/before ``upto`` (passed validation)."""
    s = st.s
    changed = []
    for c in s.checkpoints:
        if c.stable:
            changed.append(c)
            continue
        ok = c.step <= upto if upto is not None else is_stable(st.cfg, s, c)
        if ok:
            c = replace(c, stable=True)
            st.actions.append(MarkStable(step=c.step, kind=c.kind, reason=reason))
        changed.append(c)
    s.checkpoints = tuple(changed)


def _on_checkpoint(st: Step, inp: CheckpointIn) -> None:
    s = st.s
    if not inp.verified:
        # the trainer reports a write that failed or a checkpoint found corrupt: a rollback
        # target may be missing, which the operator must hear of before one is needed
        st.alert(AlertLevel.WARN, "checkpoint_unverified",
                 f"run {s.run}: {inp.kind} checkpoint at step {inp.step} failed verification",
                 inp.detail or "the trainer reported it unverified", {"step": inp.step, "kind": inp.kind,
                                                                        "detail": inp.detail})
    if not inp.verified and inp.kind != CheckpointKind.MEMORY:
        return  # an unverified disk checkpoint is no rollback target (its verified event follows)
    same = next((c for c in s.checkpoints if c.step == inp.step), None)
    if same is not None:
        if same.kind == CheckpointKind.MEMORY and inp.kind != CheckpointKind.MEMORY:
            # the disk copy of a step outlives its memory snapshot (a restart empties the ring): keep
            # it as the step's kind, or the restart's purge of memory checkpoints forgets the step
            s.checkpoints = tuple(replace(c, kind=inp.kind) if c is same else c for c in s.checkpoints)
        return
    end = s.last_sample_end if s.last_step == inp.step else None
    cps = sorted((*s.checkpoints, Checkpoint(step=inp.step, kind=inp.kind, sample_end=end)), key=lambda c: c.step)
    while len(cps) > st.cfg.max_checkpoints:
        # forget the oldest, but never the newest stable one: it is the likeliest rollback target
        newest_stable = rollback_target(st.cfg, s, cps[-1].step)
        cps.pop(1 if cps[0] == newest_stable else 0)
    s.checkpoints = tuple(cps)
    _mark_stable(st, f"{st.cfg.stable_window} healthy steps followed it")


def _on_validation(st: Step, inp: ValidationIn) -> None:
    cfg, s = st.cfg, st.s
    base = s.baseline()
    ev = {"val_loss": inp.val_loss, "batches": inp.batches, "baseline": base, "step": inp.step,
          "margin_rel": cfg.val_margin_rel, "margin_abs": cfg.val_margin_abs}
    if inp.cmd is None:
        if is_abnormal(cfg, s, inp.val_loss) and base is not None:
            st.alert(AlertLevel.WARN, "validation", f"run {s.run}: validation above baseline at step {inp.step}",
                     f"val_loss {inp.val_loss:.4f} vs baseline {base:.4f}", ev)
            return
        s.val_baseline = (*s.val_baseline, inp.val_loss)[-cfg.baseline_window:] if math.isfinite(inp.val_loss) else s.val_baseline
        if math.isfinite(inp.val_loss):
            _mark_stable(st, f"validation passed at step {inp.step}", upto=inp.step)
        return
    if s.phase is not Phase.VALIDATING or not st.holds("is_ours", inp.cmd):
        return  # an answer to a command we no longer wait for
    inc = s.incident
    assert inc is not None
    if st.holds("not is_abnormal", inp.val_loss):
        _mark_stable(st, f"validation passed at step {inp.step}", upto=inp.step)
        reason = f"validation normal: {inp.val_loss:.4f} within margin of baseline {base:.4f}"
        # every bad step of the excursion so far, also those the trainer ran while the pause was on its
        # way (an extreme spike is critical at its first step, before the rest of a bad stretch); the
        # rest, run after the resume, are flagged as they arrive (_flag_samples)
        ranges = tuple((a, b) for step, a, b in s.unhealthy_samples if inc.onset_step <= step)
        assert base is not None
        score = inp.val_loss / base if base else 0.0
        flag_reason = f"{inc.rule} at step {inc.spike_step} was transient (validation normal)"
        if ranges:  # transient and data-induced: the batches that caused it are worth a look
            st.actions.append(FlagSamples(step=inc.spike_step, ranges=ranges, score=score, reason=flag_reason))
        s.flagging = (inc.onset_step, score, flag_reason)
        st.move(Trigger.VALIDATION_NORMAL, reason, ev, inp.now)
        st.send(CommandType.RESUME, {"reason": "validation normal"}, inp.now, reason)
        return
    why = "no healthy validation baseline yet" if base is None else f"{inp.val_loss:.4f} > baseline {base:.4f} + margin"
    if st.holds("not can_roll_back"):
        ev["capabilities"] = [str(c) for c in s.capabilities]
        st.halt(Trigger.ROLLBACK_UNSUPPORTED, f"validation abnormal ({why}) and the run cannot roll back; it stays paused",
                ev, inp.now)
        return
    if st.holds("not within_budget", inp.now):
        spent, ev["budget"] = budgets.spent(cfg, s, "rollback", inp.now)
        ev["rollbacks_in_window"] = ev["budget"]["in_window"]
        st.halt(Trigger.BUDGET_EXHAUSTED, f"validation abnormal ({why}) and {spent}", ev, inp.now)
        return
    bound = rollback_bound(cfg, s, inc)  # the onset; before the previous target on a higher rung
    if st.holds("not rollback_target", bound):
        st.halt(Trigger.NO_TARGET, f"validation abnormal ({why}) and no stable checkpoint at or before step {bound}",
                ev, inp.now)
        return
    target = rollback_target(cfg, s, bound)
    assert target is not None
    if bound < inc.onset_step:
        why += f"; rung {inc.rung}: a longer rollback, before the previous target"
    start_rollback(st, Trigger.VALIDATION_ABNORMAL, target, f"validation abnormal: {why}", ev, inp.now)


def _on_run_ended(st: Step, inp: RunEndedIn) -> None:
    s = st.s
    inc = s.incident
    if inc is None:
        return  # running, nothing outstanding: the run's end changes nothing here
    pend = s.pending
    how = "failed" if inp.failed else "finished"
    # halted already asked a human and its incident says so; the end only dates it
    outcome = IncidentOutcome.HALTED if s.phase is Phase.HALTED else IncidentOutcome.ABANDONED
    ev = {"phase": str(s.phase), "failed": inp.failed, "detail": inp.detail,
          "cmd": pend.id if pend else None, "cmd_type": str(pend.type) if pend else None,
          "rollbacks": inc.rollbacks}
    reason = f"the run {how} while {s.phase}" + (f" ({inp.detail})" if inp.detail else "") + f"; incident {outcome}"
    st.move(Trigger.RUN_ENDED, reason, ev, inp.now)
    if pend is not None and not pend.acked:  # an acked validate was applied: its row is already final
        st.actions.append(MarkCommand(id=pend.id, status="cancelled", detail=f"the run {how} before answering"))
    s.pending = None
    st.close(outcome, inp.now)
    st.alert(AlertLevel.WARN, inc.rule, f"run {s.run} {how} mid-incident: {outcome}", reason, ev,
             action=AlertAction.RESOLVE)
    s.incident = None


def new_state(run: str, salt: str) -> RecoveryState:
    """The state of a run the controller has not seen before (``salt``: random text)."""
    return RecoveryState(run=run, salt=salt)
