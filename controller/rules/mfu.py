"""MFU below a threshold for a sustained window, with the likely cause named (pure, no I/O).

The run's MFU is the median over ranks of each rank's median MFU over the last ``window`` steps,
so one slow step or one odd rank does not decide it. When it is below ``mfu_min`` the rule alerts
once (re-arming when the MFU is back at or above the threshold) and names the likeliest cause
from the newest quarter of the window:

* ``straggler`` — one rank's busy time (step time minus exposed communication) is
  ``straggler_ratio`` times the others'. Checked first: in synchronous training the others show
  the wait for it as exposed communication.
* otherwise the part of the step time that grew most since the run was last healthy (a slow
  running mean kept while the MFU was at or above the threshold): ``data_wait``,
  ``comm_exposed`` or ``compute`` (small kernels, throttling, or a wrong peak FLOP/s figure);
* a run that was never healthy has no baseline: the largest of data wait and exposed
  communication if it is at least ``min_share`` of the step time, else ``compute``.

Judged once per step, on the event of the rank that speaks for the run (core.ranks). MFU values
of 0 or non-finite (peak unknown) are ignored. A rank's step going back (a rollback's replay)
drops its points from that step on, so the window refills with the replayed steps; until every
rank's window overlaps again the rule judges nothing.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from cliffguard.controller.rules.base import RANK_METRIC_EVENTS, RankScope, rank_columns
from cliffguard.controller.rules.rank_window import (
    PACKED_VERSION,
    RankWindows,
    fmean,
    full_row_medians,
    median,
    packed_layout,
    row_medians,
)
from cliffguard.controller.rules.rank_window_split import load_windows, prefixed, split
from cliffguard.controller.rules.straggler import judge_points
from cliffguard.controller.verdict import Action, Verdict
from cliffguard.core.declared import bounded, check_declared
from cliffguard.core.enums import EventType, Level
from cliffguard.core.events import Event
from cliffguard.core.ranks import speaker

_PARTS = ("data_wait", "comm_exposed", "compute")


@dataclass(kw_only=True, slots=True)
class MfuConfig:
    """Defaults: ``mfu_min`` 0.40 is the figure the project was specified with. Measured on
    ``synthetic_metrics.rank_suite`` (healthy MFU 0.45-0.55; slowdowns by data wait, exposed
    communication, a straggler, or compute): window 50 -> on seed 1, 32/32 alerts within 60 steps
    with the right cause (median delay 24-25 steps) and 0 alerts on 20 healthy runs; on held-out
    seeds 9, 21, 33: 36/36 right, 0 false. Window 20 -> 31/32 right on seed 1 (too few points per
    rank), delay 9-10 steps. Means of the newest quarter instead of medians named a x3 hiccup a
    straggler (1/12 on seed 9), hence medians and ``straggler_ratio`` 1.4."""

    enabled: bool = True
    """Run the rule at all."""
    mfu_min: float = bounded(0.40, gt=0, le=1)
    """Model FLOPs utilisation below which a sustained window alerts."""
    window: int = bounded(50, ge=4)
    """Steps per rank in the medians; also how long the MFU must stay low."""
    straggler_ratio: float = bounded(1.4, gt=1)
    """A rank whose recent busy time is this multiple of the others' is named the cause."""
    min_share: float = bounded(0.15, gt=0, lt=1)
    """Without a healthy baseline: share of step time that data wait or exposed communication
    needs to be named the cause."""
    baseline_alpha: float = bounded(0.02, gt=0, le=1)
    """Weight of each healthy step in the baseline's running mean."""

    def __post_init__(self) -> None:
        check_declared(self)


# Timings of inf give inf - inf = NaN in the parts, as Python floats did, silently: no errstate
# block around the subtractions (it costs more than they do on a one-rank event).
warnings.filterwarnings("ignore", "invalid value encountered in subtract", RuntimeWarning, __name__)

_COLUMNS = (("mfu", 0.0), ("step_time_s", 0.0), ("data_wait_s", 0.0), ("comm_exposed_s", 0.0))
MFU, STEP_TIME, DATA_WAIT, COMM = range(len(_COLUMNS))


def _with_compute_and_busy(times: np.ndarray) -> np.ndarray:
    """(step time, data wait, exposed communication, ...) -> the same followed by compute (what is
    left of the step time) and busy time (the step time less exposed communication)."""
    st, data, comm = times
    return np.concatenate((times, (st - data - comm)[None], (st - comm)[None]))


