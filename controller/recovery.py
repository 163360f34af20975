"""The recovery state machine of one run: a declared table and a pure ``transition`` (no I/O).

::

    running ─spike─► pausing ─pause_applied─► validating ─validation_normal─► resuming ─resume_applied─► running
                                                  │
                                                  ├─validation_abnormal─► rolling_back ─rollback_applied─► recovering
                                                  │                            │  ▲ rollback_failed (older target)      │
                                                  │                            └──┘                          recovered ─► running
                                                  └─budget_exhausted / no_target / rollback_unsupported ─► halted ◄─ command_gave_up / command_refused
    recovering ─spike─► pausing (same incident)        halted ─operator_resumed─► running
    pausing | validating | rolling_back | recovering | resuming | halted ─run_ended─► running

``transition(state, input) -> (state, actions)`` maps each input (a verdict, a step, a checkpoint,
an ack, a validation result, a tick, the run's end) to at most one trigger of the table, guarded by the named
predicates in ``GUARDS`` (the table and the guards: ``controller/recovery_table.py``); inputs that do not concern the current phase (a stale ack, a second
spike while already pausing) change nothing. ``fire(phase, trigger)`` raises
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

from cliffguard.controller.recovery_table import (
    WAITING,
    can_retry,
    fire,
    is_abnormal,
    is_ours,
    is_recovered,
    is_stable,
    rollback_target,
    starts_incident,
    timed_out,
    within_budget,
)
from cliffguard.controller.recovery_types import (
    AckIn,
    ActionT,
    Alert,
    Checkpoint,
    CheckpointIn,
    CloseIncident,
    FlagSamples,
    Incident,
    Input,
    MarkCommand,
    MarkStable,
    OpenIncident,
    Pending,
    Phase,
    ProgressIn,
    RecordTransition,
    RecoveryConfig,
    RecoveryState,
    RunEndedIn,
    SendCommand,
    StartedIn,
    TickIn,
    ValidationIn,
    VerdictIn,
)
from cliffguard.controller.verdict import Action, Verdict
from cliffguard.core.capabilities import normalize as normalize_capabilities
from cliffguard.core.enums import AckStatus, CommandType, Level
from cliffguard.core.policy import rolled_back_lr_scale

# An enum member read through its class costs ~10x a module global; these are read for every step.
_RECOVERING = Phase.RECOVERING
_OK = Level.OK

UNHEALTHY_KEEP = 64
PAUSE_CYCLE = (CommandType.PAUSE, CommandType.VALIDATE, CommandType.RESUME)
"""What a run must apply for the machine to open an incident: pause, judge the frozen weights, resume."""
ISSUED_KEEP = 32


# ---------------------------------------------------------------------------------------------
# The transition function
# ---------------------------------------------------------------------------------------------


class _Step:
    """Collects the actions of one ``transition`` call on a private copy of the state."""

    def __init__(self, cfg: RecoveryConfig, state: RecoveryState) -> None:
        self.cfg = cfg
        self.s = state.clone()
        self.actions: list[ActionT] = []

    def move(self, trigger: str, reason: str, evidence: dict[str, Any], now: float, step: int | None = None) -> None:
        s = self.s
        step = step if step is not None else (s.last_step if s.last_step >= 0 else None)
        before = s.phase
        s.phase = fire(before, trigger)
        inc = s.incident
        self.actions.append(
            RecordTransition(
                from_state=before, to_state=s.phase, trigger=trigger, reason=reason, evidence=evidence,
                incident_id=inc.id if inc else None, step=step, ts=now,
            )
        )

    def send(self, ctype: CommandType, args: dict[str, Any], now: float, reason: str, attempt: int = 1) -> None:
        s = self.s
        cmd_id = s.new_id("cmd")
        s.pending = Pending(id=cmd_id, type=ctype, args=args, sent_at=now, attempt=attempt)
        s.issued = (*s.issued, cmd_id)[-ISSUED_KEEP:]
        self.actions.append(
            SendCommand(
                id=cmd_id, type=ctype, args=args, incident_id=s.incident.id if s.incident else None,
                attempt=attempt, ttl_s=self.cfg.policy.command_ttl_s, reason=reason,
            )
        )

    def alert(self, level: str, rule: str, title: str, body: str, evidence: dict[str, Any], action: str = "trigger") -> None:
        inc = self.s.incident
        self.actions.append(
            Alert(level=level, rule=rule, title=title, body=body, incident_id=inc.id if inc else None,
                  action=action, evidence=evidence)
        )

    def halt(self, trigger: str, reason: str, evidence: dict[str, Any], now: float) -> None:
        s = self.s
        self.move(trigger, reason, evidence, now)
        s.pending = None
        inc = s.incident
        assert inc is not None  # commands are only sent within an incident
        self.actions.append(CloseIncident(id=inc.id, outcome="halted", closed_at=None,
                                          rollback_to=inc.rollback_to, lr_scale=s.lr_scale))
        self.alert("critical", inc.rule, f"run {s.run} halted: human needed", reason, evidence)


def transition(cfg: RecoveryConfig, state: RecoveryState, inp: Input) -> tuple[RecoveryState, list[ActionT]]:
    """Pure: the next state and the actions for one input. ``state`` is not modified."""
    if type(inp) is ProgressIn and state.phase is not _RECOVERING and state.flagging is None and (
            not state.checkpoints or all(c.stable for c in state.checkpoints)):
        # The common case, a step with no checkpoint to stabilise, no recovery to finish and no
        # excursion to flag: _on_progress's effect then, without a _Step and its action list.
        s = state.clone()
        _note_step(s, inp)
        return s, []
    st = _Step(cfg, state)
    if isinstance(inp, VerdictIn):
        _on_verdict(st, inp)
    elif isinstance(inp, ProgressIn):
        _on_progress(st, inp)
    elif isinstance(inp, CheckpointIn):
        _on_checkpoint(st, inp)
    elif isinstance(inp, AckIn):
        _on_ack(st, inp)
    elif isinstance(inp, ValidationIn):
        _on_validation(st, inp)
    elif isinstance(inp, TickIn):
        _on_tick(st, inp)
    elif isinstance(inp, RunEndedIn):
        _on_run_ended(st, inp)
    elif isinstance(inp, StartedIn):
        st.s.capabilities = normalize_capabilities(inp.capabilities)
    else:
        raise TypeError(f"not a recovery input: {type(inp).__name__}")
    return st.s, st.actions


def _verdict_evidence(v: Any) -> dict[str, Any]:
    return {"rule": v.rule, "level": str(v.level), "step": v.step, "onset_step": v.onset_step,
            "rank": v.rank, "message": v.message, "window": v.evidence}


def _on_verdict(st: _Step, inp: VerdictIn) -> None:
    cfg, s, v = st.cfg, st.s, inp.verdict
    if v.rule in cfg.health_rules and v.level is not Level.OK:
        s.unhealthy_steps = (*s.unhealthy_steps, v.step)[-UNHEALTHY_KEEP:]
    if v.action is not Action.RECOVER:
        if v.level is not Level.OK:
            st.alert(str(v.level), v.rule, f"{v.rule} on run {s.run} at step {v.step}", v.message, _verdict_evidence(v))
            if v.rule in cfg.detail_rules:
                _ask_detail(st, v)
        return
    if not starts_incident(cfg, s, inp):
        return  # already handling an incident (or halted): the verdict is in the stored metrics
    evidence = _verdict_evidence(v)
    if not s.can(*PAUSE_CYCLE):
        missing = ", ".join(str(c) for c in PAUSE_CYCLE if not s.can(c))
        evidence["capabilities"] = [str(c) for c in s.capabilities]
        st.alert("critical", v.rule, f"{v.rule} on run {s.run} at step {v.step}: the run cannot {missing}; "
                 "look at it", v.message, evidence)
        return
    onset = v.onset_step if v.onset_step is not None else v.step
    s.flagging = None  # a resumed excursion that turns into a new incident is that incident's now
    if s.incident is None:
        inc = Incident(id=s.new_id("incident"), rule=v.rule, level=str(v.level), spike_step=v.step,
                       onset_step=onset, opened_at=inp.now, sample_end=s.last_sample_end, evidence=evidence)
        s.incident = inc
        st.actions.append(OpenIncident(id=inc.id, rule=inc.rule, level=inc.level, spike_step=v.step,
                                       onset_step=onset, opened_at=inp.now, evidence=evidence))
        reason = f"{v.rule} {v.level} at step {v.step} (onset {onset}): {v.message}"
    else:
        # A new spike while recovering continues the same incident: its rollbacks count together.
        s.incident = replace(s.incident, spike_step=v.step, onset_step=onset, sample_end=s.last_sample_end)
        reason = f"{v.rule} again at step {v.step} (onset {onset}) while recovering: {v.message}"
    st.move("spike", reason, evidence, inp.now, step=v.step)
    st.send(CommandType.PAUSE, {"reason": reason[:200]}, inp.now, reason)
    st.alert("critical", v.rule, f"{v.rule} on run {s.run} at step {v.step}: pausing", v.message, evidence)


def _ask_detail(st: _Step, v: Verdict) -> None:
    """Per-rank step events for the next steps: a side request, never the pending command (no
    ack is awaited; the recovery commands keep their slot)."""
    s = st.s
    st.actions.append(SendCommand(
        id=s.new_id("cmd"), type=CommandType.DETAIL, args={"steps": st.cfg.detail_steps},
        incident_id=s.incident.id if s.incident else None, attempt=1, ttl_s=st.cfg.policy.command_ttl_s,
        reason=f"per-rank detail after {v.rule} at step {v.step}"))


def _on_progress(st: _Step, inp: ProgressIn) -> None:
    cfg, s = st.cfg, st.s
    flagging = s.flagging
    _note_step(s, inp)
    _flag_samples(st, inp, flagging)
    _mark_stable(st, f"{cfg.stable_window} healthy steps followed it")
    if s.phase is Phase.RECOVERING and is_recovered(cfg, s):
        inc = s.incident
        assert inc is not None
        ev = {"rollback_to": inc.rollback_to, "step": s.last_step, "lr_scale": s.lr_scale,
              "healthy_steps": cfg.recover_window}
        st.move("recovered", f"{cfg.recover_window} healthy steps since the rollback to step {inc.rollback_to}",
                ev, inp.now)
        st.actions.append(CloseIncident(id=inc.id, outcome="rolled_back", closed_at=inp.now,
                                        rollback_to=inc.rollback_to, lr_scale=s.lr_scale))
        st.alert("info", inc.rule, f"run {s.run} recovered", f"healthy since the rollback to step {inc.rollback_to}",
                 ev, action="resolve")
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


def _flag_samples(st: _Step, inp: ProgressIn, flagging: tuple[int, float, str] | None) -> None:
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


def _mark_stable(st: _Step, reason: str, upto: int | None = None) -> None:
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


def _on_checkpoint(st: _Step, inp: CheckpointIn) -> None:
    s = st.s
    if not inp.verified:
        # the trainer reports a write that failed or a checkpoint found corrupt: a rollback
        # target may be missing, which the operator must hear of before one is needed
        st.alert("warn", "checkpoint_unverified",
                 f"run {s.run}: {inp.kind} checkpoint at step {inp.step} failed verification",
                 inp.detail or "the trainer reported it unverified", {"step": inp.step, "kind": inp.kind,
                                                                        "detail": inp.detail})
    if not inp.verified and inp.kind != "memory":
        return  # an unverified disk checkpoint is no rollback target (its verified event follows)
    if any(c.step == inp.step for c in s.checkpoints):
        return
    end = s.last_sample_end if s.last_step == inp.step else None
    cps = sorted((*s.checkpoints, Checkpoint(step=inp.step, kind=inp.kind, sample_end=end)), key=lambda c: c.step)
    while len(cps) > st.cfg.max_checkpoints:
        # forget the oldest, but never the newest stable one: it is the likeliest rollback target
        newest_stable = rollback_target(st.cfg, s, cps[-1].step)
        cps.pop(1 if cps[0] == newest_stable else 0)
    s.checkpoints = tuple(cps)
    _mark_stable(st, f"{st.cfg.stable_window} healthy steps followed it")


def _on_validation(st: _Step, inp: ValidationIn) -> None:
    cfg, s = st.cfg, st.s
    base = s.baseline()
    ev = {"val_loss": inp.val_loss, "batches": inp.batches, "baseline": base, "step": inp.step,
          "margin_rel": cfg.val_margin_rel, "margin_abs": cfg.val_margin_abs}
    if inp.cmd is None:
        if is_abnormal(cfg, s, inp.val_loss) and base is not None:
            st.alert("warn", "validation", f"run {s.run}: validation above baseline at step {inp.step}",
                     f"val_loss {inp.val_loss:.4f} vs baseline {base:.4f}", ev)
            return
        s.val_baseline = (*s.val_baseline, inp.val_loss)[-cfg.baseline_window:] if math.isfinite(inp.val_loss) else s.val_baseline
        if math.isfinite(inp.val_loss):
            _mark_stable(st, f"validation passed at step {inp.step}", upto=inp.step)
        return
    if s.phase is not Phase.VALIDATING or not is_ours(cfg, s, inp.cmd):
        return  # an answer to a command we no longer wait for
    inc = s.incident
    assert inc is not None
    if not is_abnormal(cfg, s, inp.val_loss):
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
        st.move("validation_normal", reason, ev, inp.now)
        st.send(CommandType.RESUME, {"reason": "validation normal"}, inp.now, reason)
        return
    why = "no healthy validation baseline yet" if base is None else f"{inp.val_loss:.4f} > baseline {base:.4f} + margin"
    if not s.can(CommandType.ROLLBACK):
        ev["capabilities"] = [str(c) for c in s.capabilities]
        st.halt("rollback_unsupported", f"validation abnormal ({why}) and the run cannot roll back; it stays paused",
                ev, inp.now)
        return
    if not within_budget(cfg, s, inp.now):
        ev["rollbacks_in_window"] = len([t for t in s.rollback_times if inp.now - t < cfg.rollback_window_s])
        ev["budget"] = cfg.rollback_budget
        st.halt("budget_exhausted", f"validation abnormal ({why}) and the rollback budget "
                f"({cfg.rollback_budget} per {cfg.rollback_window_s:.0f}s) is spent", ev, inp.now)
        return
    target = rollback_target(cfg, s, inc.onset_step)
    if target is None:
        st.halt("no_target", f"validation abnormal ({why}) and no stable checkpoint at or before step {inc.onset_step}",
                ev, inp.now)
        return
    _start_rollback(st, "validation_abnormal", target, f"validation abnormal: {why}", ev, inp.now)


def _start_rollback(st: _Step, trigger: str, target: Checkpoint, why: str, ev: dict[str, Any], now: float) -> None:
    cfg, s = st.cfg, st.s
    inc = s.incident
    assert inc is not None
    scale = rolled_back_lr_scale(s.lr_scale, cfg.policy.lr_factor) if trigger == "validation_abnormal" else s.lr_scale
    args: dict[str, Any] = {"to_step": target.step, "lr_scale": scale}
    if cfg.skip_data and target.sample_end is not None and inc.sample_end is not None and inc.sample_end > target.sample_end:
        args["skip_data"] = [target.sample_end, inc.sample_end]
    ev = {**ev, "target": {"step": target.step, "kind": target.kind}, "lr_scale": scale, "onset_step": inc.onset_step}
    reason = f"{why}; rolling back to stable checkpoint {target.step} ({target.kind}) with lr_scale {scale:g}"
    st.move(trigger, reason, ev, now)
    s.lr_scale = scale
    s.incident = replace(inc, rollback_to=target.step)
    st.send(CommandType.ROLLBACK, args, now, reason)


def _on_ack(st: _Step, inp: AckIn) -> None:
    cfg, s = st.cfg, st.s
    if not is_ours(cfg, s, inp.cmd_id):
        if (s.phase is Phase.HALTED and inp.status is AckStatus.APPLIED and inp.cmd_id not in s.issued
                and inp.cmd_type in (CommandType.RESUME, CommandType.ROLLBACK)):
            st.move("operator_resumed", f"an operator {inp.cmd_type} was applied: {inp.detail}",
                    {"cmd": inp.cmd_id, "cmd_type": inp.cmd_type, "detail": inp.detail}, inp.now)
            inc = s.incident
            assert inc is not None  # halted always holds the incident that halted it
            st.actions.append(CloseIncident(id=inc.id, outcome="halted", closed_at=inp.now,
                                            rollback_to=inc.rollback_to, lr_scale=s.lr_scale))
            st.alert("info", inc.rule, f"run {s.run} resumed by an operator", inp.detail, {}, action="resolve")
            s.incident = None
        return
    pend = s.pending
    assert pend is not None
    ev = {"cmd": pend.id, "cmd_type": str(pend.type), "status": str(inp.status), "detail": inp.detail,
          "attempt": pend.attempt}
    if inp.status is AckStatus.APPLIED:
        _on_applied(st, pend, ev, inp.now)
    elif inp.status is AckStatus.DUPLICATE:
        return  # the trainer saw this id before; the first delivery's ack decides
    elif inp.status is AckStatus.EXPIRED:
        _retry_or_give_up(st, f"{pend.type} expired before the trainer applied it", ev, inp.now)
    elif inp.status is AckStatus.FAILED and pend.type is CommandType.ROLLBACK:
        inc = s.incident
        assert inc is not None
        failed_step = int(pend.args["to_step"])
        failed_kind = next((c.kind for c in s.checkpoints if c.step == failed_step), None)
        # a memory ring forgets its oldest first: when one memory snapshot is gone, every older one is too
        s.checkpoints = tuple(c for c in s.checkpoints if c.step != failed_step
                              and not (failed_kind == "memory" and c.kind == "memory" and c.step < failed_step))
        target = rollback_target(cfg, s, failed_step - 1)
        if target is None:
            st.halt("no_target", f"rollback to {failed_step} failed ({inp.detail}) and no older stable checkpoint",
                    ev, inp.now)
            return
        _start_rollback(st, "rollback_failed", target, f"rollback to {failed_step} failed ({inp.detail})", ev, inp.now)
    else:  # rejected, or a non-rollback command failed: resending the same thing cannot help
        st.halt("command_refused", f"{pend.type} was {inp.status} by the trainer: {inp.detail}", ev, inp.now)


def _on_applied(st: _Step, pend: Pending, ev: dict[str, Any], now: float) -> None:
    s = st.s
    if pend.type is CommandType.PAUSE:
        st.move("pause_applied", "the trainer paused; validating the frozen weights", ev, now)
        st.send(CommandType.VALIDATE, {}, now, "validate the frozen weights")
    elif pend.type is CommandType.VALIDATE:
        s.pending = replace(pend, acked=True)  # the validation event itself decides
    elif pend.type is CommandType.ROLLBACK:
        inc = s.incident
        assert inc is not None
        st.move("rollback_applied", f"rolled back to step {inc.rollback_to} ({ev['detail']}); training continues",
                ev, now)
        s.pending = None
        s.rollback_times = (*s.rollback_times, now)[-max(st.cfg.rollback_budget, 1) * 2:]
        s.incident = replace(inc, rollbacks=inc.rollbacks + 1)
        s.last_step = int(pend.args["to_step"])
        s.checkpoints = tuple(c for c in s.checkpoints if c.step <= s.last_step)
        s.unhealthy_steps = tuple(u for u in s.unhealthy_steps if u <= s.last_step)
        s.unhealthy_samples = tuple(x for x in s.unhealthy_samples if x[0] <= s.last_step)  # replayed anew
    else:  # RESUME
        inc = s.incident
        assert inc is not None
        st.move("resume_applied", "resumed: the spike was transient", ev, now)
        s.pending = None
        st.actions.append(CloseIncident(id=inc.id, outcome="resumed", closed_at=now, rollback_to=None,
                                        lr_scale=s.lr_scale))
        st.alert("info", inc.rule, f"run {s.run} resumed", "validation was normal; the spike was transient",
                 ev, action="resolve")
        s.incident = None


def _on_tick(st: _Step, inp: TickIn) -> None:
    s = st.s
    if s.phase not in WAITING or not timed_out(st.cfg, s, inp.now):
        return
    pend = s.pending
    assert pend is not None
    ev = {"cmd": pend.id, "cmd_type": str(pend.type), "attempt": pend.attempt, "waited_s": inp.now - pend.sent_at}
    _retry_or_give_up(st, f"no answer to {pend.type} after {inp.now - pend.sent_at:.0f}s", ev, inp.now)


def _retry_or_give_up(st: _Step, why: str, ev: dict[str, Any], now: float) -> None:
    cfg, s = st.cfg, st.s
    pend = s.pending
    assert pend is not None
    st.actions.append(MarkCommand(id=pend.id, status="timeout", detail=why))
    if can_retry(cfg, s):
        st.move("command_retry", f"{why}; resending (attempt {pend.attempt + 1} of {cfg.max_attempts})", ev, now)
        st.send(pend.type, pend.args, now, why, attempt=pend.attempt + 1)
        st.alert("warn", "command_timeout", f"run {s.run}: {pend.type} unanswered, resent", why, ev)
        return
    st.halt("command_gave_up", f"{why}; gave up after {pend.attempt} attempts", ev, now)


def _on_run_ended(st: _Step, inp: RunEndedIn) -> None:
    s = st.s
    inc = s.incident
    if inc is None:
        return  # running, nothing outstanding: the run's end changes nothing here
    pend = s.pending
    how = "failed" if inp.failed else "finished"
    # halted already asked a human and its incident says so; the end only dates it
    outcome = "halted" if s.phase is Phase.HALTED else "abandoned"
    ev = {"phase": str(s.phase), "failed": inp.failed, "detail": inp.detail,
          "cmd": pend.id if pend else None, "cmd_type": str(pend.type) if pend else None,
          "rollbacks": inc.rollbacks}
    reason = f"the run {how} while {s.phase}" + (f" ({inp.detail})" if inp.detail else "") + f"; incident {outcome}"
    st.move("run_ended", reason, ev, inp.now)
    if pend is not None and not pend.acked:  # an acked validate was applied: its row is already final
        st.actions.append(MarkCommand(id=pend.id, status="cancelled", detail=f"the run {how} before answering"))
    s.pending = None
    st.actions.append(CloseIncident(id=inc.id, outcome=outcome, closed_at=inp.now, rollback_to=inc.rollback_to,
                                    lr_scale=s.lr_scale))
    st.alert("warn", inc.rule, f"run {s.run} {how} mid-incident: {outcome}", reason, ev, action="resolve")
    s.incident = None


def new_state(run: str, salt: str) -> RecoveryState:
    """The state of a run the controller has not seen before (``salt``: random text)."""
    return RecoveryState(run=run, salt=salt)
