"""Memory growth: the allocator's cached-but-unused memory (reserved - allocated) growing (pure).

A steady climb of ``mem_reserved - mem_allocated`` is fragmentation or a leak through the caching
allocator, and ends in an out-of-memory error hours later. Per rank the rule keeps the median of
the last ``window`` steps (so a one-step burst does not count) and the lowest such median seen
since the run started (the baseline). It warns once when the current median is at least
``min_growth_bytes`` and at least ``min_growth_rel`` of the reserved memory above the baseline —
over any horizon, so a leak of a few MiB per step on an 80 GiB device is caught too — and re-arms
when the growth falls below half of that (e.g. after ``torch.cuda.empty_cache()``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from cliffguard.controller.rules.base import RANK_METRIC_EVENTS, RankScope, rank_columns
from cliffguard.controller.rules.packed import pack_array, unpack_array
from cliffguard.controller.rules.rank_window import (
    PACKED_VERSION,
    RankWindows,
    full_row_medians,
    packed_layout,
)
from cliffguard.controller.rules.rank_window_split import load_windows, prefixed, split
from cliffguard.controller.verdict import Action, Verdict
from cliffguard.core.declared import bounded, check_declared
from cliffguard.core.enums import EventType, Level
from cliffguard.core.events import Event


@dataclass(kw_only=True, slots=True)
class MemoryConfig:
    """Defaults measured on ``synthetic_metrics.memory_suite(20, 20, seed=1)`` (1-4 ranks, 8-80 GiB,
    leaks of 2-20 MiB/step, ±5% noise, 1 GiB single-step bursts): window 50/100/200 -> recall
    20/20, 20/20, 18/20 within the deadline, median delay 102/131/191 steps, 0 false alerts on
    the 20 healthy runs. Hence 50."""

    enabled: bool = True
    """Run the rule at all."""
    window: int = bounded(50, ge=4)
    """Steps per rank in the running median."""
    min_growth_bytes: int = bounded(256 * 2**20, ge=0)
    """Growth below this is never reported (256 MiB)."""
    min_growth_rel: float = bounded(0.05, ge=0, lt=1)
    """...nor growth below this fraction of the rank's reserved memory."""

    def __post_init__(self) -> None:
        check_declared(self)


