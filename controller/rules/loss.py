"""The controller's loss rules over one run's global loss: spike, divergence, non-finite (pure).

One loss per step (the caller picks the rank), and the step's grad norm where the trainer logs
one (the spike rule weighs it beside the loss: ``core/norm_evidence.py``). Verdicts are reported
once per excursion and level — the excursion starts at the first point at or above ``k_warn``
and ends at the first point back below it — so a 20-step spike produces one warn and one
critical, not twenty alerts; a critical's ``onset_step`` is the first point of its evidence,
which may be before a quiet point inside the bump. Both critical loss verdicts and non-finite
losses ask for recovery.

Steps going backwards (the trainer rolled back and replays) call ``rewind``: the excursion and
the CUSUM are reset, the healthy window is kept (it holds only pre-excursion points, which is the
right baseline for the replayed steps) and the replayed steps are judged afresh.

A level shift that persists for ``rebaseline_after`` steps after being reported is accepted as
the new normal (the window is refilled from it); otherwise the window, which never takes a
spike point, would stay critical forever after an operator chose to resume. A reported divergence
likewise becomes the divergence rule's new baseline after ``rebaseline_after`` steps.

Windows are counted in steps: ``StepCadence`` infers the logging interval from the step numbers,
and the spike rule's window and the divergence rule's smoothing follow it, so a curve logged
every 10 or 50 steps, or sampled at irregular gaps, is judged on the same stretch of training as
a per-step one. Evidence is counted in points: a point of a sparse log weighs as one point.
"""

from __future__ import annotations

import copy
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from cliffguard.controller.rules.base import STEP_EVENTS, RankScope
from cliffguard.controller.rules.cadence import StepCadence
from cliffguard.controller.rules.divergence import DivergenceConfig, DivergenceDetector
from cliffguard.controller.verdict import Action, Verdict
from cliffguard.core.declared import bounded, check_declared
from cliffguard.core.enums import Level
from cliffguard.core.events import Event
from cliffguard.core.spike import SpikeConfig, SpikeDetector
from cliffguard.core.triage import CURED_IN_PROCESS

# An enum member read through its class costs ~10x a module global (the enum's metaclass):
# the per-point paths below use these.
_OK, _CRITICAL = Level.OK, Level.CRITICAL


@dataclass(kw_only=True, slots=True)
class LossSpikeConfig(SpikeConfig):
    """The spike rule (the deployment's ``[spike]``, ``core/spike.py``) plus the controller's
    re-baselining."""

    rebaseline_after: int = bounded(200, ge=0)
    """Steps a reported excursion may last before it becomes the new baseline (0 = never)."""

    def __post_init__(self) -> None:
        super(LossSpikeConfig, self).__post_init__()
        check_declared(self)  # after the base's checks, as before: its fields first


@dataclass(slots=True)
class LossPoint:
    """What the spike rule knew when it judged one loss: the healthy window's median and σ just
    before it (None while warming up) and its verdict. The dashboard draws its bands from these
    (stored per step by ``controller.batch``): median + k_warn·σ and median + k_crit·σ.
    Not to be changed once made; not frozen only because one is made per loss, and a frozen
    dataclass costs about three times as much to build."""

    step: int
    median: float | None
    sigma: float | None
    level: Level


@dataclass(slots=True)
class _Excursion:
    onset: int
    level: Level = Level.OK
    points: list[float] = field(default_factory=list)


MARKS_KEEP = 16
"""Checkpoint boundaries whose rule state is kept for a rollback (the controller keeps fewer targets)."""


