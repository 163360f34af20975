"""What an alert says: the spec a caller enqueues and the message we render (its levels and
trigger/resolve are the shared vocabulary of core/enums.py).

``AlertSpec`` is what the controller (or anything else) hands to ``enqueue_alert``; the stored
``AlertRow`` is the durable copy; ``AlertMessage`` is the immutable view of that row the pure
formatters render, so they never touch a session.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cliffguard.core.enums import AlertAction, AlertLevel


@dataclass(frozen=True, slots=True)
class AlertSpec:
    rule: str
    """Rule or source name (loss_spike, divergence, recovery, ...); dedup is per (run, rule)."""
    level: AlertLevel | str
    title: str
    """One line; Slack's header and PagerDuty's summary."""
    body: str = ""
    run_id: str | None = None
    incident_id: str | None = None
    """The incident this alert belongs to; PagerDuty's dedup key, so a resolve closes its trigger."""
    action: AlertAction | str = AlertAction.TRIGGER
    evidence: dict[str, Any] = field(default_factory=dict)
    """Window stats, verdict, validation numbers: sent with the alert and stored."""

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "level", AlertLevel(self.level))
        except ValueError:
            raise ValueError(f"level: must be one of info, warn, critical, got {self.level!r}") from None
        try:
            object.__setattr__(self, "action", AlertAction(self.action))
        except ValueError:
            raise ValueError(f"action: must be trigger or resolve, got {self.action!r}") from None
        if not self.rule or len(self.rule) > 64:
            raise ValueError("rule: must be 1..64 characters")
        if not self.title.strip():
            raise ValueError("title: must not be empty")


@dataclass(frozen=True, slots=True)
class AlertMessage:
    """A stored alert as the formatters see it (built from an ``AlertRow``)."""

    id: str
    ts: float
    rule: str
    level: AlertLevel
    title: str
    body: str
    run_id: str | None
    incident_id: str | None
    action: AlertAction
    evidence: dict[str, Any]

    @classmethod
    def from_row(cls, row: Any) -> AlertMessage:
        return cls(
            id=row.id,
            ts=row.ts,
            rule=row.rule,
            level=AlertLevel(row.level),
            title=row.title,
            body=row.body or "",
            run_id=row.run_id,
            incident_id=row.incident_id,
            action=AlertAction(row.action),
            evidence=dict(row.evidence or {}),
        )
