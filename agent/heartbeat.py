"""Heartbeats on a side thread, every ``interval_s``, whatever the loop is doing (each rank
writes its liveness file and the node's local rank 0 publishes the node's heartbeat: the agent's
``_beat``, agent/node_beats.py).

The thread only reads what the loop keeps current (the mode from the agent's ``ModeMachine``,
agent/modes.py, and the step) and hands a ``heartbeat`` event to the sink, which never blocks. So a rank that is paused, held by the guard,
validating or stuck in a collective still beats — and a rank whose process died stops, which is
what the controller's heartbeat-loss rule looks for. A failure to build or publish one beat is
logged and the thread goes on.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


class Heartbeat:
    def __init__(self, interval_s: float, beat: Callable[[], None], *, name: str = "cliffguard-heartbeat") -> None:
        if interval_s <= 0:
            raise ValueError("heartbeat_s: must be > 0")
        self.interval_s = interval_s
        self._beat = beat
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.beats = 0

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def _run(self) -> None:
        while True:
            try:
                self._beat()
                self.beats += 1
            except Exception:  # noqa: BLE001 - a side thread must never take training down
                log.exception("heartbeat failed; will try again in %.1fs", self.interval_s)
            if self._stop.wait(self.interval_s):
                return

    def close(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)
