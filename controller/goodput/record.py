"""What the ledger keeps besides its buckets: cost records, the stacked time chart's points and
the ETTR alert's window (each JSON-able through ``to_dict``/``state_dict``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cliffguard.controller.goodput.buckets import BUCKETS, INDEX, Bucket
from cliffguard.controller.goodput.config import GoodputConfig

_PROD = INDEX[Bucket.PRODUCTIVE]
_ALERT_SAMPLES = 16  # per window: the window's ETTR is exact to 1/16 of it


@dataclass(slots=True)
class Cost:
    """What one incident, restart or scale change cost, by bucket (``BUCKETS`` order)."""

    kind: str
    """incident | restart | elastic | unexplained (a redo no incident or restart explains)."""
    ts: float
    seconds: list[float]
    gpu: list[float]
    steps_lost: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "ts": self.ts, "seconds": self.seconds, "gpu": self.gpu,
                "steps_lost": self.steps_lost}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Cost:
        return cls(kind=str(d["kind"]), ts=float(d["ts"]), seconds=[float(x) for x in d["seconds"]],
                   gpu=[float(x) for x in d["gpu"]], steps_lost=int(d["steps_lost"]))

    def by_bucket(self) -> dict[str, dict[str, float]]:
        """{bucket: {"seconds", "gpu_seconds"}} of the buckets it was charged with."""
        return {b.value: {"seconds": round(self.seconds[i], 6), "gpu_seconds": round(self.gpu[i], 6)}
                for i, b in enumerate(BUCKETS) if self.seconds[i] > 0}


@dataclass(frozen=True, slots=True)
class LedgerAlert:
    """The window's ETTR crossed the floor (``low``) or climbed back above it (``recovered``)."""

    kind: str
    ettr: float
    window_s: float
    floor: float


class Window:
    """The stacked time chart (cumulative seconds per bucket at up to ``points`` moments, at least
    ``every`` apart and thinned by half when full; ``chart`` adds the ledger's newest) and the
    samples the ETTR alert judges its window by (one per 1/16 of the window: the window's ETTR is
    judged when one is taken)."""

    def __init__(self, window_s: float, points: int) -> None:
        self.window_s = window_s
        self.points = points
        self.timeline: list[list[float]] = []
        """Kept in the store's ``goodput.timeline`` (written whenever it ``moved``), not in the state."""
        self.moved = False
        self.every = 1.0
        self.samples: list[list[float]] = []
        """[t, productive, total] every window/16 seconds of booked time."""
        self.alerting = False
        self.ettr: float | None = None
        """The ETTR over the last window (None until a whole window is booked)."""

    def sample(self, t: float, seconds: list[float], config: GoodputConfig) -> list[LedgerAlert]:
        """After each booked event (``t``: seconds since the first start). Cheap unless a chart
        point or an alert sample is due: it runs once per event on the controller's batch path."""
        if not self.timeline or t - self.timeline[-1][0] >= self.every:
            self.timeline.append([round(t, 3), *(round(s, 2) for s in seconds)])
            self.moved = True
            if len(self.timeline) > self.points:
                self.timeline = [*self.timeline[:-1:2], self.timeline[-1]]
                self.every *= 2
        if self.samples and t - self.samples[-1][0] < self.window_s / _ALERT_SAMPLES:
            return []
        prod = seconds[_PROD]
        self.samples.append([t, prod, sum(seconds)])
        old = [s for s in self.samples if s[0] <= t - self.window_s]
        if not old:
            return []
        base = old[-1]
        self.samples = [base, *(s for s in self.samples if s[0] > base[0])]
        span = t - base[0]
        self.ettr = min(1.0, max(0.0, (prod - base[1]) / span)) if span > 0 else None
        floor = config.ettr_floor
        if self.ettr is None or not floor:
            return []
        if not self.alerting and self.ettr < floor:
            self.alerting = True
            return [LedgerAlert("low", self.ettr, self.window_s, floor)]
        if self.alerting and self.ettr >= min(1.0, floor + config.ettr_rearm):
            self.alerting = False
            return [LedgerAlert("recovered", self.ettr, self.window_s, floor)]
        return []

    def chart(self, t: float, seconds: list[float]) -> dict[str, Any]:
        """{"buckets": [...], "points": [[t, cumulative seconds per bucket...], ...]}, ending at the
        ledger's newest moment ``t``."""
        return chart(self.timeline, t, seconds)

    def state_dict(self) -> dict[str, Any]:
        return {"every": self.every,
                "samples": [list(s) for s in self.samples], "alerting": self.alerting, "ettr": self.ettr}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.every = float(state["every"])
        self.samples = [[float(x) for x in s] for s in state["samples"]]
        self.alerting = bool(state["alerting"])
        self.ettr = None if state["ettr"] is None else float(state["ettr"])


def chart(points: list[list[float]], t: float, seconds: list[float]) -> dict[str, Any]:
    """The stacked chart's points, with the newest moment ``t`` (its ``seconds``) after the last."""
    out = [list(p) for p in points]
    if not out or out[-1][0] < round(t, 3):
        out.append([round(t, 3), *(round(s, 2) for s in seconds)])
    return {"buckets": [b.value for b in BUCKETS], "points": out}
