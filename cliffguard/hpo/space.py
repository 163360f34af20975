"""The search space: learning rate (log-uniform), global batch (powers of two), Adam betas.

The ranges are fixed; TPE narrows the search itself: after ``n_startup_trials`` random draws it
samples where the good trials' density is high, so later trials concentrate around the best region.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class TrialParams:
    lr: float
    global_batch: int
    beta1: float
    beta2: float

    def as_dict(self) -> dict[str, Any]:
        return {"lr": self.lr, "global_batch": self.global_batch, "beta1": self.beta1, "beta2": self.beta2}


@dataclass(kw_only=True, slots=True)
class SearchSpace:
    lr_min: float = 1e-4
    lr_max: float = 3e-2
    batches: list[int] = field(default_factory=lambda: [8, 16, 32])
    """Global batch choices (sequences per step); each a power of two."""
    beta1: tuple[float, float] = (0.8, 0.95)
    beta2: tuple[float, float] = (0.9, 0.999)

    def __post_init__(self) -> None:
        if not 0 < self.lr_min < self.lr_max:
            raise ValueError("lr_min: must be > 0 and < lr_max")
        if not self.batches or any(b < 1 or b & (b - 1) for b in self.batches):
            raise ValueError("batches: must be a non-empty list of powers of two")
        for name in ("beta1", "beta2"):
            lo, hi = getattr(self, name)
            if not 0 <= lo < hi < 1:
                raise ValueError(f"{name}: must be a range 0 <= low < high < 1")

    def suggest(self, trial: Any) -> TrialParams:
        return TrialParams(
            lr=trial.suggest_float("lr", self.lr_min, self.lr_max, log=True),
            global_batch=int(trial.suggest_categorical("global_batch", list(self.batches))),
            beta1=trial.suggest_float("beta1", *self.beta1),
            beta2=trial.suggest_float("beta2", *self.beta2),
        )
