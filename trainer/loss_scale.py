"""Gradient-histogram adaptive loss scaling with skip-step on overflow.

Classic dynamic loss scaling (``torch.amp.GradScaler``) halves the scale on overflow and doubles
it blindly every N clean steps, so it overflows on purpose every N steps and skips those updates.
This scaler reads the two tails of the scaled-gradient magnitude histogram instead:

- **bottom tail**: the share of non-zero ``|g·scale|`` below ``underflow_limit`` (the smallest
  fp16 normal, 2^-14; below it fp16 loses precision, below 2^-24 it flushes to zero). More than
  ``underflow_fraction`` there means the scale is too low: grow it —
- **top tail**: — but only while ``max|g·scale| · growth · 2^headroom_bits`` stays under
  ``overflow_limit`` (fp16 max 65504). When the maximum already sits within the headroom, shrink
  pre-emptively, before anything overflows.
- **overflow** (any non-finite gradient): skip the optimizer step on this rank — and, because the
  gradients were all-reduced first, on every rank identically — and back off.

All statistics are reduced on the device and read with one host sync per step (the finite
flag, the underflow count and the max travel together). On fp32/bf16 training the scaler still
runs — bf16 shares fp32's exponent range so it rarely acts — and its skip-on-overflow is what
matters; turn it off with ``enabled=False``. ``state_dict`` carries the scale, so a rollback
restores the scale that belonged to the restored weights.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from cliffguard.core.declared import bounded, check_declared


@dataclass(kw_only=True, slots=True)
class LossScaleConfig:
    enabled: bool = True
    """False: scale is 1, nothing is measured; non-finite gradients still skip the step."""
    init_scale: float = 2.0**16
    """Starting scale."""
    growth_factor: float = bounded(2.0, gt=1)
    """Multiplier when the bottom tail shows underflow."""
    backoff_factor: float = bounded(0.5, gt=0, lt=1)
    """Multiplier on overflow or when the top tail is within the headroom."""
    min_scale: float = 1.0
    """Lower bound of the scale."""
    max_scale: float = 2.0**24
    """Upper bound of the scale."""
    underflow_limit: float = 2.0**-14
    """|g·scale| below this counts as underflowing (fp16's smallest normal)."""
    overflow_limit: float = 65504.0
    """|g·scale| above this overflows (fp16 max)."""
    underflow_fraction: float = bounded(1e-3, ge=0, lt=1)
    """Grow when more than this share of non-zero scaled gradients underflow."""
    headroom_bits: int = bounded(3, ge=0)
    """Keep max|g·scale| at least 2^headroom_bits below overflow_limit."""
    growth_interval: int = bounded(10, ge=1)
    """Steps between two growths (lets the histogram settle after a change)."""

    def __post_init__(self) -> None:
        check_declared(self)
        if not 0 < self.min_scale <= self.init_scale <= self.max_scale:
            raise ValueError("init_scale: must lie in [min_scale, max_scale] and min_scale > 0")
        if not 0 < self.underflow_limit < self.overflow_limit:
            raise ValueError("underflow_limit: must be > 0 and < overflow_limit")


class AdaptiveLossScaler:
    def __init__(self, cfg: LossScaleConfig | None = None) -> None:
        self.cfg = cfg or LossScaleConfig()
        self.scale = self.cfg.init_scale if self.cfg.enabled else 1.0
        self.skipped = 0
        """Optimizer steps skipped for non-finite gradients (total)."""
        self.since_change = 0
        self.last_decision = "init"
        """overflow | headroom | underflow | hold: what the last update did and why."""
        self.last_underflow = 0.0
        self.last_max = 0.0
        self._finite = True

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self.scale if self.cfg.enabled else loss

    @torch.no_grad()
    def unscale_(self, params: Iterable[torch.nn.Parameter]) -> bool:
        """Measure the scaled gradients' tails, divide them by the scale in place; True if finite."""
        grads = [p.grad for p in params if p.grad is not None]
        if not grads:
            self._finite = True
            return True
        nonfinite = torch.stack([(~torch.isfinite(g)).sum() for g in grads]).sum()
        if self.cfg.enabled:
            mags = [g.abs() for g in grads]
            nonzero = torch.stack([(m > 0).sum() for m in mags]).sum()
            under = torch.stack([((m > 0) & (m < self.cfg.underflow_limit)).sum() for m in mags]).sum()
            peak = torch.stack([m.nan_to_num(0.0, 0.0, 0.0).max() for m in mags]).max()
            stats = torch.stack([nonfinite.double(), nonzero.double(), under.double(), peak.double()]).tolist()
            inv = 1.0 / self.scale
            for g in grads:
                g.mul_(inv)
            n_bad, n_nonzero, n_under, peak_val = stats
            self.last_underflow = n_under / n_nonzero if n_nonzero else 0.0
            self.last_max = peak_val
        else:
            n_bad = float(nonfinite)  # the one host sync
        self._finite = n_bad == 0
        return self._finite

    def update(self) -> str:
        """Adjust the scale after ``unscale_``; returns the decision (also in ``last_decision``)."""
        c = self.cfg
        self.since_change += 1
        if not self._finite:
            self.skipped += 1
            decision = "overflow"
        elif not c.enabled:
            decision = "hold"
        elif self.last_max * 2.0**c.headroom_bits > c.overflow_limit:
            decision = "headroom"
        elif (
            self.last_underflow > c.underflow_fraction
            and self.last_max * c.growth_factor * 2.0**c.headroom_bits <= c.overflow_limit
            and self.since_change >= c.growth_interval
        ):
            decision = "underflow"
        else:
            decision = "hold"
        if c.enabled and decision in ("overflow", "headroom"):
            self.scale = max(c.min_scale, self.scale * c.backoff_factor)
            self.since_change = 0
        elif decision == "underflow":
            self.scale = min(c.max_scale, self.scale * c.growth_factor)
            self.since_change = 0
        self.last_decision = decision
        return decision

    def step(self, optimizer: torch.optim.Optimizer, params: Iterable[torch.nn.Parameter]) -> bool:
        """unscale_ + optimizer.step() unless a gradient is non-finite + update. True if applied."""
        finite = self.unscale_(params)
        if finite:
            optimizer.step()
        self.update()
        return finite

    def state_dict(self) -> dict[str, Any]:
        return {"scale": self.scale, "skipped": self.skipped, "since_change": self.since_change}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scale = float(state["scale"])
        self.skipped = int(state["skipped"])
        self.since_change = int(state["since_change"])
