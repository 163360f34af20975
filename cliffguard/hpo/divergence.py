"""When a trial has diverged (pure): a non-finite loss, a critical from the project's spike rule
(``core.spike.SpikeDetector`` with the deployment's ``[spike]``, the controller's own figures), or a
loss above the window's starting validation loss by more than ``rise_margin``. A diverged trial is
pruned, never counted as a result."""

from __future__ import annotations

import math

from cliffguard.core.enums import Level
from cliffguard.core.spike import SpikeConfig, SpikeDetector


class DivergenceCheck:
    def __init__(self, start_loss: float, spike: SpikeConfig | None = None, rise_margin: float = 0.5) -> None:
        if rise_margin <= 0:
            raise ValueError("rise_margin: must be > 0")
        self.limit = start_loss * (1.0 + rise_margin)
        self.detector = SpikeDetector(spike or SpikeConfig())

    def observe(self, loss: float) -> str | None:
        """The reason the run diverged at this loss, or None while it is healthy."""
        if not math.isfinite(loss):
            return f"non-finite loss {loss}"
        verdict = self.detector.observe(loss)
        if verdict.level is Level.CRITICAL:
            return f"spike rule critical: {verdict.reason}"
        return self.beyond_start(loss)

    def beyond_start(self, loss: float) -> str | None:
        """The level test alone (validation losses: too few points for the spike rule)."""
        if not math.isfinite(loss):
            return f"non-finite loss {loss}"
        if loss > self.limit:
            return f"loss {loss:.4f} above the start + margin ({self.limit:.4f})"
        return None
