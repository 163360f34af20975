"""The anchors ``bench.detection`` scores beside the controller's rules: other projects' spike rules.

Each is written out from its source, on one curve's logged losses in order (a grad norm, where
logged, is not used: the anchors are loss rules), and reports one act per excursion — the first
flagged point of a run of consecutive flagged points, as the controller's rules report one
critical per excursion — so the counts compare.

- ``seed``: this project's first spike rule (DESIGN.md §5): median + 5σ over the newest 100
  healthy losses (σ = 1.4826·MAD, at least 1% of the median), points at or above 3σ kept out of
  the window, 20 points before it decides, a non-finite loss critical at once.
- ``olmo``: OLMo-core's ``StabilityMonitorCallback`` (``olmo_core/train/callbacks/stability_monitor.py``):
  a loss above mean + 6·std (population std) of the previous 128 losses, every loss entering the
  window, nothing before the window is full. A NaN compares false, so it is not flagged.
- ``foundry``: llm-foundry's ``KillLossSpike`` (``llmfoundry/callbacks/kill_loss_spike_callback.py``):
  a loss at or above 2× the mean of the previous 100 (every loss enters, nothing before the
  window is full) is an outlier; more than ``patience`` (4) consecutive outliers are a spike. Its
  second test (half the window above ``loss_cap`` 10) is left out: it is a cap on the loss's
  scale, not a spike rule, and a summed loss of 50 would trip it from the start.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Callable, Sequence

from cliffguard.controller.backtest import BacktestEvent
from cliffguard.core.enums import Level

Points = Sequence[tuple[int, float]]


def _act(step: int, ref: float | None, what: str, sigma: float | None = None) -> BacktestEvent:
    """An act as the scorer reads it: critical, with the reference its rollback proxy compares to
    and, where the rule has one, its σ (the proxy's noise band: ``controller.backtest.outcomes``)."""
    return BacktestEvent(
        step=step,
        level=Level.CRITICAL,
        rule="anchor",
        rule_level="critical",
        action="recover",
        onset_step=step,
        rank=None,
        message=what,
        evidence={"median": ref} if sigma is None else {"median": ref, "sigma": sigma},
    )


def seed(points: Points, norms: Sequence[float] | None = None) -> list[BacktestEvent]:
    window: deque[float] = deque(maxlen=100)
    out: list[BacktestEvent] = []
    flagged = False
    for step, x in points:
        if not math.isfinite(x):
            if not flagged:
                out.append(_act(step, statistics.median(window) if window else None, "non-finite loss"))
            flagged = True
            continue
        if len(window) < 20:
            window.append(x)
            flagged = False
            continue
        med = statistics.median(window)
        sigma = max(1.4826 * statistics.median(abs(v - med) for v in window), 0.01 * abs(med), 1e-12)
        k = (x - med) / sigma
        if k >= 5 and not flagged:
            out.append(_act(step, med, f"{k:.1f}σ above the median", sigma))
        flagged = k >= 5
        if k < 3:
            window.append(x)
    return out


def olmo(points: Points, norms: Sequence[float] | None = None) -> list[BacktestEvent]:
    window: deque[float] = deque(maxlen=128)
    out: list[BacktestEvent] = []
    flagged = False
    for step, x in points:
        spike = False
        if len(window) == window.maxlen:
            mean = sum(window) / len(window)
            std = math.sqrt(sum((v - mean) ** 2 for v in window) / len(window))
            spike = std >= 1e-10 and x > mean + 6 * std
            if spike and not flagged:
                out.append(_act(step, mean, "above mean + 6 std of the previous 128", std))
        flagged = spike
        window.append(x)
    return out


def foundry(points: Points, norms: Sequence[float] | None = None) -> list[BacktestEvent]:
    window: deque[float] = deque(maxlen=100)
    out: list[BacktestEvent] = []
    outliers = 0
    for step, x in points:
        if len(window) == window.maxlen:
            mean = sum(window) / len(window)
            if x >= 2 * mean:
                outliers += 1
                if outliers == 5:  # "> patience" (4) consecutive outliers
                    out.append(
                        _act(step, mean, "5 consecutive losses at or above 2x the mean of the previous 100")
                    )
            else:
                outliers = 0
        window.append(x)
    return out


ANCHORS: dict[str, Callable[[Points, Sequence[float] | None], list[BacktestEvent]]] = {
    "seed median+5σ/100": seed,
    "OLMo-core mean+6σ/128": olmo,
    "llm-foundry 2×mean/patience 4": foundry,
}