class LossRules:
    name = "loss"
    consumes = STEP_EVENTS
    scope = RankScope.LOSS_RANK

    def __init__(self, spike: LossSpikeConfig | None = None, divergence: DivergenceConfig | None = None,
                 last_n: int = 20) -> None:
        self.spike_config = spike or LossSpikeConfig()
        self.spike = SpikeDetector(self.spike_config)
        self.divergence = DivergenceDetector(divergence)
        self.cadence = StepCadence()
        self._exc: _Excursion | None = None
        self._diverging: int | None = None  # step at which the reported divergence was reported
        self._recent: deque[tuple[int, float]] = deque(maxlen=last_n)
        self.last_point: LossPoint | None = None
        """The newest loss judged (a new object per loss; not state: it only says what just happened)."""
        self._marks: dict[int, dict[str, Any]] = {}
        """Checkpoint step -> what these rules knew at that boundary (in memory only; ``mark``)."""

    def mark(self, step: int, last_judged: int | None) -> None:
        """A checkpoint labelled ``step`` (the state before step ``step`` ran), seen at that boundary:
        keep what the rules know now, so a rollback to it judges the replayed steps against the
        window they were first judged against, not one holding the abandoned timeline's later, lower
        losses (an SDC rollback 100 steps back replayed step 113 as a 3.7σ spike). In memory only: a
        controller started afresh rewinds as before."""
        if last_judged is not None and step != last_judged + 1:
            return  # a disk save reported after later steps were judged: not this boundary's state
        self._marks[step] = copy.deepcopy(self.state_dict())
        while len(self._marks) > MARKS_KEEP:
            del self._marks[min(self._marks)]

    def restore_mark(self, step: int) -> None:
        """Before replaying from ``step``: the newest mark at or before it, if any (newer ones are of
        the abandoned timeline and are dropped)."""
        for s in [s for s in self._marks if s > step]:
            del self._marks[s]
        if self._marks:
            self.load_state_dict(copy.deepcopy(self._marks[max(self._marks)]))

    def rewind(self) -> None:
        self._exc = None
        self._diverging = None
        self.spike.restart_excursion()
        self.divergence.reset()

    def rebaseline(self) -> list[Verdict]:
        """After an elastic scale change: the spike window and the divergence baseline start afresh
        (the spike rule judges again after ``min_history`` points at the new batch)."""
        self._exc = None
        self._diverging = None
        self.spike = SpikeDetector(self.spike_config)
        self.divergence.reset()
        return []

    def observe(self, step: int, loss: float, grad_norm: float | None = None) -> list[Verdict]:
        """Judge one global loss (and the step's grad norm, where the trainer logs one)."""
        spike, cfg, cadence = self.spike, self.spike_config, self.cadence
        self._recent.append((step, loss))
        cadence.observe(step)
        interval = cadence.interval
        level, median, sigma, sigmas, reason = judged = spike.judge(loss, interval, grad_norm)
        if level is not _OK and not math.isfinite(loss) and len(spike) >= cfg.min_history:
            # A non-finite loss is judged without the window's statistics, but they held all the
            # same (it never enters the window), so its point still carries the band it broke through.
            median, sigma = spike.stats()  # type: ignore[misc]  # >= min_history >= 2 points
        self.last_point = LossPoint(step, median, sigma, level)
        out: list[Verdict] = []
        if level is _OK:
            self._exc = None
        else:
            self._spiked(step, loss, judged, out)
        exc = self._exc
        if exc is not None and exc.level is _CRITICAL:
            # A reported spike is being dealt with; its points would only re-report it as a "divergence".
            self.divergence.reset_cusum()
            return out
        divergence = self.divergence
        if len(spike) >= cfg.min_history:
            med, sig = spike.spread_stats(divergence.config.sigma_floor_rel, interval)  # type: ignore[misc]
            dv = divergence.fired(step, loss, med, sig, interval)
        else:
            dv = divergence.fired(step, loss, None, None, interval)
        if dv is not None and self._diverging is None:
            self._diverging = step
            what = {"cusum": f"CUSUM {dv.statistic:.0f}",
                    "runmin": f"smoothed loss {math.expm1(dv.statistic):+.0%} over its running minimum",
                    "shift": f"smoothed loss {math.expm1(dv.statistic):+.0%} over the window median"}[dv.test]
            out.append(Verdict(
                rule="divergence", level=Level.CRITICAL, step=step, onset_step=dv.onset_step,
                action=Action.RECOVER, evidence={**self.window_evidence(), **dv.evidence()},
                message=f"loss has been rising since step {dv.onset_step} ({what})"))
        elif self._diverging is not None:
            reb = cfg.rebaseline_after
            if dv is None and divergence.cusum_sum == 0:
                self._diverging = None  # back to normal: the next rise is a new divergence
            elif reb and step - self._diverging >= reb:
                # still up after rebaseline_after steps: the new normal; only a further rise alarms
                divergence.rebaseline()
                divergence.reset_cusum()
                self._diverging = None
        return out

    def _spiked(self, step: int, loss: float, judged: tuple[Level, float | None, float | None, float | None, str],
                out: list[Verdict]) -> None:
        """A loss at or above k_warn, or non-finite: the excursion goes on, reported once per level,
        and becomes the new baseline after ``rebaseline_after`` steps."""
        level, median, sigma, sigmas, reason = judged
        exc = self._exc = self._exc or _Excursion(onset=step)
        exc.points.append(loss)
        if level is _CRITICAL and exc.level is not _CRITICAL or exc.level is _OK:
            v = self.spike.verdict(level, loss, median, sigma, sigmas, reason)  # only for a report
            exc.level = v.level
            nonfinite = not math.isfinite(loss)
            onset = exc.onset
            if v.level is Level.CRITICAL and v.onset_back < len(self._recent):
                # the evidence may have begun before a quiet point that ended the warn excursion
                onset = min(onset, self._recent[-1 - v.onset_back][0])
            out.append(Verdict(
                rule="nonfinite" if nonfinite else "loss_spike", level=v.level, step=step,
                onset_step=onset, evidence={**self.window_evidence(), **v.evidence()},
                action=Action.RECOVER if v.level is Level.CRITICAL else Action.ALERT,
                message=(f"loss is {loss}" if nonfinite else
                         f"loss {loss:.4g}: {v.reason}" if v.sigmas is None or v.median is None else
                         f"loss {loss:.4g} is {v.sigmas:.1f}σ above the median {v.median:.4g}")))
        reb = self.spike_config.rebaseline_after
        if reb and exc.level is not Level.OK and step - exc.onset >= reb:
            finite = [x for x in exc.points if math.isfinite(x)][-self.spike_config.window:]
            if len(finite) >= self.spike_config.min_history:
                self.spike.rebase(finite)
                self._exc = None
                self.divergence.reset()

    def window_evidence(self) -> dict[str, Any]:
        stats = self.spike.stats(interval=self.cadence.interval)
        return {
            "median": stats[0] if stats else None,
            "sigma": stats[1] if stats else None,
            "n": len(self.spike),
            "last": [[s, x] for s, x in self._recent],
        }

    def on_event(self, event: Event) -> list[Verdict]:
        data = event.data
        if data.get("triaged") in CURED_IN_PROCESS:
            return []  # the kit re-ran it and cured it (a bad batch, a transient fault): not the curve's point
        norm = data.get("grad_norm")
        # a skipped step's norm (an fp16 overflow the scaler handled) is the loss-scale rule's
        return self.observe(event.step, float(data["loss"]),
                            None if norm is None or data.get("skipped") else float(norm))

    def state_dict(self) -> dict[str, Any]:
        exc = self._exc
        return {
            "spike": self.spike.state_dict(),
            "divergence": self.divergence.state_dict(),
            "excursion": None if exc is None else {"onset": exc.onset, "level": str(exc.level),
                                                   "points": list(exc.points)},
            "diverging": self._diverging,
            "cadence": self.cadence.state_dict(),
            "recent": [[s, x] for s, x in self._recent],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.spike.load_state_dict(state["spike"])
        self.divergence.load_state_dict(state["divergence"])
        exc = state.get("excursion")
        self._exc = None if exc is None else _Excursion(int(exc["onset"]), Level(exc["level"]),
                                                        [float(x) for x in exc["points"]])
        diverging = state.get("diverging")
        # older states stored a bool; True there means "reported, step unknown": count from now
        self._diverging = None if diverging in (None, False) else (int(diverging) if diverging is not True else 0)
        self.cadence.load_state_dict(state.get("cadence", {}))
        self._recent = deque(((int(s), float(x)) for s, x in state.get("recent", [])), maxlen=self._recent.maxlen)
