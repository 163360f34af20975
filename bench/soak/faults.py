"""The soak's hands: the processes it runs and the faults it does to them (I/O only).

``SoakBroker`` is the ``EmbeddedBroker`` with a SIGKILL; ``ControllerProcess`` is one
``cliffguard controller`` at a time with its exits booked (asked or not, and the code);
``rank_pids`` finds the torchrun workers by their ``RANK``; a store lock is held by a child process
(``python -m bench.soak.faults --hold-lock SECONDS``, the store's URL in ``SOAK_LOCK_URL``, never on
a command line). ``INJECT`` maps each kind of ``schedule.FAULT_KINDS`` to the function doing it;
each returns once the fault is over (the target restored) with a note of what it did.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.soak.schedule import Event
from cliffguard.controller.broker import EmbeddedBroker, ensure_topics
from cliffguard.core.kafka_config import KafkaConfig
from cliffguard.procs import descendants

LOCK_URL_ENV = "SOAK_LOCK_URL"


class SoakBroker(EmbeddedBroker):
    """The embedded broker, plus the crash the soak gives it."""

    def kill(self) -> None:
        """SIGKILL the broker process (no goodbye to its clients, nothing flushed)."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
        self.stop()  # forgets the process and closes the log


RESTART_AFTER_S = 2.0
"""A controller that exited unasked is started again this long after its exit (a supervisor's
back-off: one that cannot start, say while the broker is down, is not restarted in a tight loop)."""


