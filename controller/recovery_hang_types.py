"""What the recovery machine keeps about a run's worker group for hangs, the node check's input,
and the suspect-node store's input and actions (plain data; ``controller/recovery_hang.py`` and
``controller/recovery_suspect.py`` act on it).

``HangState`` is one field of ``RecoveryState``: which life of the worker group runs now and
what torchrun allows (from ``run.started``), the restarts spent (the budget's window), which
nodes hung when (a node that hangs again within ``repeat_window_s`` is left out), and the
restart under way.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any


@dataclass(frozen=True, slots=True)
class Restart:
    """A restart the machine decided (or found torchrun had made) for a hung life."""

    mode: str
    """in_place | exclude | halt (core/restart_plan.py)."""
    life: int
    """The life torn down."""
    at: float
    ranks: tuple[int, ...] = ()
    nodes: tuple[str, ...] = ()
    """The culprit ranks' nodes."""
    exclude: tuple[str, ...] = ()
    started_at: float | None = None
    """When the next life's ``run.started`` came."""
    check: str = ""
    """The next life's node check, in words."""


@dataclass(frozen=True, slots=True)
class HangState:
    life: int = 0
    max_restarts: int = 0
    restarts_left: int = 0
    nodes: int = 1
    min_nodes: int = 1
    restart_times: tuple[float, ...] = ()
    hangs: tuple[tuple[str, float], ...] = ()
    """(node, when) of each hang's culprit nodes, newest last (bounded)."""
    restart: Restart | None = None
    left_running: str | None = None
    """The incident of a hang halted with no restart to give it (the job left running): while it is
    the halted one, a step past its step means the stall ended by itself."""
    suspects: tuple[tuple[str, int], ...] = ()
    """(node, life) of each node this run recorded suspect or answered as one (controller/recovery_suspect.py),
    newest last (bounded): a suspect node's beats are answered once per life of the worker group."""
    diverged: tuple[tuple[int, int, str], ...] = ()
    """(rank, life, node; "" when unknown) of each rank an SDC rollback named, newest last (bounded): the
    same rank diverging again in that life, or on that node, is a persistent SDC (recovery_sdc.py)."""

    def started(self, life: int, max_restarts: int, restarts_left: int, nodes: int, min_nodes: int) -> HangState:
        return replace(self, life=life, max_restarts=max_restarts, restarts_left=restarts_left, nodes=nodes,
                       min_nodes=min_nodes)

    def to_dict(self) -> dict[str, Any]:
        r = self.restart
        return {"life": self.life, "max_restarts": self.max_restarts, "restarts_left": self.restarts_left,
                "nodes": self.nodes,
                "min_nodes": self.min_nodes, "restart_times": list(self.restart_times),
                "hangs": [list(h) for h in self.hangs],
                "restart": None if r is None else {"mode": r.mode, "life": r.life, "at": r.at, "ranks": list(r.ranks),
                                                   "nodes": list(r.nodes), "exclude": list(r.exclude),
                                                   "started_at": r.started_at, "check": r.check},
                "left_running": self.left_running, "suspects": [list(x) for x in self.suspects],
                "diverged": [list(x) for x in self.diverged]}

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> HangState:
        if not d:
            return cls()
        r = d.get("restart")
        restart = None if not r else Restart(
            mode=str(r["mode"]), life=int(r["life"]), at=float(r["at"]), ranks=tuple(int(x) for x in r.get("ranks", ())),
            nodes=tuple(str(x) for x in r.get("nodes", ())), exclude=tuple(str(x) for x in r.get("exclude", ())),
            started_at=r.get("started_at"), check=str(r.get("check", "")))
        return cls(life=int(d.get("life", 0)), max_restarts=int(d.get("max_restarts", 0)),
                   restarts_left=int(d.get("restarts_left", 0)), nodes=int(d.get("nodes", 1)),
                   min_nodes=int(d.get("min_nodes", 1)), restart_times=tuple(float(t) for t in d.get("restart_times", ())),
                   hangs=tuple((str(n), float(t)) for n, t in d.get("hangs", ())), restart=restart,
                   left_running=None if d.get("left_running") is None else str(d["left_running"]),
                   suspects=tuple((str(n), int(lf)) for n, lf in d.get("suspects", ())),
                   diverged=tuple((int(r), int(lf), str(n)) for r, lf, n in d.get("diverged", ())))


@dataclass(frozen=True, slots=True)
class NodeCheckIn:
    """Rank 0 reported a restarted group's node check (``node.check``)."""

    ok: bool
    life: int
    slow: tuple[int, ...]
    slow_nodes: tuple[str, ...]
    detail: str
    now: float
    step: int = 0
    nodes: tuple[str, ...] = ()
    """Every node the check covered (the event's ``nodes``, one per rank)."""
    rechecking: tuple[str, ...] = ()
    """Of ``nodes``, the suspect ones an operator asked to re-admit on a passing check (the edge
    reads them from the store: ``controller/suspects.py``)."""


@dataclass(frozen=True, slots=True)
class SuspectJoinedIn:
    """A node the store holds suspect beats in this run (its node heartbeat said so; the edge
    compared it with the store: ``controller/suspects.py``)."""

    node: str
    life: int | None
    """The worker group's life the beat came from (None: the agent did not say)."""
    cause: str
    """What made it suspect (the record's ``cause``: bad_rank, transient, hang_again, node_check_failed)."""
    why: str
    """The record's reason, for the incident and the alert."""
    since: float
    record_run: str
    record_incident: str | None
    now: float


@dataclass(frozen=True, slots=True)
class RecordSuspect:
    """Action: keep ``node`` out of every later worker group until cleared (the suspect-node store)."""

    node: str
    cause: str
    reason: str
    incident_id: str | None
    at: float
    device: int | None = None
    """A device-level eviction: only this device slot of ``node`` (the node is still admitted)."""


@dataclass(frozen=True, slots=True)
class ClearSuspect:
    """Action: a node check passed on suspect nodes an operator asked to re-admit: clear them."""

    nodes: tuple[str, ...]
    reason: str
    at: float
