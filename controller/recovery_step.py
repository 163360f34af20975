"""One ``transition`` call's work in progress: a private copy of the run's state and the actions
collected so far, with the moves every handler shares (``controller/recovery.py`` drives it).

``Step.holds`` asks a guard term of the table and remembers its value; ``Step.move`` fires a
trigger and checks that the terms the table names for that move held in this call.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from cliffguard.controller import recovery_budgets as budgets
from cliffguard.controller.recovery_state import Checkpoint, Closed, Incident, Pending, RecoveryState
from cliffguard.controller.recovery_table import ENTRIES, escalation_level, fire, holds, rung_of
from cliffguard.controller.recovery_types import (
    ActionT,
    Alert,
    CloseIncident,
    OpenIncident,
    RecordSuspect,
    RecordTransition,
    RecoveryConfig,
    SendCommand,
    Trigger,
)
from cliffguard.controller.rules.sdc import SDC
from cliffguard.core.enums import AlertAction, AlertLevel, CommandType, IncidentOutcome
from cliffguard.core.policy import rolled_back_lr_scale

ISSUED_KEEP = 32
SUSPECTS_KEEP = 64
"""(node, life) pairs a run remembers answering (``HangState.suspects``)."""


class Step:
    """Collects the actions of one ``transition`` call on a private copy of the state."""

    def __init__(self, cfg: RecoveryConfig, state: RecoveryState) -> None:
        self.cfg = cfg
        self.s = state.clone()
        self.actions: list[ActionT] = []
        self.held: dict[str, bool] = {}
        """Guard name -> its value when last asked in this call (``holds``), for ``move``'s check."""

    def holds(self, term: str, *args: Any) -> bool:
        """Whether a guard term of the table holds now (``recovery_table.holds``), remembered."""
        ok = holds(term, self.cfg, self.s, *args)
        name = term.removeprefix("not ")
        self.held[name] = ok if name == term else not ok
        return ok

    def move(self, trigger: Trigger, reason: str, evidence: dict[str, Any], now: float, step: int | None = None) -> None:
        s = self.s
        step = step if step is not None else (s.last_step if s.last_step >= 0 else None)
        before = s.phase
        s.phase = fire(before, trigger)
        unmet = [t for t in ENTRIES[(before, trigger)].guard
                 if self.held.get(t.removeprefix("not ")) is not (not t.startswith("not "))]
        assert not unmet, f"{before} -> {s.phase} on {trigger}: guard terms {unmet} were not asked or failed"
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

    def alert(self, level: AlertLevel, rule: str, title: str, body: str, evidence: dict[str, Any],
              action: AlertAction = AlertAction.TRIGGER) -> None:
        inc = self.s.incident
        self.actions.append(
            Alert(level=level, rule=rule, title=title, body=body, incident_id=inc.id if inc else None,
                  action=action, evidence=evidence)
        )

    def halt(self, trigger: Trigger, reason: str, evidence: dict[str, Any], now: float) -> None:
        s = self.s
        self.move(trigger, reason, evidence, now)
        s.pending = None
        inc = s.incident
        assert inc is not None  # commands are only sent within an incident
        self.close(IncidentOutcome.HALTED, None)
        self.alert(AlertLevel.CRITICAL, inc.rule, f"run {s.run} halted: human needed", reason, evidence)

    def close(self, outcome: IncidentOutcome, closed_at: float | None) -> None:
        """Close the incident (the row; a halted one stays the state's until the run goes on).
        A resumed or recovered one is what the next excursion escalates from; a halt, an
        abandoned run or an operator's decision start the ladder afresh."""
        s = self.s
        inc = s.incident
        assert inc is not None
        self.actions.append(CloseIncident(id=inc.id, outcome=outcome, closed_at=closed_at,
                                          rollback_to=inc.rollback_to, lr_scale=s.lr_scale,
                                          lr_scales=inc.lr_scales, escalation=inc.rung))
        if outcome is IncidentOutcome.CURED:
            return  # a cure the trainer applied itself: the escalation ladder's memory stays as it was
        if outcome in (IncidentOutcome.RESUMED, IncidentOutcome.ROLLED_BACK):
            target = inc.rollback_to if inc.rollback_to is not None else inc.prior_target
            s.previous = Closed(id=inc.id, step=s.last_step, rung=inc.rung, rollback_to=target)
        else:
            s.previous = None


