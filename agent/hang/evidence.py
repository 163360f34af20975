"""One rank's evidence of a hang: its Flight Recorder's sequence numbers and its Python stacks.

``capture`` reads, from any thread and without a collective (the group may be the thing that is
stuck):

- the Flight Recorder (``torch._C._distributed_c10d._dump_fr_trace_json``): per process group the
  sequence number of the last collective this rank *enqueued*, *started* and *completed*, and the
  entries still in flight. Across ranks these name the culprit: the rank whose ``enqueued`` is
  behind never entered the collective the others wait in (controller/hang_culprit.py);
- every thread's Python stack (``sys._current_frames``), and the training thread's innermost
  frame outside the standard library and torch: where a rank that never entered is stuck (a
  data loader's lock, a sleep, a checkpoint write).

``Evidence.event_data`` is the bounded ``hang.evidence`` payload (core/payloads.py);
``Evidence.write`` keeps the whole dump (every frame and entry) as JSON on the rank's disk.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import sysconfig
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

_STDLIB = (sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"])
_TORCH = f"{os.sep}torch{os.sep}"


def flight_recorder() -> dict[str, Any]:
    """The process's Flight Recorder as parsed JSON ({} when torch has none to give)."""
    try:
        import torch._C._distributed_c10d as c10d

        return json.loads(c10d._dump_fr_trace_json(includeCollectives=True, onlyActive=False))
    except Exception as exc:  # noqa: BLE001 - evidence is best effort; its absence is reported
        log.warning("no Flight Recorder trace: %s", exc)
        return {}


def pg_status(fr: dict[str, Any]) -> dict[str, dict[str, int]]:
    """process group id -> {"enqueued", "started", "completed"} (-1 = none yet)."""
    out: dict[str, dict[str, int]] = {}
    for pg, st in (fr.get("pg_status") or {}).items():
        out[str(pg)] = {"enqueued": _int(st.get("last_enqueued_collective")),
                        "started": _int(st.get("last_started_collective")),
                        "completed": _int(st.get("last_completed_collective"))}
    return out


def _int(v: Any) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        return -1


def _entry(e: dict[str, Any], now_ns: int) -> dict[str, Any]:
    pg = e.get("process_group") or ["", ""]
    created = int(e.get("time_created_ns") or 0)
    return {"pg": str(pg[0]), "pg_name": str(pg[1]) if len(pg) > 1 else "", "seq": _int(e.get("collective_seq_id")),
            "op": str(e.get("profiling_name", "")), "sizes": e.get("input_sizes", []),
            "state": str(e.get("state", "")), "age_s": round(max(now_ns - created, 0) / 1e9, 3) if created else None,
            "timeout_ms": e.get("timeout_ms")}


def in_flight(fr: dict[str, Any], status: dict[str, dict[str, int]], now_ns: int | None = None) -> list[dict[str, Any]]:
    """Entries enqueued after their group's last completed collective, oldest first."""
    now_ns = time.time_ns() if now_ns is None else now_ns
    out = []
    for e in fr.get("entries") or []:
        pg = str((e.get("process_group") or [""])[0])
        done = status.get(pg, {}).get("completed", -1)
        if _int(e.get("collective_seq_id")) > done and not e.get("is_p2p"):
            out.append(_entry(e, now_ns))
    return out


def is_library(filename: str) -> bool:
    """The standard library's and torch's own frames (never where a culprit is stuck *in its code*)."""
    return filename.startswith(_STDLIB) or _TORCH in filename or filename.startswith("<")


def _where(fs: traceback.FrameSummary) -> str:
    return f"{fs.filename}:{fs.lineno} in {fs.name}"


@dataclass(slots=True)
class ThreadStack:
    name: str
    ident: int
    main: bool
    frames: list[str]
    """Outermost first, as a traceback prints them."""
    frame: str
    """The innermost frame outside the standard library and torch ("" when none)."""


def thread_stacks(training: int | None = None) -> list[ThreadStack]:
    """Every thread's Python stack; ``training`` (a thread ident, default the main thread) is
    marked ``main`` and listed first."""
    training = threading.main_thread().ident if training is None else training
    names = {t.ident: t.name for t in threading.enumerate()}
    out = []
    for ident, top in sys._current_frames().items():
        summary = traceback.extract_stack(top)
        own = [fs for fs in summary if not is_library(fs.filename)]
        out.append(ThreadStack(name=names.get(ident, f"thread-{ident}"), ident=ident, main=ident == training,
                               frames=[_where(fs) for fs in summary], frame=_where(own[-1]) if own else ""))
    out.sort(key=lambda t: (not t.main, t.name))
    return out


