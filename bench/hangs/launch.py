"""One watched ``cliffguard train`` launch: its output lines timestamped as they come, and its
worker processes by life (read from /proc every ``POLL_S``: pid, rank, life, first and last seen),
so the bench can tell when a life ended, when the next one printed a step, and whether any rank
of a torn-down life was left running."""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cliffguard.procs import ProcessSet, descendants

POLL_S = 0.2
_STEP = re.compile(r"^step\s+(\d+)/(\d+)")


@dataclass(slots=True)
class Worker:
    pid: int
    rank: int
    life: int
    first: float
    last: float


@dataclass(slots=True)
class Watched:
    name: str
    child: Any
    lines: list[tuple[float, str]] = field(default_factory=list)
    workers: dict[int, Worker] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)

    @classmethod
    def start(cls, procs: ProcessSet, name: str, argv: list[str], env: dict[str, str], log_path: Path) -> Watched:
        w = cls(name, None)
        w.child = procs.spawn(name, argv, env=env, log_path=log_path, on_line=w._line)
        threading.Thread(target=w._poll, name=f"watch-{name}", daemon=True).start()
        return w

    def _line(self, line: str) -> None:
        self.lines.append((time.time(), line))

    def _poll(self) -> None:
        while not self._stop.is_set() and self.child.running:
            now = time.time()
            for pid in descendants(self.child.proc.pid):
                env = _environ(pid)
                if env is None or "TORCHELASTIC_RESTART_COUNT" not in env or "cliffguard.trainer.run" not in _cmdline(pid):
                    continue
                w = self.workers.get(pid)
                if w is None:
                    self.workers[pid] = Worker(pid, int(env.get("RANK", -1)), int(env["TORCHELASTIC_RESTART_COUNT"]),
                                               now, now)
                else:
                    w.last = now
            self._stop.wait(POLL_S)

    def close(self) -> None:
        self._stop.set()

    @property
    def code(self) -> int | None:
        return self.child.proc.poll()

    def steps(self) -> list[tuple[float, int]]:
        """(time, step) of each progress line (``--progress-every 1``: every step rank 0 finished)."""
        return [(ts, int(m[1])) for ts, line in self.lines if (m := _STEP.match(line.strip()))]

    def lives(self) -> list[int]:
        return sorted({w.life for w in self.workers.values()})

    def life_end(self, life: int) -> float | None:
        """When the last worker of ``life`` was last seen."""
        seen = [w.last for w in self.workers.values() if w.life == life]
        return max(seen) if seen else None

    def first_exit(self, life: int) -> float | None:
        """When the first worker of ``life`` was last seen (a failure torchrun reacts to)."""
        seen = [w.last for w in self.workers.values() if w.life == life]
        return min(seen) if seen else None

    def life_start(self, life: int) -> float | None:
        seen = [w.first for w in self.workers.values() if w.life == life]
        return min(seen) if seen else None


def _environ(pid: int) -> dict[str, str] | None:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    return dict(kv.split("=", 1) for kv in raw.decode("utf-8", "replace").split("\0") if "=" in kv)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return ""