def open_incident(st: Step, rule: str, level: str, spike_step: int, onset: int, evidence: dict[str, Any],
                  now: float) -> None:
    """A new incident, on the rung of the escalation ladder its onset puts it (``escalation_level``:
    a rung above the previous incident's when it began soon after that one ended)."""
    s = st.s
    rung_level = escalation_level(st.cfg, s, onset)
    prev = s.previous if rung_level else None
    evidence = {**evidence, "lr_scale_at_open": s.lr_scale}
    if prev is not None:
        evidence = {**evidence, "escalation": {
            "level": rung_level, "follows": prev.id, "previous_ended_at_step": prev.step,
            "why": f"began within {st.cfg.escalate_within} steps of the end of incident {prev.id[:8]}"}}
    inc = s.incident = Incident(
        id=s.new_id("incident"), rule=rule, level=level, spike_step=spike_step, onset_step=onset, opened_at=now,
        sample_end=s.last_sample_end, evidence=evidence, rung=rung_level, follows=prev.id if prev else None,
        prior_target=prev.rollback_to if prev else None)
    st.actions.append(OpenIncident(id=inc.id, rule=rule, level=level, spike_step=spike_step, onset_step=onset,
                                   opened_at=now, evidence=evidence))


def rolled_back(st: Step, to_step: int, now: float) -> None:
    """What a rollback applied to ``to_step`` (the machine's, or the trainer's own) does to the
    state: the budget's clock, the incident's count, and the steps after the target forgotten."""
    s = st.s
    inc = s.incident
    assert inc is not None
    s.rollback_times = (*s.rollback_times, now)[-max(st.cfg.rollback_budget, 1) * 2:]
    budgets.note(st.cfg, s, "rollback", now)
    s.incident = replace(inc, rollbacks=inc.rollbacks + 1, rollback_to=to_step)
    s.last_step = to_step
    s.checkpoints = tuple(c for c in s.checkpoints if c.step <= s.last_step)
    s.unhealthy_steps = tuple(u for u in s.unhealthy_steps if u <= s.last_step)
    s.unhealthy_samples = tuple(x for x in s.unhealthy_samples if x[0] <= s.last_step)  # replayed anew



def start_rollback(st: Step, trigger: Trigger, target: Checkpoint, why: str, ev: dict[str, Any], now: float) -> None:
    """Send the rollback to ``target``. A first one (validation abnormal) cuts the LR scale by
    ``lr_factor`` as many times as the incident's rung says; a retry after a failed one keeps it.
    ``skip_data`` skips the data since the target, unless a diverged replica (SDC) caused it:
    that data was fine."""
    cfg, s = st.cfg, st.s
    inc = s.incident
    assert inc is not None
    scale, cuts = s.lr_scale, 0
    if trigger is Trigger.VALIDATION_ABNORMAL:
        cuts = rung_of(inc.rung).lr_cuts
        for _ in range(cuts):
            scale = rolled_back_lr_scale(scale, cfg.policy.lr_factor)
    args: dict[str, Any] = {"to_step": target.step, "lr_scale": scale}
    if inc.rule != SDC and cfg.skip_data and target.sample_end is not None and inc.sample_end is not None and inc.sample_end > target.sample_end:
        args["skip_data"] = [target.sample_end, inc.sample_end]
    ev = {**ev, "target": {"step": target.step, "kind": target.kind}, "lr_scale": scale, "onset_step": inc.onset_step,
          "escalation": inc.rung, "lr_scales": [*inc.lr_scales, *([scale] if cuts else [])]}
    cut = f" (x{cfg.policy.lr_factor:g}^{cuts} on rung {inc.rung})" if cuts > 1 else ""
    reason = f"{why}; rolling back to stable checkpoint {target.step} ({target.kind}) with lr_scale {scale:g}{cut}"
    if trigger is Trigger.SDC:
        reason += " (kept: a diverged replica is no optimizer trouble)"
    st.move(trigger, reason, ev, now)
    s.lr_scale = scale
    s.incident = replace(inc, rollback_to=target.step, lr_scales=(*inc.lr_scales, scale) if cuts else inc.lr_scales)
    st.send(CommandType.ROLLBACK, args, now, reason)


def record_suspects(st: Step, nodes: tuple[str, ...], cause: str, reason: str, now: float,
                    device: int | None = None) -> None:
    """Keep ``nodes`` out of later worker groups (the suspect-node store; controller/suspects.py writes
    it); this life's beats of them are this incident's business, not a new admission. With ``device``
    (a device-level eviction of the one node) the record names that device and the node stays admitted."""
    s = st.s
    known = tuple(n for n in dict.fromkeys(nodes) if n)
    if device is not None:
        for n in known:
            st.actions.append(RecordSuspect(node=n, cause=cause, reason=reason[:500], device=device,
                                            incident_id=s.incident.id if s.incident else None, at=now))
        return
    for n in known:
        st.actions.append(RecordSuspect(node=n, cause=cause, reason=reason[:500],
                                        incident_id=s.incident.id if s.incident else None, at=now))
    s.hang = replace(s.hang, suspects=(*s.hang.suspects, *((n, s.hang.life) for n in known))[-SUSPECTS_KEEP:])
