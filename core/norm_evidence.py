"""The gradient norm beside the loss: its own residuals, its own tail, evidence for the loss rule (pure).

Where a trainer logs the global grad norm with the loss, a blow-up often shows in the norm first
(a 30x norm with a +26% loss, a norm climbing before the loss does). ``NormEvidence`` judges the
norm as the spike rule judges the loss, in log space (norms are log-normal-ish): a robust z-score
against the median and the successive-difference σ of the newest healthy log norms (σ at least
``NORM_SIGMA_FLOOR``), its tail probability under the norm's own tail model (``core/tail.py``),
and the same evidence weight ``ln(p_w / p)``. The spike rule adds that weight to the loss's in its
evidence window; it never makes a point critical on its own (``core/spike.py``).
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

from cliffguard.core.evidence import weight
from cliffguard.core.sliding import LevelWindow
from cliffguard.core.tail import TailModel

_INF, _log = math.inf, math.log  # module globals: read per norm
NORM_SIGMA_FLOOR = 0.05
"""σ floor of log grad norms (5%): a very steady norm does not count a wiggle as evidence."""


class NormEvidence:
    __slots__ = ("window", "tail", "min_history", "_stats", "_stale", "refresh")

    def __init__(self, size: int, min_history: int, tail: TailModel) -> None:
        self.window: deque[float] = deque(maxlen=size)
        """The newest healthy log norms."""
        self.tail = tail
        self.min_history = min_history
        self.refresh = max(1, size // 5)
        """Norms added between two readings of the window's median and σ (a fifth of it), read
        from scratch then: a norm costs an append, not a sorted insert, a median and a MAD (the
        norm's level moves slowly; its spikes never enter the window)."""
        self._stats: tuple[float, float] | None = None
        self._stale = 0

    def weigh(self, norm: float, k_warn: float, p_w: float, learn: bool) -> float:
        """This point's evidence (0 when none, or before ``min_history`` norms); the window and
        the tail learn from it unless told not to (an alarm is going on)."""
        if not 0.0 < norm < _INF:
            return 0.0  # no gradient, NaN, or an overflow the loss scaler handles: nothing to judge
        x = round(_log(norm), 6)  # (a millionth of a log: the stored window stays short)
        window = self.window
        if len(window) < self.min_history:
            window.append(x)
            return 0.0
        stats = self._stats
        if stats is None or self._stale >= self.refresh:
            stats = self._stats = LevelWindow(window.maxlen or len(window), window).robust()
            self._stale = 0
        med, raw = stats
        z = (x - med) / (raw if raw > NORM_SIGMA_FLOOR else NORM_SIGMA_FLOOR)
        s = weight(self.tail.sf(z), p_w) if z >= k_warn else 0.0
        if learn:
            if s == 0.0:
                window.append(x)
                self._stale += 1
            self.tail.add(z)
        return s

    def state_dict(self) -> dict[str, Any]:
        # the stats in use travel too, so a restored series judges exactly as the original would
        return {
            "window": list(self.window),
            "tail": self.tail.state_dict(),
            "stats": None if self._stats is None else list(self._stats),
            "stale": self._stale,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.window = deque((float(v) for v in state.get("window", [])), maxlen=self.window.maxlen)
        self.tail.load_state_dict(state.get("tail", {}))
        stats = state.get("stats")
        self._stats = None if stats is None else (float(stats[0]), float(stats[1]))
        self._stale = int(state.get("stale", 0))