@dataclass
class ControllerProcess:
    """``cliffguard controller``: started, killed, stopped and continued on request; every exit kept.

    The event threads and the runner's loop call it at once, so every method holds one lock: a
    process is booked once, by whoever sees it gone, and never replaced behind another's back."""

    argv: list[str]
    env: dict[str, str]
    log_path: Path
    cwd: str
    proc: subprocess.Popen[bytes] | None = None
    exits: list[dict[str, Any]] = field(default_factory=list)
    """One per process that ended: ``rc``, ``asked`` (by the soak) and ``how``."""
    _asked: str = ""
    _restart_at: float | None = None
    _lock: threading.RLock = field(default_factory=threading.RLock)

    def start(self) -> ControllerProcess:
        with self._lock:
            if self.proc is not None and self.proc.poll() is None:
                return self
            self._reaped()
            with self.log_path.open("ab") as fh:
                self.proc = subprocess.Popen(
                    self.argv,
                    env=self.env,
                    stdout=fh,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                    cwd=self.cwd,
                )
            self._asked, self._restart_at = "", None
            return self

    def _ended(self) -> None:
        assert self.proc is not None
        self.exits.append(
            {"rc": self.proc.returncode, "asked": bool(self._asked), "how": self._asked or "unasked"}
        )
        self.proc = None

    def _reaped(self) -> bool:
        """Book an exit nobody asked for; True when there is no live process."""
        if self.proc is None:
            return True
        if self.proc.poll() is None:
            return False
        unasked = not self._asked
        self._ended()
        if unasked:
            self._restart_at = time.monotonic() + RESTART_AFTER_S
        return True

    def check(self) -> bool:
        """Book an exit nobody asked for; start a successor once its back-off passed (True then)."""
        with self._lock:
            self._reaped()
            if self.proc is None and self._restart_at is not None and time.monotonic() >= self._restart_at:
                self.start()
                return True
            return False

    def signal(self, sig: int) -> None:
        with self._lock:
            if not self._reaped():
                assert self.proc is not None
                self.proc.send_signal(sig)

    def kill(self) -> None:
        with self._lock:
            if self._reaped():
                self._restart_at = None  # the fault restarts it itself
                return
            assert self.proc is not None
            self._asked = "SIGKILL"
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(15)
            self._ended()

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM (SIGKILL past ``timeout_s``): the clean exit the soak expects to end with 0."""
        with self._lock:
            self._restart_at = None
            if self._reaped():
                self._restart_at = None
                return
            assert self.proc is not None
            self._asked = "SIGTERM"
            self.proc.send_signal(signal.SIGCONT)
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self._asked = "SIGTERM, then SIGKILL after no exit"
                self.proc.kill()
                self.proc.wait(10)
            self._ended()


def rank_pids(train_pid: int) -> dict[int, int]:
    """{rank: pid} of the torchrun workers under ``train_pid`` (their environment says RANK)."""
    out = {}
    for pid in descendants(train_pid):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"cliffguard.trainer.run" not in cmdline:
            continue
        for item in env:
            if item.startswith(b"RANK="):
                out[int(item[5:])] = pid
    return out


@dataclass
class Targets:
    """What the faults act on (the runner fills it in)."""

    broker: SoakBroker
    kafka: KafkaConfig
    controllers: list[ControllerProcess]
    """One, or several in one consumer group (a controller fault picks ``Event.which``)."""
    store_url: str
    store_env: dict[str, str]
    train_pid: Callable[[], int | None]
    cwd: str


def _controller_kill(t: Targets, e: Event) -> str:
    duration_s = e.duration_s
    c = t.controllers[e.which or 0]
    c.kill()
    time.sleep(duration_s)
    c.start()
    return "killed; restarted"


def _controller_stop(t: Targets, e: Event) -> str:
    duration_s = e.duration_s
    c = t.controllers[e.which or 0]
    c.signal(signal.SIGSTOP)
    try:
        time.sleep(duration_s)
    finally:
        c.signal(signal.SIGCONT)
    return "stopped; continued"


def _broker_kill(t: Targets, e: Event) -> str:
    duration_s = e.duration_s
    t.broker.kill()
    time.sleep(duration_s)
    t.broker.start()
    ensure_topics(t.kafka)  # what a provisioning step does; a durable broker still has them
    return "killed; restarted on the same port"


def _store_lock(t: Targets, e: Event) -> str:
    duration_s = e.duration_s
    env = {**t.store_env, LOCK_URL_ENV: t.store_url}
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.soak.faults", "--hold-lock", str(duration_s)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=t.cwd,
    )
    try:
        out, _ = proc.communicate(timeout=duration_s + 90)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        return f"lock holder did not finish: {out.decode(errors='replace')[-200:]}"
    text = out.decode(errors="replace").strip()
    return text.splitlines()[-1] if text else f"lock holder exited {proc.returncode}"


def _rank_stop(t: Targets, e: Event) -> str:
    duration_s = e.duration_s
    rank = e.rank
    pid = t.train_pid()
    pids = rank_pids(pid) if pid is not None else {}
    target = pids.get(rank or 0)
    if target is None:
        return f"rank {rank} not found (workers: {sorted(pids)})"
    os.kill(target, signal.SIGSTOP)
    try:
        time.sleep(duration_s)
    finally:
        os.kill(target, signal.SIGCONT)
    return f"rank {rank} (pid {target}) stopped; continued"


INJECT: dict[str, Callable[[Targets, Event], str]] = {
    "controller_kill": _controller_kill,
    "controller_stop": _controller_stop,
    "broker_kill": _broker_kill,
    "store_lock": _store_lock,
    "rank_stop": _rank_stop,
}


def hold_lock(url: str, seconds: float) -> str:
    """Take the store's write lock (waiting for it), hold it ``seconds``, let go; what it waited."""
    if url.startswith("sqlite"):
        import sqlite3

        from sqlalchemy.engine import make_url

        t0 = time.monotonic()
        conn = sqlite3.connect(str(make_url(url).database), timeout=120, isolation_level=None)
        conn.execute("BEGIN EXCLUSIVE")
        waited = time.monotonic() - t0
        print(f"locked after {waited:.1f}s", flush=True)
        time.sleep(seconds)
        conn.execute("COMMIT")
        conn.close()
    else:
        from sqlalchemy import text

        from cliffguard.controller.store.db import make_engine

        engine = make_engine(url)
        t0 = time.monotonic()
        with engine.begin() as c:
            c.execute(text("LOCK TABLE step_metrics IN ACCESS EXCLUSIVE MODE"))
            waited = time.monotonic() - t0
            print(f"locked after {waited:.1f}s", flush=True)
            time.sleep(seconds)
        engine.dispose()
    return f"held the store lock {seconds:.1f}s (waited {waited:.1f}s for it)"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="hold the store's write lock (the soak's store_lock fault)")
    p.add_argument("--hold-lock", type=float, required=True, metavar="SECONDS")
    args = p.parse_args(argv)
    print(hold_lock(os.environ[LOCK_URL_ENV], args.hold_lock), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
