"""A robust z-score over a sliding window of log values, shared by the grad-norm rules (pure).

Gradient norms are log-normal-ish and heavy-tailed, so they are judged in log space:
``z = (log g - median) / σ`` with σ = 1.4826·MAD floored at ``sigma_floor`` (log units, i.e. a
relative spread). Points at or above ``k_warn`` are kept out of the window, like the loss rule.
"""

from __future__ import annotations

import math
from collections import deque
from statistics import median
from typing import Any

from agent.spike import MAD_TO_SIGMA


class LogWindow:
    def __init__(self, size: int) -> None:
        self.values: deque[float] = deque(maxlen=size)

    def __len__(self) -> int:
        return len(self.values)

    def stats(self, sigma_floor: float) -> tuple[float, float]:
        med = median(self.values)
        mad = median(abs(v - med) for v in self.values)
        return med, max(MAD_TO_SIGMA * mad, sigma_floor)

    def zscore(self, value: float, sigma_floor: float) -> tuple[float, float, float]:
        """(z, median, σ) of ``value`` (> 0) in log space; the window must not be empty."""
        med, sigma = self.stats(sigma_floor)
        return (math.log(value) - med) / sigma, med, sigma

    def add(self, value: float) -> None:
        self.values.append(math.log(value))

    def state_dict(self) -> list[float]:
        return list(self.values)

    def load_state_dict(self, values: list[float]) -> None:
        self.values = deque((float(v) for v in values), maxlen=self.values.maxlen)

    def evidence(self, sigma_floor: float) -> dict[str, Any]:
        if not self.values:
            return {"n": 0}
        med, sigma = self.stats(sigma_floor)
        return {"median": math.exp(med), "log_sigma": sigma, "n": len(self.values)}
