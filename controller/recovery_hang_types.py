"""What the recovery machine keeps about a run's worker group for hangs, and the node check's
input (plain data; ``controller/recovery_hang.py`` acts on it).

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
                "left_running": self.left_running}

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
                   left_running=None if d.get("left_running") is None else str(d["left_running"]))


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
