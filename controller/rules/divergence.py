"""Divergence: a sustained rise that no single point makes obvious (pure, no I/O).

Three tests, run together by default (``method = "all"``):

* ``cusum`` — a one-sided CUSUM of standardized residuals against the spike rule's healthy
  window: ``S = max(0, S + min(z, z_clip) - drift)``, alarm when ``S >= threshold``. Clipping
  ``z`` keeps one +70% outlier from contributing more than ``z_clip - drift``; the drift
  allowance makes a flat or falling curve pull ``S`` back to zero. The estimated onset is the
  step at which ``S`` last left zero (the classical CUSUM change-point estimate), moved
  ``onset_margin`` steps earlier. It needs the spike window, so it starts after ``grace_steps``.
* ``runmin`` — the log of the median of the newest ``smooth_steps`` steps of losses (at least 3
  points) against its running minimum since the start of the curve; alarm when the rise is at
  least ``log(1 + rise)`` *and* ``rise_k`` times the noise of that median (from the spike
  window's relative σ, once there is one). It needs no history, so it sees an upward turn right
  after warm-up; the running minimum makes a slow drift accumulate. Its onset is the middle of
  the smoothing window at the minimum: the last place the curve was healthy, where a rollback
  should land.
* ``shift`` — the same smoothed log loss against the spike window's median: alarm when it is
  ``log(1 + shift_rise)`` *and* ``shift_k`` standard errors above it. This is a level shift (a
  burst of elevated points) that no single point makes a spike, on a plateau where the running
  minimum is far below. Its onset is the first point of the smoothing window at least half that
  rise above the median.

See ``DivergenceConfig`` for the defaults and the figures behind them.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from cliffguard.core.declared import bounded, check_declared, one_of
from cliffguard.core.sliding import SlidingWindow, sorted_median, sorted_robust

METHODS = ("cusum", "runmin", "all")
MEDIAN_NOISE = 1.2533
"""Standard error of a median of m Gaussian points, in units of σ/√m."""


@dataclass(kw_only=True, slots=True)
class DivergenceConfig:
    """Defaults chosen on the labelled suite (``synthetic.suite``; divergences climb at 1-2.5σ of
    lag behind a 100-step median, so the spike rule alone catches none of them).

    ``suite(20, 8, seed=1)``, 120k steps, σ floor 0.01: cusum drift 0.5 threshold 20/40/80 ->
    divergence recall 1.00/1.00/0.875, median delay 68/86/128 steps, 0 false criticals; drift 1.0
    -> recall 0.75/0.625/0.625. runmin threshold 3/5/8 σ -> recall 1.00/0.75/0.625, delay
    170/220/342 steps. CUSUM wins (same recall, half the delay).

    ``suite(40, 10, seed=3, length=3000)``, 270k steps, with the whole controller rule set: the
    spike rule's σ floor (1% of the median) hid one divergence on a 0.57%-noise curve (recall 0.9);
    a 0.2% floor here -> recall 1.00, median delay 101 steps. One warmup bump (step ~290) then
    tripped it; ``grace_steps`` 300 -> recall 1.00, delay 101, 0 false criticals (0/40 clean curves,
    0/731 outliers). Largest CUSUM on 40 other clean 3000-step curves: 14.9 (threshold 40 leaves
    a 2.7x margin); the threshold 60 costs 30 steps of delay for no measured gain.

    Held out, all defaults (``python -m tests.controller.synthetic --seed 11``: 40 clean + 50
    injected 3000-step curves, 270k steps, 788 benign outliers): recall 1.00 for every kind,
    divergence median delay 85.5 steps, 0 false criticals, 0 outliers called critical.

    The ``runmin`` and ``shift`` tests were added for real curves (``bench/detection.py``, a dev
    set of 25 public curves): with the CUSUM alone recall was 6/11 — of its 3 early divergences
    (an upward turn 10-50 steps after the minimum, logged every 10 steps) one was missed, one
    caught only at its blow-up 170 steps in, and 3 of its 4 plateau bursts were missed.
    With all three: 11/11 windows, early divergences caught 40-90 steps after onset, bursts 0-2
    points after. ``shift_k`` 2/4/6 -> 0.91/0.68/0.68 criticals per 10k negative points at the same
    recall; without the noise bars (``shift_k = rise_k = 0``) a 6%-noise healthy curve alarms.
    Held out synthetic figures above are unchanged (recall 1.00, divergence delay 85.5 steps)."""

    enabled: bool = True
    """Run the rule at all."""
    method: str = one_of("all", METHODS)
    """``cusum``, ``runmin`` or ``all`` (cusum, runmin and shift; see the module docstring)."""
    drift: float = bounded(0.5, ge=0)
    """CUSUM allowance per step, in σ: residuals below it pull the sum down."""
    threshold: float = bounded(40.0, gt=0)
    """CUSUM: alarm when the sum reaches this many σ·points."""
    z_clip: float = 3.0
    """CUSUM: a residual counts at most this many σ, so single outliers cannot trip it."""
    smooth: int = bounded(50, ge=3)
    """runmin: most losses in the running median compared with its minimum."""
    smooth_steps: int = bounded(50, ge=1)
    """runmin: steps of losses in that median (at least 3 points, at most ``smooth``)."""
    rise: float = bounded(0.08, gt=0)
    """runmin: relative rise of the smoothed loss over its minimum that alarms..."""
    rise_k: float = bounded(6.0, ge=0)
    """...if it is also this many standard errors of the smoothed loss (the running minimum of a
    noisy series sits several standard errors below its mean, hence a high bar)."""
    shift_rise: float = bounded(0.08, gt=0)
    """shift: relative rise of the smoothed loss over the spike window's median that alarms..."""
    shift_k: float = bounded(4.0, ge=0)
    """...if it is also this many standard errors of the smoothed loss."""
    sigma_floor_rel: float = bounded(0.002, ge=0, lt=1)
    """σ floor relative to the median for the residuals (lower than the spike rule's: a CUSUM
    needs a sustained rise, so it can afford to see small σ on quiet curves)."""
    onset_margin: int = bounded(50, ge=0)
    """Steps subtracted from the estimated onset. CUSUM starts counting when the residuals
    already lean up: on ``suite(0, 8, seed=11, length=3000)`` its start lagged the true onset by
    3-45 steps (median 23), and a rollback target must not be inside the excursion."""
    confirm_points: int = bounded(3, ge=1)
    """runmin and shift: a test fires only when it held at this many of the newest
    ``2 × confirm_points - 1`` logged points (1 = at once). Measured on the development set
    (``bench.detection``): 1 -> 6 false criticals on its noisy batch-8 negative (a 3-point smoothed
    median against its running minimum over 3,200 points crosses a fixed noise bar by chance), 3 ->
    1, the same recall. A divergence that is real holds; a crossing by chance is a point or two."""
    grace_steps: int = bounded(300, ge=0)
    """Steps at the start of a run the rule ignores: warmup bumps are normal there (spikes and
    non-finite losses are still caught by the spike rule from its ``min_history`` on)."""

    def __post_init__(self) -> None:
        check_declared(self)
        if self.z_clip <= self.drift:
            raise ValueError("z_clip: must be > drift")


