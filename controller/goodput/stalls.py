"""What the ledger remembers of checkpoints (the snapshot stalls, the disk writes and their
interval) and of heartbeats (that a process was alive inside a gap)."""

from __future__ import annotations

from typing import Any

_KEEP_BEATS = 16


class CheckpointStats:
    def __init__(self) -> None:
        self.c: dict[str, Any] = {"stalls": 0, "stall_s": 0.0, "disk": 0, "disk_write_s": 0.0, "disk_stalls": 0,
                                  "disk_stall_s": 0.0}
        self.disk_steps: list[int] = []
        """The newest disk checkpoints' steps (their interval)."""
        self.last_stall: list[float] = []
        """[step, seconds] of the newest snapshot stall (a disk checkpoint of that step was its copy)."""

    def stall(self, step: int, seconds: float) -> None:
        self.c["stalls"] += 1
        self.c["stall_s"] += seconds
        self.last_stall = [float(step), seconds]

    def disk(self, step: int, write_s: float) -> None:
        c = self.c
        c["disk"] += 1
        c["disk_write_s"] += write_s
        if self.last_stall and self.last_stall[0] == step:
            c["disk_stalls"] += 1
            c["disk_stall_s"] += self.last_stall[1]
        if not self.disk_steps or step > self.disk_steps[-1]:
            self.disk_steps = [*self.disk_steps[-7:], step]

    def state_dict(self) -> dict[str, Any]:
        return {**self.c, "disk_steps": list(self.disk_steps), "last_stall": list(self.last_stall)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.c.update({k: state[k] for k in self.c})
        self.disk_steps = [int(s) for s in state["disk_steps"]]
        self.last_stall = [float(x) for x in state["last_stall"]]


class Beats:
    """The newest heartbeats' times after the cursor."""

    def __init__(self) -> None:
        self.ts: list[float] = []

    def add(self, ts: float, cursor: float | None) -> None:
        if cursor is not None and ts > cursor:
            self.ts.append(ts)
            del self.ts[:-_KEEP_BEATS]

    def alive_until(self, a: float, b: float) -> float | None:
        """The newest heartbeat inside (a, b), if any; those before b are used up."""
        if not self.ts:
            return None
        inside = [t for t in self.ts if a < t < b]
        self.ts = [t for t in self.ts if t >= b]
        return max(inside) if inside else None
