"""Hang injectors for demos, tests and ``bench.hangs``: outside the product code, wrapped around the
bundled trainer's parts by trainer/fault_wrappers.py like the other ``--fault`` specs.

==================================  ==============================================================
``hang_rank@R:S[:SEC[:N]]``         rank R sleeps SEC s (default 3600: for good) before step S's
                                    first forward: the others wait in the step's all-reduce
``kill_in_collective@R:S``          rank R SIGKILLs itself while inside step S's collective (the
                                    DDP gradient all-reduce or the agent's), mid-collective
``stuck_loader@R:S``                rank R's data loader deadlocks fetching step S's batch (a lock
                                    taken twice): stuck in Python outside any collective
``slow_node_check@R:SEC``           rank R takes SEC s longer over each matmul of every node check
                                    of a restarted group (a slow node the check must find)
==================================  ==============================================================

Unlike the other faults these count across the run's lives (torchrun restarts the process, and
it replays the steps from a checkpoint): each fires on the first N passes over its step (N = 1
unless given) in the whole run, counted by marker files in ``state_dir`` (the run directory's
``faults/``); ``slow_node_check`` is a property of the node and fires at every check. Each firing appends ``{kind, rank, step, ts, pid, life}`` to
``state_dir/fired.jsonl``: the bench's clock of when the hang began.
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

HANG_KINDS = ("hang_rank", "kill_in_collective", "stuck_loader", "slow_node_check")
_RE = re.compile(r"^(?P<kind>" + "|".join(HANG_KINDS) + r")@(?P<args>[0-9.:]+)$")
FOREVER_S = 3600.0


def is_hang_fault(text: str) -> bool:
    return text.strip().split("@", 1)[0] in HANG_KINDS


@dataclass(frozen=True, slots=True)
class HangFault:
    kind: str
    rank: int
    step: int = 0
    seconds: float = FOREVER_S
    times: int = 1
    """Passes over ``step`` (in the whole run, across restarts) on which it fires."""

    @classmethod
    def parse(cls, text: str) -> HangFault:
        m = _RE.match(text.strip())
        if not m:
            raise ValueError(f"fault: cannot parse {text!r} (hang kinds: {', '.join(HANG_KINDS)}; e.g. hang_rank@1:30)")
        kind, parts = m["kind"], m["args"].split(":")
        try:
            if kind == "slow_node_check":
                (r, sec) = parts
                return cls(kind, int(r), seconds=float(sec))
            if kind == "hang_rank":
                if not 2 <= len(parts) <= 4:
                    raise ValueError
                return cls(kind, int(parts[0]), int(parts[1]), float(parts[2]) if len(parts) > 2 else FOREVER_S,
                           int(parts[3]) if len(parts) > 3 else 1)
            (r, at) = parts
            return cls(kind, int(r), int(at))
        except ValueError:
            raise ValueError(f"fault: bad arguments in {text!r}") from None

    def __post_init__(self) -> None:
        if self.rank < 0 or self.step < 0 or self.seconds < 0 or self.times < 1:
            raise ValueError("fault: rank, step and seconds must be >= 0 and the count >= 1")

    @property
    def name(self) -> str:
        return f"{self.kind}-r{self.rank}-s{self.step}"


class HangFaults:
    """The hang faults of one rank (see the module docstring)."""

    def __init__(self, specs: list[HangFault], rank: int, state_dir: str | Path, *,
                 sleep: Callable[[float], None] = time.sleep, kill: Callable[[], None] | None = None,
                 life: int | None = None) -> None:
        self.specs = [s for s in specs if s.rank == rank]
        self.rank = rank
        self.dir = Path(state_dir)
        self._sleep = sleep
        self._kill = kill or (lambda: os.kill(os.getpid(), signal.SIGKILL))
        self.life = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) if life is None else life
        self._checked = False
        self.collective: Callable[[], str] = lambda: ""
        """The collective the training thread is inside (the agent's note), for kill_in_collective."""

    def _fire(self, kind: str, step: int) -> HangFault | None:
        """The spec of ``kind`` at ``step`` that has passes left, counted (None: none)."""
        for s in self.specs:
            if s.kind != kind or s.step != step:
                continue
            self.dir.mkdir(parents=True, exist_ok=True)
            fired = len(list(self.dir.glob(f"{s.name}.*")))
            if fired >= s.times:
                continue
            (self.dir / f"{s.name}.{fired}").touch()
            self._record(s, step)
            return s
        return None

    def _record(self, s: HangFault, step: int) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        with (self.dir / "fired.jsonl").open("a") as fh:
            fh.write(json.dumps({"kind": s.kind, "rank": self.rank, "step": step, "ts": time.time(),
                                 "pid": os.getpid(), "life": self.life, "seconds": s.seconds}) + "\n")

    def before_forward(self, step: int) -> None:
        """hang_rank: the sleep before the step's collectives."""
        s = self._fire("hang_rank", step)
        if s is not None:
            self.hang(s.seconds)

    def hang(self, seconds: float) -> None:
        self._sleep(seconds)

    def at_batch(self, step: int) -> None:
        """stuck_loader and kill_in_collective, at the step's batch fetch."""
        if self._fire("kill_in_collective", step) is not None:
            threading.Thread(target=self._kill_inside, name="fault-kill-in-collective", daemon=True).start()
        if self._fire("stuck_loader", step) is not None:
            _deadlocked_fetch()

    def _kill_inside(self) -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.collective():
                self._kill()
                return
            time.sleep(0.002)

    def node_check_round(self, round_: int) -> None:
        """slow_node_check: the sleep before each of the check's timed matmuls."""
        for s in self.specs:
            if s.kind == "slow_node_check":
                if round_ == 0 and not self._checked:
                    self._record(s, -1)
                    self._checked = True
                self._sleep(s.seconds)


def _deadlocked_fetch() -> None:
    """A data loader whose worker never hands back its batch: a lock taken twice."""
    lock = threading.Lock()
    lock.acquire()
    lock.acquire()
