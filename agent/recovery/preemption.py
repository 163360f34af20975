"""The scheduler's warning signal, turned into a save at the next step boundary (issue 24).

A scheduler that preempts a job warns it first: Slurm sends SIGTERM and waits the partition's
``GraceTime`` before SIGKILL (``PreemptMode=REQUEUE``), and ``--signal=B:USR1@N`` sends SIGUSR1
``N`` seconds before a time limit. What breaks in practice is doing the save inside the signal
handler (Lightning had to move exactly that out of its handler): the handler interrupts the
training thread anywhere, mid-collective, mid-checkpoint-write. So the handler here only notes
which signal came and when (two attribute writes, no I/O, no lock), and the recovery kit acts at
the next step boundary (agent/recovery/kit.py), where every rank is between steps:

1. every rank learns of it at the same boundary: the request rides on the step's one all-reduce
   (the flag slot, agent/command_channel.py), so no rank saves alone and no extra collective runs;
2. the whole state is saved: the memory snapshot first, then the disk write of the same copy
   (the store's ``save_now``: the bundled trainer's DCP checkpoint, written and verified), waited
   for until ``deadline_s`` after the signal, and measured (``save_s``, ``margin_s``);
3. rank 0 emits ``run.preempted`` and the loop ends with ``exit_code`` (75, ``EX_TEMPFAIL``: "try
   again later"). The shipped slurm.conf has ``RequeueExit=75``, so a job that exits with it after
   a time-limit warning is requeued; a preempted job is requeued by ``PreemptMode=REQUEUE`` itself.

A restart with ``resume`` then continues exactly at the saved step (trainer/loop.py's
``resume_latest``). A second signal while the save runs changes nothing (the first one's time
is the deadline's origin).

A signal that comes once the training thread's stall was reported (the hang watchdog,
agent/hang/) ends the process at once, after its events are flushed (``HangPart.leave_on_signal``):
no step boundary will come to save at, and the signal is then torchrun tearing the hung group
down. Noted and ignored, it kept a rank asleep outside a collective alive until torchrun's SIGKILL
30 s later, and the restart waited for it.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from cliffguard.core.declared import bounded, check_declared

log = logging.getLogger(__name__)

REQUEUE_EXIT = 75
"""``EX_TEMPFAIL`` (sysexits.h): the run saved and wants to be run again (slurm.conf ``RequeueExit``)."""


@dataclass(kw_only=True, slots=True)
class PreemptionConfig:
    enabled: bool = True
    """Turn the warning signals into a save and a requeue exit (off: the signals keep their default action)."""
    signals: list[str] = field(default_factory=lambda: ["SIGTERM", "SIGUSR1"])
    """Signals that mean "you will be stopped soon": SIGTERM (Slurm preemption, within GraceTime),
    SIGUSR1 (``sbatch --signal=B:USR1@N`` before a time limit)."""
    deadline_s: float = bounded(30.0, gt=0)
    """Seconds from the signal by which the checkpoint must be verified on disk: the partition's
    ``GraceTime`` (or ``N`` of ``--signal=B:USR1@N``), less a margin for the exit."""
    exit_code: int = bounded(REQUEUE_EXIT, ge=1, le=254)
    """Exit status after a preemption save (75 = EX_TEMPFAIL; the shipped slurm.conf requeues on it)."""

    def __post_init__(self) -> None:
        check_declared(self)
        for name in self.signals:
            sig = getattr(signal, name, None)
            if not name.startswith("SIG") or not isinstance(sig, signal.Signals):
                raise ValueError(f"signals: {name!r} is not a signal name (e.g. SIGTERM, SIGUSR1)")
            if sig in (signal.SIGKILL, signal.SIGSTOP):
                raise ValueError(f"signals: {name} cannot be caught")


@dataclass(frozen=True, slots=True)
class Request:
    """A warning signal as the handler noted it."""

    signal: str
    at: float
    """``time.monotonic()`` when it arrived (the deadline's origin)."""

    def elapsed(self, now: float | None = None) -> float:
        return (time.monotonic() if now is None else now) - self.at

    def left(self, deadline_s: float, now: float | None = None) -> float:
        return deadline_s - self.elapsed(now)


class PreemptionWatch:
    """Installs the handlers (main thread only) and holds the first request. ``request`` is None
    until a configured signal arrives."""

    def __init__(self, config: PreemptionConfig, stalled: Callable[[], bool] | None = None,
                 on_stalled: Callable[[int], None] | None = None) -> None:
        self.config = config
        self.request: Request | None = None
        self._previous: dict[signal.Signals, Any] = {}
        self._stalled = stalled
        """Whether the training thread's stall was reported (no boundary will come): a signal then ends the process."""
        self._on_stalled = on_stalled
        """How it ends it (the hang part: flush, then exit, on a thread); None: the signal's default action."""

    def install(self) -> bool:
        """Handle the configured signals; False (with a warning) off the main thread, where Python
        cannot install handlers, or when the watch is off."""
        if not self.config.enabled:
            return False
        if threading.current_thread() is not threading.main_thread():
            log.warning("preemption: not on the main thread, the warning signals %s are not handled",
                        ", ".join(self.config.signals))
            return False
        for name in self.config.signals:
            sig = signal.Signals[name]
            self._previous[sig] = signal.signal(sig, self._on_signal)
        return True

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # Only note it: no I/O, no lock, no logging here (the handler runs between any two bytecodes).
        if self.request is None and self._stalled is not None and self._stalled():
            # a hung thread reaches no boundary: the process ends now (once a save is under way, a
            # second signal, e.g. torchrun's copy of the launcher's, must not end it: the request is set)
            if self._on_stalled is not None:
                self._on_stalled(signum)
            else:
                signal.signal(signum, signal.SIG_DFL)
                signal.raise_signal(signum)
            return
        if self.request is None:
            self.request = Request(signal.Signals(signum).name, time.monotonic())

    def uninstall(self) -> None:
        """Put the previous handlers back (main thread; a no-op when nothing was installed)."""
        if threading.current_thread() is not threading.main_thread():
            return
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()

    def close(self) -> None:
        """At the run's end: the previous handlers back, unless the run was warned (it is exiting to
        be requeued, and a second warning, e.g. torchrun's copy, must not kill it mid-exit)."""
        if self.request is None:
            self.uninstall()

    @property
    def requested(self) -> bool:
        return self.request is not None


def report(request: Request, config: PreemptionConfig, *, boundary_at: float, saved: dict[str, Any] | None,
           saved_at: float) -> dict[str, Any]:
    """The ``run.preempted`` payload (core/payloads.py ``RunPreemptedData``)."""
    save_s = saved_at - request.at
    verified = bool(saved and saved.get("verified")) and save_s <= config.deadline_s
    data: dict[str, Any] = {
        "signal": request.signal, "deadline_s": config.deadline_s, "save_s": round(save_s, 6),
        "margin_s": round(config.deadline_s - save_s, 6), "verified": verified,
        "wait_s": round(boundary_at - request.at, 6), "exit_code": config.exit_code,
    }
    if saved:
        data["path"] = str(saved.get("path", ""))
        data["detail"] = str(saved.get("detail", ""))
    else:
        data["detail"] = f"no verified checkpoint within {config.deadline_s:g} s of {request.signal}"
    return data
