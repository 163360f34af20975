"""The spike rule's settings: the deployment's ``[spike]``, shared by the guard and the controller.

Every default below says what it was measured on: the development set of 33 public curves
(``python -m bench.detection --curves DIR``: 15 labelled windows, 49,029 points of healthy
negatives, 54,831 of heavy-tailed hard negatives, 7 curves of one-step data outliers) and the
labelled synthetic suite (``python -m tests.controller.synthetic --seed 11``). How the rule uses
them: ``core/spike.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from cliffguard.core.declared import bounded, check_declared

MOVED_NOTE = "[spike] budget (confirmation counts evidence in points now: docs/detection.md)"


@dataclass(kw_only=True, slots=True)
class SpikeConfig:
    """The spike rule's settings (the deployment's ``[spike]``; figures in ``docs/detection.md``)."""

    window: int = bounded(100, ge=8)
    """Healthy losses kept for the median and σ."""
    k_warn: float = 3.0
    """σ above the median that warns; only a point this far up can count as evidence. 2.5/3/3.5 ->
    recall 14/15, 14/15, 13/15 at the same criticals on negatives."""
    k_crit: float = 5.0
    """σ above the median a point must reach to be critical on its own evidence alone (the
    dashboard's critical band); a point with other evidence in the window needs only ``k_warn``.
    Before a curve's own tail is fitted, ``k_warn`` and ``k_crit`` σ are also where the prior
    puts the ``evidence_p`` and the budget's quantiles (the seed rule's calibration). 4/5/6 ->
    recall 14/15, 14/15, 13/15 at 0.82/0.41/0.41 criticals per 10k negative points."""
    min_history: int = 20
    """Healthy points before the rule judges by median and σ (before: the cold-start rule)."""
    sigma_floor_rel: float = bounded(0.01, ge=0, lt=1)
    """σ is at least this fraction of the median, so a flat curve does not alarm on noise."""
    window_steps: int = bounded(200, ge=0)
    """Take the median of the healthy points of the newest this-many steps only (0 = the whole
    window), at least ``min_history`` points, so a curve logged every 10 steps is judged on the
    same stretch of training as a per-step one; σ always uses the whole window's differences.
    0/100/200/400 -> recall 13/15, 14/15, 14/15, 13/15."""
    budget: float = bounded(1.0, gt=0, le=1000)
    """False criticals per 10,000 logged points the controller's threshold is set for, from each
    curve's own residuals: the knob of the trade-off (``cliffguard backtest DIR --sweep
    budget=0.3,1,3``; the table is in ``docs/detection.md``). At 1: 0.41 criticals per 10k
    negative points and 1.1 per 10k hard-negative ones on the development set."""
    guard_budget: float = bounded(10.0, gt=0, le=1000)
    """The same for the in-process guard, which skips one update rather than pausing the run:
    a skipped batch is cheap, a pause is not, so it may act ten times as often."""
    evidence_points: int = bounded(10, ge=1, le=1000)
    """Logged points over which evidence adds up (a bump of about this many points with quiet
    points inside is one excursion). 5/10/20 -> recall 13/15, 14/15, 14/15 at 0.20/0.41/0.61
    criticals per 10k negative points and 0.73/1.09/2.55 per 10k hard-negative ones."""
    evidence_p: float = bounded(0.01, gt=0, le=0.05, why="the tail model covers the top 5% of points")
    """Tail probability below which a point counts as evidence (the truncation of the truncated
    product). 0.005/0.01/0.02 -> the same recall and negatives; 0.05 -> recall 13/15."""
    cold_rise: float = bounded(0.5, gt=0)
    """Cold start: rise over the median of the healthy points so far at which a point counts as evidence..."""
    cold_points: int = bounded(4, ge=1)
    """...and how many such points among the newest ``evidence_points`` are critical. A warm-up
    blow-up (17 -> 58 in 40 steps) has ten such points; the step-2 bumps of four healthy runs
    have one to three: 3 pauses one of them at step 5 (a false critical), 4 and 5 none. cold_rise
    0.3 does the same; 0.5 and 1.0 not."""

    MOVED: ClassVar[dict[str, str]] = {
        "patience": MOVED_NOTE,
        "guard_patience": "[spike] guard_budget",
        "k_extreme": MOVED_NOTE,
        "jump_extreme": MOVED_NOTE,
    }

    def __post_init__(self) -> None:
        check_declared(self)
        if not 0 < self.k_warn <= self.k_crit:
            raise ValueError("k_warn: must be > 0 and <= k_crit")
        if not 2 <= self.min_history <= self.window:
            raise ValueError("min_history: must be between 2 and window")
        if self.cold_points > self.evidence_points:
            raise ValueError("cold_points: must be <= evidence_points")
        if not self.budget / 1e4 < self.evidence_p or not self.guard_budget / 1e4 < self.evidence_p:
            raise ValueError(
                "budget: a budget per point must be below evidence_p (or every evidence point is "
                "critical and the prior says nothing)"
            )
