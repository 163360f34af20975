"""The command channel: rank 0's listener, the inbox, the boundary broadcast and the acks.

Rank 0 polls the ``CommandListener`` (agent/listener.py, non-blocking) right before the step's
all-reduce and writes how many commands it holds into the packed tensor's flag slot (the step
probe, agent/step_probe.py, carries it). When the flag came back set, ``poll_commands()``
broadcasts the verified commands from rank 0 (``broadcast_object_list``) and returns the same
list on every rank; the caller applies them at that step boundary and rank 0 acks (``ack``).
While paused or held there is no step to carry the flag, so ``exchange()`` broadcasts per tick.

The same slot carries a preemption request (agent/recovery/preemption.py): every rank whose
watch saw the scheduler's warning signal adds ``PREEMPT_UNIT``, so the sum says both how many
commands wait (below the unit) and whether any rank was warned (at or above it), and every rank
learns of the request at the same boundary without a collective of its own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any, Protocol, TypeVar

from cliffguard.agent.collectors.timing import StepClock
from cliffguard.agent.detail import DetailWindow, detail_steps
from cliffguard.agent.emitter import Emitter
from cliffguard.agent.ranks import Ranks
from cliffguard.core.enums import AckStatus, CommandType, EventType
from cliffguard.core.events import Command

log = logging.getLogger(__name__)

V = TypeVar("V")

PREEMPT_UNIT = float(2**20)
"""A warned rank's share of the flag slot (more than any inbox holds; sums of integers stay exact)."""


class CommandSource(Protocol):
    """Where rank 0's commands come from: the ``CommandListener``, or a test's fake."""

    def poll(self) -> Iterable[Command]: ...

    def close(self) -> None: ...


class CommandChannel:
    """See the module docstring. One per process; only rank 0 has a ``source``."""

    def __init__(self, ranks: Ranks, emitter: Emitter, detail: DetailWindow, clock: StepClock,
                 step: Callable[[], int], source: CommandSource | None = None) -> None:
        self.ranks = ranks
        self.emitter = emitter
        self.detail = detail
        self.clock = clock
        self._step = step
        self.source = source
        self._inbox: list[Command] = []  # rank 0: verified, not yet broadcast
        self._flag_seen = False
        self.preempt_pending: Callable[[], bool] = lambda: False
        """Whether this rank was warned (the recovery kit sets it to its ``PreemptionWatch``'s)."""
        self.preempt_seen = False
        """Some rank was warned, as of the last all-reduce: every rank saves at this boundary."""

    # -- the step probe's side: the flag rides on its all-reduce
    def flag(self) -> float:
        """This rank's share of the flag slot: on rank 0, how many commands wait (it polls its
        source); on a warned rank, plus ``PREEMPT_UNIT``."""
        value = PREEMPT_UNIT if self.preempt_pending() else 0.0
        if self.ranks.rank != 0:
            return value
        self._collect()
        return value + float(len(self._inbox))

    def saw_flag(self, value: float) -> None:
        """What the all-reduced flag said: whether a broadcast is due at this boundary, and
        whether any rank was warned of a preemption."""
        self._flag_seen = value % PREEMPT_UNIT > 0
        self.preempt_seen = self.preempt_seen or value >= PREEMPT_UNIT

    # -- the boundary
    def poll_commands(self) -> list[Command]:
        """At the step boundary: the commands every rank applies now (same list on every rank)."""
        if not self._flag_seen:
            return []
        self._flag_seen = False
        cmds = list(self.ranks.broadcast(self._inbox if self.ranks.rank == 0 else None) or [])
        self._inbox = []
        self.clock.restart()  # applying them is not part of the next step's time
        self._open_detail(cmds)
        return cmds

    def exchange(self, rank0_value: V | None = None) -> tuple[list[Command], V | None]:
        """While paused/held (no step to carry the flag): rank 0's queued commands and a value
        it decides (e.g. "the hold timed out"), broadcast so every rank acts on the same tick."""
        if self.ranks.rank == 0:
            self._collect()
        cmds, value = self.ranks.broadcast((self._inbox, rank0_value) if self.ranks.rank == 0 else None)
        self._inbox = []
        self._flag_seen = False
        cmds = list(cmds or [])
        self._open_detail(cmds)
        return cmds, value

    def ack(self, cmd: Command, status: AckStatus, detail: str = "", available: tuple[int, ...] | None = None) -> None:
        """Rank 0 reports a command's outcome (after applying it)."""
        if self.ranks.rank == 0:
            data: dict[str, Any] = {"cmd": cmd.id, "cmd_type": str(cmd.type), "status": str(status), "detail": detail}
            if available is not None:
                data["available"] = sorted(available)
            self.emitter.emit(EventType.COMMAND_ACK, data)

    def on_reject(self, cmd_id: str, cmd_type: str, status: AckStatus, detail: str) -> None:
        """The listener refused a command before it reached the inbox (bad signature, replay...)."""
        log.warning("command %s (%s) %s: %s", cmd_id, cmd_type, status, detail)
        self.emitter.emit(EventType.COMMAND_ACK, {"cmd": cmd_id, "cmd_type": cmd_type, "status": str(status),
                                                  "detail": detail})

    def _collect(self) -> None:
        if self.source is None:
            return
        try:
            got = list(self.source.poll())
        except Exception:  # noqa: BLE001 - a broken listener must not stop training
            log.exception("command poll failed")
            return
        self._inbox.extend(got)

    def _open_detail(self, cmds: list[Command]) -> None:
        """A detail command opens the per-rank step window on every rank at this boundary."""
        for cmd in cmds:
            if cmd.type is CommandType.DETAIL:
                try:
                    self.detail.open(self._step(), detail_steps(cmd.args))
                except (ValueError, KeyError):
                    pass  # the dispatch table rejects it with the reason
