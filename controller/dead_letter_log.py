"""The controller's log of dead letters, rate-limited: one line per reason per window, not per event.

A trainer that cannot sign sends every event unsigned, and a line per dead letter buried the log
(51 WARNING lines for a 40-step run, thousands an hour). Per reason: the first dead letter is
logged in full (where it came from, its detail) and opens a window of ``window_s``; the ones
after it are counted, with the runs they belong to, and at the window's end one line says how
many there were, whose, and the newest detail, and a new window opens while they keep coming. A
window that ends empty closes: the next dead letter of that reason is logged in full again. The
counts that matter for good are in the store (``dlq_counts``, ``dlq_runs``), and each message is
on ``<prefix>.dlq``; this is only what a person reading the log sees.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from cliffguard.controller.store.dlq import run_of

log = logging.getLogger("cliffguard.controller.edge")

WINDOW_S = 60.0
"""Seconds a reason's dead letters are counted before one line reports them."""


class Letter(Protocol):
    topic: str
    partition: int
    offset: int
    reason: str
    detail: str
    key: bytes | None


@dataclass(slots=True)
class _Window:
    opened: float
    count: int = 0
    runs: Counter[str] = field(default_factory=Counter)
    newest: str = ""


class DeadLetterLog:
    """See the module docstring. ``note`` each dead letter; ``flush`` on every poll; ``close`` at the end."""

    def __init__(
        self,
        window_s: float = WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
        logger: logging.Logger = log,
    ) -> None:
        self.window_s = window_s
        self._clock = clock
        self._log = logger
        self._open: dict[str, _Window] = {}

    def note(self, letters: Iterable[Letter]) -> None:
        now = self._clock()
        for d in letters:
            window = self._open.get(d.reason)
            if window is None:
                self._open[d.reason] = _Window(opened=now)
                self._log.warning(
                    "dead letter %s[%d]@%d: %s: %s (more of %s are counted for %.0f s)",
                    d.topic,
                    d.partition,
                    d.offset,
                    d.reason,
                    d.detail[:200],
                    d.reason,
                    self.window_s,
                )
                continue
            window.count += 1
            window.runs[run_of(d.key) or "(no key)"] += 1
            window.newest = d.detail[:200]

    def flush(self, *, final: bool = False) -> None:
        """Report every window that has ended (all of them when ``final``)."""
        now = self._clock()
        for reason, window in list(self._open.items()):
            if not final and now - window.opened < self.window_s:
                continue
            if window.count:
                runs = ", ".join(f"{run} x{n}" for run, n in window.runs.most_common(5))
                more = len(window.runs) - 5
                self._log.warning(
                    "%d more dead letters %s in the last %.0f s (runs: %s%s); newest: %s",
                    window.count,
                    reason,
                    now - window.opened,
                    runs,
                    f" and {more} more" if more > 0 else "",
                    window.newest,
                )
                self._open[reason] = _Window(opened=now)
            else:
                del self._open[reason]
        if final:
            self._open.clear()