@dataclass(frozen=True, slots=True)
class DivergenceVerdict:
    fired: bool
    statistic: float
    """CUSUM sum (σ·points), or the log rise over the running minimum."""
    onset_step: int | None
    test: str = ""
    """Which test fired (``cusum``, ``runmin`` or ``shift``), empty when none did."""

    def evidence(self) -> dict[str, Any]:
        return {"statistic": self.statistic, "onset_step": self.onset_step, "test": self.test}


class DivergenceDetector:
    """Feed ``observe(step, loss, median, sigma, interval)`` with the spike window's healthy stats
    and the logging interval in steps."""

    def __init__(self, config: DivergenceConfig | None = None) -> None:
        self.config = config or DivergenceConfig()
        self._sum = 0.0
        self._start: int | None = None  # first step of the current positive CUSUM run
        self._recent: deque[tuple[int, float]] = deque(maxlen=self.config.smooth)  # (step, log loss)
        self._logs = SlidingWindow(self.config.smooth)  # the same log losses, kept sorted as they slide
        # smoothed level (at a span) and noise of _recent as it is now, until the next push
        self._smooth_at: tuple[int, float] | None = None
        self._mad_diffs: float | None = None
        self._min: float | None = None
        self._min_step: int | None = None
        self._span_at: tuple[float, int] = (math.nan, 0)  # (interval, _span of it), cached
        # whether the runmin and shift tests held at the newest points (bit 0 the newest): a test
        # fires when it holds now and at confirm_points of the newest 2 * confirm_points - 1
        self._held_run = self._held_shift = 0
        self._held_mask = (1 << (2 * self.config.confirm_points - 1)) - 1

    def reset(self) -> None:
        """Forget everything (after a rollback)."""
        self.reset_cusum()
        self._held_run = self._held_shift = 0
        self._recent.clear()
        self._logs.clear()
        self._smooth_at = self._mad_diffs = None
        self._min = None
        self._min_step = None

    @property
    def cusum_sum(self) -> float:
        return self._sum

    def reset_cusum(self) -> None:
        """Forget the CUSUM's excursion (a reported spike is being dealt with)."""
        self._sum = 0.0
        self._start = None

    def rebaseline(self) -> None:
        """Take the current smoothed level as the running minimum: a reported rise that persisted
        is the new normal, and only a further rise alarms again."""
        if self._recent:
            self._min, self._min_step = self._smoothed(len(self._recent)), self._recent[-1][0]

    def _smoothed(self, m: int) -> float:
        at = self._smooth_at
        if at is None or at[0] != m:  # the run-minimum and shift tests ask for the same one per point
            logs = self._logs
            if logs.span != m:
                logs.set_span(m)
            at = self._smooth_at = (m, sorted_median(logs.tail()))
        return at[1]

    def observe(self, step: int, loss: float, med: float | None, sigma: float | None,
                interval: float = 1.0) -> DivergenceVerdict:
        test, statistic, onset = self._judge(step, loss, med, sigma, interval)
        return DivergenceVerdict(bool(test), statistic, onset, test)

    def fired(self, step: int, loss: float, med: float | None, sigma: float | None,
              interval: float = 1.0) -> DivergenceVerdict | None:
        """``observe``, returning only a verdict that fired (None otherwise, and no verdict built)."""
        test, statistic, onset = self._judge(step, loss, med, sigma, interval)
        return DivergenceVerdict(True, statistic, onset, test) if test else None

    def _judge(self, step: int, loss: float, med: float | None, sigma: float | None,
               interval: float) -> tuple[str, float, int | None]:
        """(test that fired or "", statistic, onset_step): the three tests, written out in one
        function as they run for every point (see the module docstring for each)."""
        cfg = self.config
        if not cfg.enabled or not math.isfinite(loss):
            return "", self._sum, None
        method = cfg.method
        at = self._span_at
        m = at[1] if interval == at[0] else self._span(interval)  # points in the smoothed loss
        # the log tests need a positive loss (a loss that can go negative is judged by the CUSUM)
        positive = loss > 0
        run: tuple[str, float, int | None] | None = None
        smoothed = 0.0
        if positive and method != "cusum":  # runmin
            self._push(step, math.log(loss))
            recent = self._recent
            if len(recent) < m:
                run = "", 0.0, None
            else:
                smoothed = self._smoothed(m)
                if self._min is None or smoothed < self._min:  # the step in the middle of the newest m
                    self._min, self._min_step = smoothed, recent[len(recent) - m + m // 2][0]
                rise = smoothed - self._min
                # at or above max(rise bar, noise bar): the noise is worked out only past the first
                held = rise >= math.log1p(cfg.rise) and rise >= cfg.rise_k * self._noise(m)
                bits = self._held_run = ((self._held_run << 1) | held) & self._held_mask  # _confirmed, inlined
                fired = held and bits.bit_count() >= cfg.confirm_points
                run = "runmin" if fired else "", rise, self._min_step
        cus: tuple[str, float, int | None] | None = None
        if method != "runmin":  # cusum
            if med is None or sigma is None or step < cfg.grace_steps:
                cus = "", self._sum, None
            else:
                z = (loss - med) / sigma
                if cfg.z_clip < z:  # min(z, z_clip), as min would pick it
                    z = cfg.z_clip
                new = self._sum + z - cfg.drift
                if not new > 0.0:  # max(0.0, new), as max would pick it
                    new = 0.0
                if new > 0 and self._sum == 0:
                    self._start = step
                elif new == 0:
                    self._start = None
                self._sum = new
                onset = None if self._start is None else max(0, self._start - cfg.onset_margin)
                cus = "cusum" if new >= cfg.threshold else "", new, onset
        shift: tuple[str, float, int | None] | None = None
        if positive and method == "all" and med is not None and med > 0 and len(self._recent) >= m:  # shift
            log_med = math.log(med)
            rise = smoothed - log_med  # the runmin test's: it ran (method "all") on as many points
            # at or above max(rise bar, noise bar): the noise is worked out only past the first
            held = rise >= math.log1p(cfg.shift_rise) and rise >= cfg.shift_k * self._noise(m)
            bits = self._held_shift = ((self._held_shift << 1) | held) & self._held_mask
            if held and bits.bit_count() >= cfg.confirm_points:
                # the first point of the burst: above the median by at least half the smoothed rise
                # (over the smoothing window and the points its confirmation took)
                back = m + 2 * (cfg.confirm_points - 1)
                onset = next((s for s, x in list(self._recent)[-back:] if x >= log_med + rise / 2), step)
                shift = "shift", rise, onset
        if run is not None and run[0]:  # (the CUSUM above still ran: it keeps a sum)
            return run
        if shift is not None:
            return shift
        if cus is not None:
            return cus
        return run or ("", 0.0, None)

    def _span(self, interval: float) -> int:
        at = self._span_at
        if interval != at[0]:  # the interval rarely changes: asked twice per point
            cfg = self.config
            at = self._span_at = (interval, min(cfg.smooth, max(3, int(round(cfg.smooth_steps / max(interval, 1e-9))))))
        return at[1]

    def _noise(self, m: int) -> float:
        """Standard error of the median of ``m`` log losses, from the point-to-point noise of the
        recent ones (1.4826·MAD of successive differences / √2): unlike the window's σ it is not
        inflated by a trend or by the very level shifts it is used to judge."""
        recent = self._recent
        if len(recent) < 3:
            return 0.0
        if self._mad_diffs is None:  # asked only when a rise is large enough for the noise to matter
            diffs = [b - a for (_, a), (_, b) in pairwise(recent)]  # as a sliding window would hold them
            self._mad_diffs = sorted_robust(sorted(diffs))[1]
        return MEDIAN_NOISE * self._mad_diffs / math.sqrt(2) / math.sqrt(m)

    def _push(self, step: int, x: float) -> None:
        self._recent.append((step, x))
        self._logs.append(x)
        self._smooth_at = self._mad_diffs = None

    def state_dict(self) -> dict[str, Any]:
        return {
            "sum": self._sum,
            "start": self._start,
            "recent": [[s, x] for s, x in self._recent],
            "min": self._min,
            "min_step": self._min_step,
            "held": [self._held_run, self._held_shift],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._sum = float(state["sum"])
        self._start = state.get("start")
        recent = [r for r in state.get("recent", []) if isinstance(r, list | tuple)]  # old states held bare losses
        self._recent = deque(maxlen=self.config.smooth)
        self._logs.clear()
        for s, x in recent:
            self._push(int(s), float(x))
        self._min = state.get("min")
        self._min_step = state.get("min_step")
        held = state.get("held", [0, 0])
        self._held_run, self._held_shift = int(held[0]), int(held[1])
