"""A robust z-score over a sliding window of log values, shared by the grad-norm rules (pure).

Gradient norms are log-normal-ish and heavy-tailed, so they are judged in log space:
``z = (log g - median) / σ`` with σ = 1.4826·MAD floored at ``sigma_floor`` (log units, i.e. a
relative spread). Points at or above ``k_warn`` are kept out of the window, like the loss rule. The stats are
recomputed after every ``refresh`` additions (5% of the window), not every step: a per-layer rule
on a 100-layer model would otherwise sort 200 lists per step, and stats 5% stale change nothing.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

from cliffguard.core.spike import robust_stats


class LogWindow:
    def __init__(self, size: int) -> None:
        self.values: deque[float] = deque(maxlen=size)
        self.refresh = max(1, size // 20)
        self._raw: tuple[float, float] | None = None
        self._stale = 0  # additions since _raw was computed

    def __len__(self) -> int:
        return len(self.values)

    def stats(self, sigma_floor: float) -> tuple[float, float]:
        if self._raw is None or self._stale >= self.refresh:
            self._raw, self._stale = robust_stats(self.values), 0
        med, raw = self._raw
        return med, max(raw, sigma_floor)

    def zscore(self, value: float, sigma_floor: float) -> tuple[float, float, float]:
        """(z, median, σ) of ``value`` (> 0) in log space; the window must not be empty."""
        med, sigma = self.stats(sigma_floor)
        return (math.log(value) - med) / sigma, med, sigma

    def add(self, value: float) -> None:
        self.add_log(math.log(value))

    def add_log(self, log_value: float) -> None:
        """``add`` for a value whose log the caller already has."""
        self.values.append(log_value)
        self._stale += 1

    def state_dict(self) -> dict[str, Any]:
        # The cached stats travel too, so a restored window judges exactly as the original would.
        return {"values": list(self.values), "raw": None if self._raw is None else list(self._raw),
                "stale": self._stale}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.values = deque((float(v) for v in state["values"]), maxlen=self.values.maxlen)
        raw = state.get("raw")
        self._raw = None if raw is None else (float(raw[0]), float(raw[1]))
        self._stale = int(state.get("stale", 0))
