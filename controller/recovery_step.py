"""One ``transition`` call's work in progress: a private copy of the run's state and the actions
collected so far, with the moves every handler shares (``controller/recovery.py`` drives it).

``Step.holds`` asks a guard term of the table and remembers its value; ``Step.move`` fires a
trigger and checks that the terms the table names for that move held in this call.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from cliffguard.controller.recovery_table import ENTRIES, fire, holds
from cliffguard.controller.recovery_types import (
    ActionT,
    Alert,
    Checkpoint,
    CloseIncident,
    Pending,
    RecordTransition,
    RecoveryConfig,
    RecoveryState,
    SendCommand,
    Trigger,
)
from cliffguard.core.enums import AlertAction, AlertLevel, CommandType, IncidentOutcome
from cliffguard.core.policy import rolled_back_lr_scale

ISSUED_KEEP = 32


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
        self.actions.append(CloseIncident(id=inc.id, outcome=IncidentOutcome.HALTED, closed_at=None,
                                          rollback_to=inc.rollback_to, lr_scale=s.lr_scale))
        self.alert(AlertLevel.CRITICAL, inc.rule, f"run {s.run} halted: human needed", reason, evidence)



def start_rollback(st: Step, trigger: Trigger, target: Checkpoint, why: str, ev: dict[str, Any], now: float) -> None:
    cfg, s = st.cfg, st.s
    inc = s.incident
    assert inc is not None
    scale = rolled_back_lr_scale(s.lr_scale, cfg.policy.lr_factor) if trigger is Trigger.VALIDATION_ABNORMAL else s.lr_scale
    args: dict[str, Any] = {"to_step": target.step, "lr_scale": scale}
    if cfg.skip_data and target.sample_end is not None and inc.sample_end is not None and inc.sample_end > target.sample_end:
        args["skip_data"] = [target.sample_end, inc.sample_end]
    ev = {**ev, "target": {"step": target.step, "kind": target.kind}, "lr_scale": scale, "onset_step": inc.onset_step}
    reason = f"{why}; rolling back to stable checkpoint {target.step} ({target.kind}) with lr_scale {scale:g}"
    st.move(trigger, reason, ev, now)
    s.lr_scale = scale
    s.incident = replace(inc, rollback_to=target.step)
    st.send(CommandType.ROLLBACK, args, now, reason)