class MemoryRule:
    name = "memory"
    consumes = RANK_METRIC_EVENTS
    scope = RankScope.EVERY_RANK

    def __init__(self, config: MemoryConfig | None = None) -> None:
        self.config = config or MemoryConfig()
        self._recent = RankWindows(self.config.window, 1, np.int64)  # per rank: cached bytes
        # per row of _recent: the lowest median so far (NaN: none yet), its step, whether reported
        self._baseline = np.zeros(0)
        self._baseline_step = np.zeros(0, np.int64)
        self._flagged = np.zeros(0, bool)

    def observe(self, step: int, rank: int, reserved: int, allocated: int) -> list[Verdict]:
        return self._observe(step, np.array([rank], np.int64), np.array([reserved], np.int64),
                             np.array([allocated], np.int64))

    def _observe(self, step: int, ranks: np.ndarray, reserved: np.ndarray, allocated: np.ndarray) -> list[Verdict]:
        """Samples in arrival order (distinct ranks): each rank is judged on its own window."""
        cfg = self.config
        if not cfg.enabled or not len(ranks):
            return []
        if reserved.min() <= 0:  # CPU runs report no device memory
            ok = reserved > 0
            ranks, reserved, allocated = ranks[ok], reserved[ok], allocated[ok]
            if not len(ranks):
                return []
        w = self._recent
        rows = w.rows_for(ranks)
        self._fit()
        w.push(rows, step, np.maximum(reserved - allocated, 0)[:, None])
        if w.count[rows].min() < cfg.window:  # only full windows are judged
            full = w.count[rows] == cfg.window
            rows, reserved, allocated = rows[full], reserved[full], allocated[full]
            if not len(rows):
                return []
        current = full_row_medians(w.values[0, rows])
        base = self._baseline[rows]
        lower = ~(current >= base)  # no baseline yet (NaN), or a lower median
        if lower.any():
            base = self._baseline[rows] = np.where(lower, current, base)
            self._baseline_step[rows[lower]] = step
        growth = current - base
        threshold = np.maximum(cfg.min_growth_bytes, cfg.min_growth_rel * reserved)
        calm = growth < threshold / 2  # re-armed
        flagged = self._flagged[rows]
        fire = ~(calm | (growth < threshold) | flagged)
        if not fire.any():
            if flagged.any():
                self._flagged[rows] = flagged & ~calm
            return []
        self._flagged[rows] = (flagged & ~calm) | fire
        out: list[Verdict] = []
        for i in np.flatnonzero(fire).tolist():
            row = int(rows[i])
            out.append(self._verdict(step, w.ranks[row], self._number(current[i]), self._number(base[i]),
                                     int(self._baseline_step[row]), int(reserved[i]), int(allocated[i])))
        return out

    def _number(self, x: Any) -> int | float:
        """A median as ``statistics.median`` gave it: an int of an odd window, a float of an even."""
        return int(x) if self.config.window % 2 else float(x)

    def _verdict(self, step: int, rank: int, current: int | float, baseline: int | float, baseline_step: int,
                 reserved: int, allocated: int) -> Verdict:
        growth = current - baseline
        ev = {"rank": rank, "cached_baseline": baseline, "cached_now": current, "growth_bytes": growth,
              "baseline_step": baseline_step, "reserved": reserved, "allocated": allocated,
              "window": self.config.window}
        return Verdict(rule="memory_growth", level=Level.WARN, step=step, rank=rank, onset_step=baseline_step,
                       action=Action.ALERT, evidence=ev,
                       message=f"rank {rank}: reserved-but-unallocated memory grew {growth / 2**20:.0f} MiB "
                       f"since step {baseline_step}")

    def _fit(self) -> None:
        """Per-row arrays as long as the windows' rows (new ranks start without a baseline)."""
        n, have = len(self._recent), len(self._baseline)
        if n > have:
            grow = max(n, 2 * have)
            self._baseline = np.concatenate([self._baseline, np.full(grow - have, np.nan)])
            self._baseline_step = np.concatenate([self._baseline_step, np.zeros(grow - have, np.int64)])
            self._flagged = np.concatenate([self._flagged, np.zeros(grow - have, bool)])

    def baseline(self, rank: int) -> int | float | None:
        """The rank's baseline (the lowest median of its windows so far), None before one."""
        row = self._recent.row_of(rank)
        return None if row is None or np.isnan(self._baseline[row]) else self._number(self._baseline[row])

    def on_event(self, event: Event) -> list[Verdict]:
        ranks, (reserved, allocated) = rank_columns(event, (("mem_reserved", 0), ("mem_allocated", 0)), np.int64)
        if event.type is EventType.RANKS:
            self._recent.reserve(event.world)
        return self._observe(event.step, ranks, reserved, allocated)

    def state_dict(self) -> dict[str, Any]:
        return self._state(self._recent.packed())

    def state_split(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The state with the windows' row table, and the ring slots written since the last
        split (``rank_window_split.py``): what the controller saves with a batch."""
        table, parts = split(self._recent)
        return self._state(table), prefixed("recent", parts)

    def _state(self, recent: dict[str, Any]) -> dict[str, Any]:
        n = len(self._recent)
        return {"packed": PACKED_VERSION, "recent": recent,
                "baseline": pack_array(self._baseline[:n]),  # NaN: no baseline yet
                "baseline_step": pack_array(self._baseline_step[:n]),
                "flagged": pack_array(self._flagged[:n].astype(np.uint8))}

    def list_state_dict(self) -> dict[str, Any]:
        """The state in the JSON-list layout stored before the packed one (still loaded)."""
        w = self._recent
        n = len(w)
        _, (values,) = w.ordered()
        base, base_step, flagged = self._baseline[:n].tolist(), self._baseline_step[:n].tolist(), self._flagged[:n].tolist()
        return {str(r): {"recent": vs, "baseline": None if math.isnan(b) else self._number(b),
                         "baseline_step": s, "flagged": f}
                for r, vs, b, s, f in zip(w.ranks, values, base, base_step, flagged, strict=True)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if packed_layout(state):
            load_windows(self._recent, state, "recent")
            n = len(self._recent)
            columns = (unpack_array(state.get("baseline"), np.float64, (n,), "memory: baselines"),
                       unpack_array(state.get("baseline_step"), np.int64, (n,), "memory: baseline steps"),
                       unpack_array(state.get("flagged"), np.uint8, (n,), "memory: flags").astype(bool))
        else:
            self._recent.load((int(r), [(0, (int(v),)) for v in st["recent"]]) for r, st in state.items())
            rows = state.values()
            columns = ([np.nan if st.get("baseline") is None else st["baseline"] for st in rows],
                       [int(st.get("baseline_step", 0)) for st in rows], [bool(st.get("flagged", False)) for st in rows])
        self._baseline, self._baseline_step, self._flagged = np.zeros(0), np.zeros(0, np.int64), np.zeros(0, bool)
        self._fit()
        n = len(self._recent)
        self._baseline[:n], self._baseline_step[:n], self._flagged[:n] = columns
