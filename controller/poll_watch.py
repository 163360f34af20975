"""A poll of the metrics consumer that does not come back is said, and its network thread woken.

kafka-python 3 runs its network I/O on a thread of its own; a poll hands that thread work and
waits, unbounded, for the answer (``NetworkSelector.run``: ``event.wait()`` with no timeout). The
soak found the controller's consumer silent for 23-31 s after a broker restart met a stopped
controller, with its main thread inside such a wait and the network thread asleep in ``select``
(a wake-up lost on the way). Waking it costs one byte on its wake-up socket and is harmless when
nothing was lost. So a watcher thread notes when each poll starts; one that has run
``after_s`` past its own timeout is logged (WARNING, once per poll) and its selector woken,
every second until the poll returns.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger("cliffguard.controller.edge")


class PollWatch:
    def __init__(self, wake: Callable[[], bool], after_s: float = 5.0, every_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._wake = wake
        self.after_s = after_s
        self.every_s = every_s
        self._clock = clock
        self._lock = threading.Lock()
        self._poll: tuple[float, float] | None = None  # (started, its timeout), while a poll runs
        self._said = False
        self.wakes = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> PollWatch:
        self._thread = threading.Thread(target=self._loop, name="cliffguard-poll-watch", daemon=True)
        self._thread.start()
        return self

    def entered(self, timeout_s: float) -> None:
        with self._lock:
            self._poll, self._said = (self._clock(), timeout_s), False

    def left(self) -> None:
        with self._lock:
            if self._said and self._poll is not None:
                log.warning("the metrics consumer's poll came back after %.0f s", self._clock() - self._poll[0])
            self._poll = None

    def check(self) -> bool:
        """One look (the thread's body; a test calls it): wake the selector of an overdue poll."""
        with self._lock:
            poll = self._poll
            if poll is None:
                return False
            late = self._clock() - poll[0] - poll[1]
            if late < self.after_s:
                return False
            first, self._said = not self._said, True
        if first:
            log.warning("the metrics consumer's poll has not come back %.0f s past its %.0f s timeout; waking "
                        "kafka-python's network thread", late, poll[1])
        woke = self._wake()
        self.wakes += int(woke)
        return woke

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.check()
            except Exception:  # noqa: BLE001 - the watch must outlive whatever it watches
                log.exception("the poll watch failed a look")

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2)