class MfuRule:
    name = "mfu"
    consumes = RANK_METRIC_EVENTS
    scope = RankScope.EVERY_RANK

    def __init__(self, config: MfuConfig | None = None) -> None:
        self.config = config or MfuConfig()
        # per rank: (step, mfu, step_time_s, data_wait_s, comm_exposed_s), steps increasing
        self._recent = RankWindows(self.config.window, len(_COLUMNS))
        self._speaker: int | None = None  # the lowest rank with a window (core.ranks)
        self._baseline: dict[str, float] | None = None  # seconds per step while healthy
        self._low_since: int | None = None  # onset step of the current low episode, once reported

    def observe(self, step: int, rank: int, data: dict[str, Any]) -> list[Verdict]:
        values = np.array([[data.get(name, default) for name, default in _COLUMNS]], np.float64)
        return self._observe(step, np.array([rank], np.int64), values)

    def _observe(self, step: int, ranks: np.ndarray, values: np.ndarray) -> list[Verdict]:
        """Samples in arrival order (distinct ranks), ``values`` (n, columns); judged at each of the
        speaker's once its window is full."""
        mfu = values[:, MFU]
        ok = np.isfinite(mfu) & (mfu > 0)
        if not self.config.enabled or not ok.any():
            return []
        if not ok.all():
            ranks, values = ranks[ok], values[ok]
        out: list[Verdict] = []
        done = 0
        for at in judge_points(ranks, self._speaker):
            self._push(step, ranks[done : at + 1], values[done : at + 1])
            row = self._recent.row_of(int(ranks[at]))
            if self._recent.count[row] >= self.config.window:
                out += self._judge(step, row)
            done = at + 1
        self._push(step, ranks[done:], values[done:])
        return out

    def _push(self, step: int, ranks: np.ndarray, values: np.ndarray) -> None:
        if len(ranks):
            rows = self._recent.rows_for(ranks)
            self._recent.drop_from(rows, step)  # replaced by the replay of a rollback
            self._recent.push(rows, step, values)
            low = int(ranks[0]) if len(ranks) == 1 else int(ranks.min())
            self._speaker = low if self._speaker is None else min(self._speaker, low)

    def _judge(self, step: int, row: int) -> list[Verdict]:
        """Judged once per step, on the speaking rank's sample (core.ranks)."""
        cfg = self.config
        newest = self._parts(1)
        if newest is None:
            return []  # the ranks' windows do not overlap yet (one is still replaying)
        w = self._recent
        n = len(w)
        if w.count[:n].min() == cfg.window:  # every window full (the steady state): no mask
            per_rank = full_row_medians(w.column(MFU))
        else:
            per_rank = row_medians(w.column(MFU), w.valid())[0]
        run_mfu = median(per_rank)
        if run_mfu >= cfg.mfu_min:
            self._low_since = None
            self._update_baseline(newest[0])
            return []
        if self._low_since is not None:
            return []
        self._low_since = next((s for s, v in w.points(row) if v[MFU] < cfg.mfu_min), step)
        cause, detail, ev = self.cause()
        ev.update({"mfu": run_mfu, "mfu_min": cfg.mfu_min, "window": cfg.window, "cause": cause,
                   "cause_detail": detail})
        return [Verdict(rule="mfu_low", level=Level.WARN, step=step, onset_step=self._low_since,
                        action=Action.ALERT, evidence=ev, rank=ev.get("straggler_rank"),
                        message=f"MFU {run_mfu:.1%} below {cfg.mfu_min:.0%} for {cfg.window} steps; "
                        f"likely cause: {detail}")]

    def _parts(self, newest: int) -> tuple[dict[str, float], tuple[np.ndarray, np.ndarray], float] | None:
        """Mean seconds per step of each part over the newest points, per-rank busy (rows of
        ``_recent``, medians), step time; None when the ranks have no step in common there."""
        w = self._recent
        # The same steps for every rank (see straggler.py: a rank one step ahead would stand out).
        last = w.last_steps()
        horizon = int(last.min())
        if newest == 1 and int(last.max()) == horizon:
            # Every rank's newest point is at the horizon (steps only grow in a window): each
            # rank's one point in (horizon - 1, horizon] is its newest, its own median.
            n = len(w)
            rows, newest_slot = np.arange(n), (w.start[:n] + w.count[:n] - 1) % w.size
            medians = _with_compute_and_busy(w.values[STEP_TIME : COMM + 1, rows, newest_slot])
        else:
            lo = max(horizon - newest, int(w.first_steps().max()) - 1)
            steps = w.steps[: len(w)]
            mask = w.valid() & (steps > lo) & (steps <= horizon)
            rows = np.flatnonzero(mask.any(axis=1))
            if not len(rows):
                return None
            # only the slots some rank uses there (the windows are usually aligned: one or two)
            cut = np.ix_(rows, np.flatnonzero(mask.any(axis=0)))
            times = w.values[(slice(STEP_TIME, COMM + 1), *cut)]
            # Medians per rank (a x3 hiccup on one rank makes every other rank wait), then the mean.
            medians = row_medians(_with_compute_and_busy(times), mask[cut])[0]
        step_time, data_s, comm_s, compute = (fmean(m) for m in medians[:4].tolist())
        return ({"data_wait": data_s, "comm_exposed": comm_s, "compute": compute},
                (rows, medians[4]), step_time)

    def _update_baseline(self, parts: dict[str, float]) -> None:
        """Fold the newest step's parts (``_parts(1)``) into the healthy baseline."""
        if self._baseline is None:
            self._baseline = parts
        else:
            a = self.config.baseline_alpha
            self._baseline = {k: (1 - a) * self._baseline[k] + a * parts[k] for k in _PARTS}

    def cause(self) -> tuple[str, str, dict[str, Any]]:
        """(cause key, a phrase for people, evidence) from the newest quarter of the windows."""
        cfg = self.config
        measured = self._parts(max(4, cfg.window // 4))  # a superset of _parts(1), which observe checked
        assert measured is not None, "cause() is only asked once the ranks' windows overlap"
        parts, (rows, busy), step_time = measured
        ev: dict[str, Any] = {"seconds_per_step": parts, "baseline_seconds_per_step": self._baseline}
        if len(rows) >= 2:
            k = int(np.argmax(busy))  # the first seen of equally busy ranks
            rank, mine = self._recent.ranks[rows[k]], float(busy[k])
            others = median(np.delete(busy, k))
            ratio = mine / others if others > 0 else math.inf
            ev["straggler_ratio"] = ratio
            if ratio >= cfg.straggler_ratio:
                ev["straggler_rank"] = rank
                return "straggler", f"straggler rank {rank} ({ratio:.1f}x the others' busy time)", ev
        if self._baseline is not None:
            growth = {k: parts[k] - self._baseline[k] for k in _PARTS}
            ev["growth_seconds_per_step"] = growth
            key = max(growth, key=growth.__getitem__)
            return key, f"{key.replace('_', ' ')} grew {growth[key] * 1e3:.0f} ms/step since the run was healthy", ev
        shares = {k: parts[k] / step_time if step_time > 0 else 0.0 for k in ("data_wait", "comm_exposed")}
        key = max(shares, key=shares.__getitem__)
        if shares[key] >= cfg.min_share:
            return key, f"{key.replace('_', ' ')} ({shares[key]:.0%} of step time)", ev
        return "compute", "compute (no data wait, exposed communication or straggler stands out)", ev

    def on_event(self, event: Event) -> list[Verdict]:
        ranks, columns = rank_columns(event, _COLUMNS)
        if event.type is EventType.RANKS:
            self._recent.reserve(event.world)
        return self._observe(event.step, ranks, columns.T)

    def state_dict(self) -> dict[str, Any]:
        return self._state(self._recent.packed())

    def state_split(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The state with the windows' row table, and the ring slots written since the last
        split (``rank_window_split.py``): what the controller saves with a batch."""
        table, parts = split(self._recent)
        return self._state(table), prefixed("recent", parts)

    def _state(self, recent: dict[str, Any]) -> dict[str, Any]:
        return {"packed": PACKED_VERSION, "recent": recent, "baseline": self._baseline, "low_since": self._low_since}

    def list_state_dict(self) -> dict[str, Any]:
        """The state in the JSON-list layout stored before the packed one (still loaded)."""
        steps, (mfu, step_time, data_wait, comm) = self._recent.ordered()
        return {"recent": {str(r): [[s, a, b, c, d] for s, a, b, c, d in zip(*cols, strict=True)]
                           for r, *cols in zip(self._recent.ranks, steps, mfu, step_time, data_wait, comm,
                                               strict=True)},
                "baseline": self._baseline, "low_since": self._low_since}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if packed_layout(state):
            load_windows(self._recent, state, "recent")
        else:
            self._recent.load((int(r), [(int(p[0]), [float(x) for x in p[1:]]) for p in q])
                              for r, q in state["recent"].items())
        self._speaker = speaker(self._recent.ranks)
        self._baseline = state.get("baseline")
        self._low_since = state.get("low_since")
