"""The hang watchdog: a side thread that notices the training thread has stopped finishing steps.

Every ``check_every_s`` it reads the step counter and the mode (both kept by the training thread;
reading them takes no lock and no collective). While the mode is ``running`` and the step has
moved at least once in this life, a step that has not moved for ``dump_after_s`` is a stall: the
watchdog captures this rank's evidence (agent/hang/evidence.py) and hands it to ``report`` once
per stall. Every rank of a hung group stalls within a moment of the others (those waiting in the
collective and the one that never entered it), so every live rank reports; a dead one does not,
which is itself the evidence. When the step moves again after a report, a ``resolved`` report
follows (the controller then drops an episode it has not decided yet).

A pause, a hold, a validation or the node check are not stalls: the clock restarts when the mode
comes back to ``running``. ``collective_failed`` is the other way in: a collective that raised (a
timeout, a peer gone) reports at once, unless this stall was reported already.

The training thread also marks its own progress (``progress``: steps closed in this process and
the monotonic time of the last step close or mode change), and the watchdog trusts those marks
over what it saw itself. A side thread can be starved of the GIL for as long as the training
thread is busy: on a loaded 2-core box the watchdog's first look came only when the group hung,
saw the step for the first time, never saw it move, and so never judged the stall (the collective
timeout found it 30 s later instead). The marks are two plain stores per step on the training thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from cliffguard.agent.hang.config import HangConfig
from cliffguard.agent.hang.evidence import Evidence, capture, raised_at
from cliffguard.core.enums import TrainerMode

log = logging.getLogger(__name__)

Report = Callable[[Evidence], None]
Progress = Callable[[], "tuple[int, float]"]
"""``(steps closed in this process, monotonic time of the last step close or mode change)``,
written by the training thread (agent/step_probe.py, agent/modes.py)."""


class Watchdog:
    def __init__(self, config: HangConfig, *, step: Callable[[], int], mode: Callable[[], TrainerMode],
                 collective: Callable[[], str], report: Report, node: str, life: int,
                 clock: Callable[[], float] = time.monotonic, training: int | None = None,
                 gone: Callable[[], list[int]] = lambda: [], progress: Progress | None = None) -> None:
        self.config = config
        self._step, self._mode, self._collective = step, mode, collective
        self._report = report
        self._gone = gone
        self._progress = progress
        self.node, self.life = node, life
        self._clock = clock
        self._training = training if training is not None else threading.main_thread().ident
        self._last_step: int | None = None
        self._since = clock()
        self._moved = False  # the step moved at least once while running in this life
        self._running = False
        self.reported = False
        """This stall was reported (cleared when the step moves again)."""
        self.reports = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cliffguard-hang-watchdog", daemon=True)

    def start(self) -> Watchdog:
        self._thread.start()
        return self

    def close(self, timeout: float = 2.0) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    @property
    def stalled_s(self) -> float:
        """How long the training thread has not finished a step while running (0 when not judged)."""
        if not (self._running and self._moved):
            return 0.0
        return self._clock() - self._since

    @property
    def stalled(self) -> bool:
        """The training thread is in a stall long enough to dump (or already reported)."""
        return self.reported or self.stalled_s >= self.config.dump_after_s

    def check(self) -> Evidence | None:
        """One look (the thread calls it every ``check_every_s``); the evidence when it reported."""
        now = self._clock()
        step, running = self._step(), self._mode() is TrainerMode.RUNNING
        if running and not self._running:
            self._since = now  # back to running: a pause or a validation is not a stall
        self._running = running
        if step != self._last_step:
            first = self._last_step is None
            self._last_step, self._since = step, now
            if not first and running:
                self._moved = True
            if self.reported:
                self.reported = False
                return self._emit("resolved", 0.0, stacks=False)
            if self._progress is None or not first:
                return None
        if self._progress is not None:
            closed, marked_at = self._progress()
            if closed > 0 and running:
                # the training thread's own marks: what it closed and when, whether or not this thread saw it
                self._moved = True
                self._since = min(marked_at, now)
        if running and self._moved and not self.reported and now - self._since >= self.config.dump_after_s:
            return self._emit("stalled", now - self._since)
        return None

    def collective_failed(self, error: BaseException | str) -> Evidence | None:
        """A collective raised on the training thread: report now unless this stall was reported.
        The frame is where the exception came from (the capture runs on the closing thread)."""
        if self.reported:
            return None
        text = f"{type(error).__name__}: {error}" if isinstance(error, BaseException) else str(error)
        tb = error.__traceback__ if isinstance(error, BaseException) else None
        return self._emit("collective_error", self.stalled_s, error=text, raised_at=raised_at(tb))

    def _emit(self, reason: str, stalled_s: float, *, error: str = "", stacks: bool = True,
              raised_at: str = "") -> Evidence | None:
        with self._lock:
            if reason != "resolved":
                self.reported = True
            self.reports += 1
            if stacks:
                ev = capture(reason, stalled_s=stalled_s, node=self.node, life=self.life,
                             collective=self._collective(), error=error, training=self._training)
                ev.raised_at = raised_at
                try:
                    ev.gone = self._gone()
                except Exception:  # noqa: BLE001 - the rest of the evidence still goes out
                    log.exception("reading the node's ranks failed")
            else:
                ev = Evidence(reason=reason, stalled_s=stalled_s, node=self.node, life=self.life,
                              collective="", fr={}, stacks=[])
            try:
                self._report(ev)
            except Exception:  # noqa: BLE001 - a side thread never takes training down
                log.exception("reporting hang evidence failed")
            return ev

    def _run(self) -> None:
        while not self._stop.wait(self.config.check_every_s):
            try:
                self.check()
            except Exception:  # noqa: BLE001
                log.exception("hang watchdog check failed; it goes on")
