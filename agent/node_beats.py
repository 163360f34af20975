"""Node heartbeats: one ``heartbeat`` event per node and interval, from the node's local rank 0,
carrying every local rank's newest step, age and the collective it is inside.

Each rank's heartbeat thread writes its own small file (step, time, collective, pid) into a private
per-run directory on the node; the node leader's thread reads the node's files and publishes
them. Side threads keep writing while the main thread is stuck in a collective, so a hung rank
shows a step that stops advancing (and the collective it waits in); a dead or frozen process
stops writing, so its age grows until the controller names it (controller/rules/heartbeat.py).
A rank with no file newer than the leader's start is reported with its age counted from then.

The node's ranks are ``[rank - local_rank, rank - local_rank + local_world)`` (torchrun's and
Accelerate's assignment, from ``LOCAL_RANK``/``LOCAL_WORLD_SIZE``); without them every rank is
its own node.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cliffguard.agent.spill import _private_dir
from cliffguard.core.pids import pid_alive
from cliffguard.core.rank_arrays import MAX_COLLECTIVE_CHARS

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class NodeLayout:
    rank: int
    local_rank: int
    local_world: int

    @classmethod
    def from_env(cls, rank: int, world: int, env: Mapping[str, str] | None = None) -> NodeLayout:
        env = os.environ if env is None else env
        try:
            local_rank, local_world = int(env["LOCAL_RANK"]), int(env["LOCAL_WORLD_SIZE"])
        except (KeyError, ValueError):
            return cls(rank, 0, 1)
        if not (0 <= local_rank < local_world and rank - local_rank + local_world <= world):
            return cls(rank, 0, 1)
        return cls(rank, local_rank, local_world)

    @property
    def leader(self) -> bool:
        return self.local_rank == 0

    @property
    def ranks(self) -> range:
        first = self.rank - self.local_rank
        return range(first, first + self.local_world)


class NodeBeats:
    """This rank's liveness file, and (on the node leader) the node's heartbeat arrays."""

    def __init__(self, directory: str | Path, layout: NodeLayout, *, clock: Any = time.time) -> None:
        self.dir = Path(directory)
        _private_dir(self.dir)  # the spill's rule: 0700, ours, not a planted link
        self.layout = layout
        self._clock = clock
        self._since = clock()

    def _path(self, rank: int) -> Path:
        return self.dir / f"r{rank}.json"

    def write(self, step: int, collective: str) -> None:
        """Say this rank is alive at ``step`` (atomically: a reader never sees half a file)."""
        path = self._path(self.layout.rank)
        tmp = path.with_suffix(".tmp")
        body = json.dumps({"step": int(step), "ts": self._clock(), "collective": collective[:MAX_COLLECTIVE_CHARS],
                           "pid": os.getpid()})
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, body.encode())
        finally:
            os.close(fd)
        os.replace(tmp, path)

    def read(self) -> dict[str, list[Any]]:
        """The node's arrays for a heartbeat event (``ranks``, ``steps``, ``ages_s``, ``collectives``)."""
        now = self._clock()
        out: dict[str, list[Any]] = {"ranks": [], "steps": [], "ages_s": [], "collectives": []}
        for rank in self.layout.ranks:
            step, ts, collective = self._read_one(rank)
            out["ranks"].append(rank)
            out["steps"].append(step)
            out["ages_s"].append(max(0.0, now - ts))
            out["collectives"].append(collective)
        return out

    def gone(self) -> list[int]:
        """The node's other ranks whose process is gone (dead, or a zombie its launcher has not
        reaped): named in a hang's evidence the moment this rank's collective fails."""
        out = []
        for rank in self.layout.ranks:
            if rank == self.layout.rank:
                continue
            try:
                body = json.loads(self._path(rank).read_text())
                pid, ts = int(body["pid"]), float(body["ts"])
            except (OSError, ValueError, KeyError, TypeError):
                continue
            if ts >= self._since and not pid_alive(pid):
                out.append(rank)
        return out

    def _read_one(self, rank: int) -> tuple[int, float, str]:
        try:
            body = json.loads(self._path(rank).read_text())
            step, ts, collective = int(body["step"]), float(body["ts"]), str(body["collective"])
        except (OSError, ValueError, KeyError, TypeError):
            return 0, self._since, ""
        if ts < self._since or step < 0:  # a previous life's file: not a sign of this one
            return 0, self._since, ""
        return step, ts, collective[:MAX_COLLECTIVE_CHARS]
