"""The agent's hang part: the watchdog, the evidence it reports, and the restart command.

``HangPart`` is built by ``build_agent`` (agent/build.py) for every rank:

- ``start``: ``[agent.hang] collective_timeout_s`` on the world group the agent was given (a
  loop's own or Accelerate's; agent/hang/timeouts.py), and the watchdog (agent/hang/watchdog.py)
  on a side thread, for a distributed run;
- ``report``: an evidence capture goes to the rank's disk (the whole dump) and out as a
  ``hang.evidence`` event (bounded), which the controller stores as the run's evidence;
- ``collective_failed``: the agent's close with a collective error reports one too;
- ``urgent``: rank 0's listener hands it every verified command on its own thread. A
  ``restart`` that arrives while the training thread is stalled cannot wait for a step boundary
  that will not come: rank 0 writes the plan (core/restart_plan.py), acks, flushes its events,
  waits ``plan_grace_s`` and leaves with ``RESTART_EXIT_CODE``; torchrun then tears the group
  down (the ranks waiting in the collective fail at once, one stuck outside it is stopped by
  torchrun) and starts it again. A restart that arrives while training runs waits for the
  boundary, where every rank applies it together (the recovery kit's ``restart``);
- ``plan_for``: a restart command's arguments checked against this life (a later life acks an
  older life's restart without acting).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from cliffguard.agent.emitter import Emitter
from cliffguard.agent.hang.config import HangConfig
from cliffguard.agent.hang.evidence import Evidence, is_collective_error
from cliffguard.agent.hang.timeouts import apply_timeout
from cliffguard.agent.hang.watchdog import Progress, Watchdog
from cliffguard.agent.modes import ModeMachine
from cliffguard.agent.ranks import Ranks
from cliffguard.core.enums import AckStatus, CommandType, EventType
from cliffguard.core.events import Command
from cliffguard.core.restart_plan import (
    MODES,
    RESTART_EXIT_CODE,
    RestartPlan,
    WorkerLife,
    read_plan,
    write_plan,
)

log = logging.getLogger(__name__)

Ack = Callable[[Command, AckStatus, str], None]


class NotThisLife(ValueError):
    """A restart for an earlier life of the worker group: it happened already."""


class RestartRequested(SystemExit):
    """Raised by the recovery kit after an applied restart: the loop leaves, the process exits
    with ``RESTART_EXIT_CODE`` and torchrun starts the worker group again."""

    def __init__(self, plan: RestartPlan) -> None:
        super().__init__(RESTART_EXIT_CODE)
        self.plan = plan

    def __str__(self) -> str:
        return f"restart {self.plan.mode} of life {self.plan.life} requested ({self.plan.reason or self.plan.cmd})"


class HangPart:
    def __init__(self, config: HangConfig, run: str, ranks: Ranks, emitter: Emitter, modes: ModeMachine,
                 step: Callable[[], int], base_dir: Path, life: WorkerLife | None = None,
                 exit: Callable[[int], Any] = os._exit, progress: Progress | None = None) -> None:
        self.config = config
        self._progress = progress
        self.run = run
        self.ranks = ranks
        self.emitter = emitter
        self.modes = modes
        self._step = step
        self.life = life if life is not None else WorkerLife.from_env()
        self.evidence_dir = Path(config.evidence_dir) if config.evidence_dir else base_dir / "evidence"
        self.plan_dir = Path(config.plan_dir) if config.plan_dir else base_dir
        self._exit = exit
        self.ack: Ack | None = None
        """Rank 0's ack (the command channel's), set by build_agent."""
        self.flush: Callable[[], None] | None = None
        """Closes the sink (its events reach the broker) before rank 0 leaves."""
        self.watchdog: Watchdog | None = None
        self.evidence: list[Evidence] = []
        """What this process reported (newest last)."""
        self.leaving: RestartPlan | None = None
        self.peers_gone: Callable[[], list[int]] = lambda: []
        """This node's ranks whose process is gone (agent/node_beats.py), for the evidence."""
        self._term = threading.Event()
        self._old_term: Any = None

    def agree_life(self) -> None:
        """Make ``life`` the same on every rank (agent/hang/life.py; collective when distributed)."""
        from cliffguard.agent.hang.life import agree

        local_rank = int(os.environ.get("LOCAL_RANK", "0") or 0)
        self.life = agree(self.life, self.evidence_dir.parent, local_rank=local_rank, device=self.ranks.device,
                          distributed=self.ranks.distributed)

    def start(self) -> None:
        """The declared timeout on the group the agent was given (the world's), then the watchdog."""
        if self.ranks.distributed:
            apply_timeout(self.config.collective_timeout_s)
        if not (self.config.enabled and self.ranks.distributed) or self.watchdog is not None:
            return
        self.watchdog = Watchdog(self.config, step=self._step, mode=lambda: self.modes.mode,
                                 collective=lambda: self.ranks.collective, report=self.report,
                                 node=self.life.node, life=self.life.life, gone=lambda: self.peers_gone(),
                                 progress=self._progress).start()

    def close(self) -> None:
        if self.watchdog is not None:
            self.watchdog.close()

    @property
    def stalled(self) -> bool:
        return self.watchdog is not None and self.watchdog.stalled

    @property
    def stall_reported(self) -> bool:
        """The watchdog reported this stall (its evidence is on its way out)."""
        return self.watchdog is not None and self.watchdog.reported

    def _flush_before(self, what: str) -> None:
        """The events out (the sink closed) before this rank leaves; leaving anyway if that fails."""
        if self.flush is None:
            return
        try:
            self.flush()
        except Exception:  # noqa: BLE001 - leaving anyway
            log.exception("flushing the events before %s failed", what)

    def leave_on_signal(self, signum: int) -> None:
        """A stop signal (torchrun tearing the hung group down) reached a rank whose stall was
        reported: no step boundary will come, so the rank leaves now, after its events (the
        evidence among them) are flushed, on a thread of its own, not in the handler. Waiting for
        torchrun's SIGKILL kept a rank asleep outside a collective alive 30 s and the restart
        waited; leaving before the flush lost a rank's evidence, and its peers then named it dead."""

        def leave() -> None:
            log.error("rank %d: %s while the training thread is stalled; leaving once the events are out",
                      self.ranks.rank, signal.Signals(signum).name)
            self._flush_before("leaving")
            self._exit(128 + signum)

        threading.Thread(target=leave, name="cliffguard-leave", daemon=True).start()

    # ------------------------------------------------------------------ evidence
    def report(self, ev: Evidence) -> None:
        """The whole dump to disk (when there is one), the bounded event out."""
        self.evidence.append(ev)
        if ev.reason != "resolved":
            try:
                ev.write(self.evidence_dir, self.run, self.ranks.rank)
            except OSError as exc:
                log.warning("hang evidence not written to %s: %s", self.evidence_dir, exc)
            log.error("rank %d: training thread %s (%.1f s without a step; in %s); evidence %s",
                      self.ranks.rank, ev.reason, ev.stalled_s, ev.frame or ev.collective or "?", ev.path or "not on disk")
        self.emitter.emit(EventType.HANG_EVIDENCE, ev.event_data(frames=self.config.stack_frames,
                                                                  last=self.config.last_entries))

    def collective_failed(self, error: BaseException | str | None) -> bool:
        """The run ends on ``error``: evidence when it is a collective that failed. True when it
        is one; then torchrun's SIGTERM (it tears the group down ~0.1 s after a rank died) waits
        until ``end_deferral``, so the evidence and the run's end reach the broker first."""
        if self.watchdog is None or error is None or not is_collective_error(error):
            return False
        self._defer_sigterm()
        self.watchdog.collective_failed(error)
        return True

    def _defer_sigterm(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # only the main thread may set a handler; torchrun's SIGTERM then ends the process as usual
        self._term = threading.Event()
        self._old_term = signal.signal(signal.SIGTERM, lambda *_: self._term.set())

    def end_deferral(self) -> None:
        """After the close: SIGTERM's own handler back; one that came meanwhile ends the process now."""
        if self._old_term is None:
            return
        signal.signal(signal.SIGTERM, self._old_term)
        self._old_term = None
        if self._term.is_set():
            log.error("leaving now: torchrun asked this rank to stop while its hang evidence was sent")
            self._exit(128 + signal.SIGTERM)

    # ------------------------------------------------------------------ restart
    def plan_for(self, cmd: Command) -> RestartPlan:
        """The plan a restart command asks for in this life; ValueError when its arguments are
        wrong, NotThisLife when it is for an earlier life."""
        args: Mapping[str, Any] = cmd.args
        mode, life = str(args.get("mode", "")), int(args.get("life", -1))
        if mode not in MODES:
            raise ValueError(f"mode: one of {', '.join(MODES)}, got {mode!r}")
        if life < self.life.life:
            raise NotThisLife(f"life {life} of the worker group restarted already (this is life {self.life.life})")
        if life > self.life.life:
            raise ValueError(f"life: {life} is ahead of this worker group's life {self.life.life}")
        return RestartPlan(mode=mode, life=life, job=self.life.job, exclude_nodes=tuple(args.get("exclude_nodes", ())),
                           ranks=tuple(args.get("ranks", ())),
                           exclude_devices=tuple((str(d["node"]), int(d["slot"]))
                                                 for d in args.get("exclude_devices", ())),
                           reason=str(args.get("reason", ""))[:300],
                           incident=str(args.get("incident", "")), cmd=cmd.id)

    def write(self, plan: RestartPlan) -> Path | None:
        """Rank 0 writes the plan for the launchers and the next life."""
        if self.ranks.rank != 0:
            return None
        path = write_plan(self.plan_dir, plan)
        log.error("restart plan %s (life %d): %s; %s", plan.mode, plan.life, plan.reason or "-", path)
        return path

    def urgent(self, cmd: Command) -> bool:
        """The listener's hook (rank 0, its thread): True when the command was handled here."""
        if cmd.type is not CommandType.RESTART or not self.stalled:
            return False
        threading.Thread(target=self._leave_now, args=(cmd,), name="cliffguard-restart", daemon=True).start()
        return True

    def _leave_now(self, cmd: Command) -> None:
        ack = self.ack or (lambda c, s, d: None)
        try:
            plan = self.plan_for(cmd)
        except NotThisLife as exc:
            ack(cmd, AckStatus.APPLIED, str(exc))
            return
        except ValueError as exc:
            ack(cmd, AckStatus.REJECTED, f"invalid args: {exc}")
            return
        try:
            path = self.write(plan)
        except OSError as exc:
            ack(cmd, AckStatus.FAILED, f"cannot write the restart plan in {self.plan_dir}: {exc}")
            return
        self.leaving = plan
        ack(cmd, AckStatus.APPLIED, f"{plan.mode}: rank 0 leaves the stalled worker group (life {plan.life}) "
            f"for torchrun to restart it; plan {path}")
        self._flush_before("the restart")
        time.sleep(self.config.plan_grace_s)
        self._exit(RESTART_EXIT_CODE)

    def halted(self) -> RestartPlan | None:
        """A plan of this job that says halt (read at start: such a worker must not train)."""
        try:
            plan = read_plan(self.plan_dir)
        except ValueError as exc:
            log.warning("%s", exc)
            return None
        if plan is None or plan.mode != "halt" or (plan.job and plan.job != self.life.job):
            return None
        return plan
