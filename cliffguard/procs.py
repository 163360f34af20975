"""Child processes of a composite command (the demo): each in its own process group, all stopped together.

Every child starts a new session (``start_new_session=True``), so a terminal's Ctrl-C reaches only
the parent, which then stops the children in reverse start order: SIGINT to the group (torchrun
and Streamlit shut down cleanly on it), SIGTERM after a grace period, SIGKILL last. Signalling the
whole group also reaches grandchildren (torchrun's workers), so nothing is left orphaned.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from cliffguard.core.pids import pid_alive

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Child:
    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    _threads: list[threading.Thread] = field(default_factory=list)

    @property
    def running(self) -> bool:
        return self.proc.poll() is None


class ProcessSet:
    """Start children with their output in log files (optionally each line also to a callback)."""

    def __init__(self) -> None:
        self.children: list[Child] = []

    def spawn(self, name: str, argv: list[str], *, env: dict[str, str], log_path: Path,
              on_line: Callable[[str], None] | None = None, cwd: str | None = None) -> Child:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        fh: IO[bytes] = log_path.open("ab")
        stdout = subprocess.PIPE if on_line else fh
        proc = subprocess.Popen(argv, env=env, stdout=stdout, stderr=subprocess.STDOUT if on_line else fh,
                                stdin=subprocess.DEVNULL, start_new_session=True, cwd=cwd)
        child = Child(name, proc, log_path)
        if on_line:
            t = threading.Thread(target=_pump, args=(proc, fh, on_line), name=f"pump-{name}", daemon=True)
            t.start()
            child._threads.append(t)
        else:
            fh.close()  # the child holds its own descriptor
        self.children.append(child)
        return child

    def stop_all(self, grace_s: float = 10.0) -> None:
        """Stop every child still running, newest first; never raises."""
        for child in reversed(self.children):
            try:
                stop_group(child.proc, grace_s)
            except Exception:  # noqa: BLE001 - one child's failure must not leave the others running
                log.exception("stopping %s", child.name)
            for t in child._threads:
                t.join(timeout=2)


def _pump(proc: subprocess.Popen[bytes], fh: IO[bytes], on_line: Callable[[str], None]) -> None:
    try:
        assert proc.stdout is not None
        for raw in proc.stdout:
            fh.write(raw)
            fh.flush()
            try:
                on_line(raw.decode("utf-8", "replace").rstrip("\n"))
            except Exception:  # noqa: BLE001 - the log keeps going even if the display fails
                log.exception("progress display")
    finally:
        fh.close()


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)  # pgid == pid: the child leads its own session
    except ProcessLookupError:
        pass


def _group_alive(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (from /proc; empty where there is no /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*/stat"):
        try:
            stat = entry.read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        children.setdefault(int(fields[1]), []).append(int(entry.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def stop_group(proc: subprocess.Popen[bytes], grace_s: float = 10.0) -> None:
    """SIGINT -> SIGTERM -> SIGKILL to the child's process group until the group is gone; then the
    same for descendants that left the group (torchrun starts each worker in its own session)."""
    tree = descendants(proc.pid)
    for sig, wait_s in ((signal.SIGINT, grace_s), (signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        if proc.poll() is not None and not _group_alive(proc.pid):
            break
        _signal_group(proc.pid, sig)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            proc.poll()
            if proc.returncode is not None and not _group_alive(proc.pid):
                break
            time.sleep(0.1)
        else:
            continue
        break
    proc.poll()
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = [p for p in tree if pid_alive(p)]
        if not alive:
            return
        log.warning("%d process(es) outlived their parent; sending %s", len(alive), signal.Signals(sig).name)
        for p in alive:
            try:
                os.kill(p, sig)
            except ProcessLookupError:
                pass
        time.sleep(2.0)
