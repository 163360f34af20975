"""The loss-spike rule's statistics as the controller stored them (for the dashboard's loss bands).

``controller.batch`` writes, on the ``step_metrics`` row of every loss the rule judged, the healthy
window's median and σ just before that loss and the verdict's level, and on the run the rule's
settings (``runs.spike_rule``: window, k_warn, k_crit, ...). Reading them back gives the bands of
the rule that actually decided, never a second run of it. Rows written before these columns
existed (migration 0002) have none: the reader then returns no points for them and no rule.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from cliffguard.controller.store.models import RunRow, StepMetricRow

STAT_COLUMNS = ["step", "ts", "median", "sigma", "level"]


@dataclass(frozen=True, slots=True)
class SpikeRuleStats:
    rule: dict[str, Any] | None = None
    """The rule's settings the run was judged with (``k_warn``, ``k_crit``, ``window``, ...); None
    when the controller stored none."""
    points: list[dict[str, Any]] = field(default_factory=list)
    """One dict per judged loss (keys ``STAT_COLUMNS``), newest ``max_points``, in write order."""


def spike_rule_stats(session: Session, run_id: str, max_points: int) -> SpikeRuleStats:
    """The stored spike-rule statistics of ``run_id``: its newest ``max_points`` judged losses."""
    rule = session.scalar(select(RunRow.spike_rule).where(RunRow.id == run_id))
    sm = StepMetricRow
    rows = session.execute(
        select(sm.step, sm.ts, sm.rule_median, sm.rule_sigma, sm.rule_level)
        .where(sm.run_id == run_id, sm.rule_level.is_not(None))
        .order_by(sm.ts.desc(), sm.id.desc())
        .limit(max_points)
    ).all()
    return SpikeRuleStats(rule=rule, points=[dict(zip(STAT_COLUMNS, r, strict=True)) for r in reversed(rows)])