@dataclass(slots=True)
class Evidence:
    """One capture (see the module docstring)."""

    reason: str
    stalled_s: float
    node: str
    life: int
    collective: str
    fr: dict[str, Any]
    stacks: list[ThreadStack]
    error: str = ""
    raised_at: str = ""
    """Where a failed collective's exception came from ("file:line in function", outside the libraries)."""
    gone: list[int] = field(default_factory=list)
    """This node's other ranks whose process was gone at the capture (agent/node_beats.py)."""
    local_world: int = field(default_factory=lambda: int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))
    pid: int = field(default_factory=os.getpid)
    ts: float = field(default_factory=time.time)
    path: str = ""

    @property
    def pg_status(self) -> dict[str, dict[str, int]]:
        return pg_status(self.fr)

    @property
    def frame(self) -> str:
        if self.raised_at:
            return self.raised_at
        main = next((t for t in self.stacks if t.main), None)
        return main.frame if main is not None else ""

    def event_data(self, *, frames: int = 30, last: int = 8) -> dict[str, Any]:
        """The bounded ``hang.evidence`` payload: ``frames`` innermost frames per thread, the
        ``last`` newest Flight Recorder entries."""
        status = self.pg_status
        now_ns = int(self.ts * 1e9)
        entries = self.fr.get("entries") or []
        data: dict[str, Any] = {
            "reason": self.reason, "stalled_s": round(self.stalled_s, 3), "node": self.node,
            "local_world": self.local_world, "pid": self.pid,
            "life": self.life, "collective": self.collective, "fr": bool(entries), "pg_status": status,
            "in_flight": in_flight(self.fr, status, now_ns)[:16],
            "last": [_entry(e, now_ns) for e in entries[-last:]] if last else [],
            "frame": self.frame,
            "stacks": [{"name": t.name, "main": t.main, "frame": t.frame, "frames": t.frames[-frames:]}
                       for t in self.stacks[:32]],
        }
        if self.error:
            data["error"] = self.error[:2000]
        if self.gone:
            data["gone"] = list(self.gone)
        if self.path:
            data["path"] = self.path
        return data

    def write(self, directory: str | Path, run: str, rank: int) -> Path:
        """The whole dump as JSON (0600) in ``directory``; sets ``path``."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = d / f"hang-{run}-r{rank}-life{self.life}-{int(self.ts * 1000)}.json"
        body = {"run": run, "rank": rank, "reason": self.reason, "ts": self.ts, "stalled_s": self.stalled_s,
                "node": self.node, "pid": self.pid, "life": self.life, "collective": self.collective,
                "error": self.error, "flight_recorder": self.fr,
                "stacks": [{"name": t.name, "ident": t.ident, "main": t.main, "frame": t.frame, "frames": t.frames}
                           for t in self.stacks]}
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(body, fh, default=str)
        self.path = str(path)
        return path


def raised_at(tb: Any) -> str:
    """The innermost frame of a traceback outside the standard library and torch ("" when none)."""
    own = [fs for fs in traceback.extract_tb(tb) if not is_library(fs.filename)] if tb is not None else []
    return _where(own[-1]) if own else ""


def capture(reason: str, *, stalled_s: float, node: str, life: int, collective: str = "", error: str = "",
            training: int | None = None) -> Evidence:
    """Read this process's Flight Recorder and stacks now (any thread; no collective)."""
    return Evidence(reason=reason, stalled_s=stalled_s, node=node, life=life, collective=collective,
                    fr=flight_recorder(), stacks=thread_stacks(training), error=error)


_COLLECTIVE_ERRORS = ("Timed out waiting", "Connection closed by peer", "Connection reset by peer",
                      "ProcessGroupGloo", "gloo", "NCCL", "Broken pipe", "timed out")


def is_collective_error(exc: BaseException | str | None) -> bool:
    """Whether ``exc`` is a collective that failed (a timeout, a peer gone), not the loop's own bug."""
    if exc is None or isinstance(exc, str):
        return False
    try:
        import torch.distributed as dist

        if isinstance(exc, dist.DistError):
            return True
    except (ImportError, AttributeError):
        pass
    return isinstance(exc, RuntimeError) and any(s in str(exc) for s in _COLLECTIVE_ERRORS)
