"""One soak seed end to end (I/O): start the stack, train, fire the schedule's faults, let the
controller settle, read everything back and judge it (bench/soak/invariants.py).

Each scheduled event gets a thread that waits for its key (rank 0's progress line reaching the
step, or seconds since the first progress line), then for its target to be free (one fault per
target at a time), and does the fault (``faults.INJECT``). The threads live until the seed is torn
down: a broker is started with a parent-death signal tied to the thread that starts it, so the
thread that restarts a broker must outlive it. Events whose key never came before training ended
are booked as not fired.
"""

from __future__ import annotations

import json
import re
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.soak.collect import Settle, StorePoller, read_record, store_facts
from bench.soak.faults import INJECT, Targets
from bench.soak.invariants import Observed, check_all
from bench.soak.ledger import executed_steps
from bench.soak.schedule import KINDS, STEP, Event, Schedule
from bench.soak.stack import SeedStack, start_stack

_PROGRESS = re.compile(rb"^step\s+(\d+)/\d+", re.MULTILINE)


class Progress:
    """Rank 0's newest progress line in train.log (the step-keyed faults' clock)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.step = -1
        self.started_at: float | None = None
        """When the first progress line appeared (the wall-keyed faults' zero)."""
        self._offset = 0
        self._tail = b""

    def poll(self) -> None:
        try:
            with self.path.open("rb") as fh:
                fh.seek(self._offset)
                chunk = fh.read()
        except OSError:
            return
        self._offset += len(chunk)
        text = self._tail + chunk
        cut = text.rfind(b"\n") + 1
        self._tail = text[cut:]
        found = _PROGRESS.findall(text[:cut])
        if found:
            self.step = int(found[-1])
            if self.started_at is None:
                self.started_at = time.time()


@dataclass
class Timeline:
    """What fired when; shared by the event threads."""

    progress: Progress
    over: threading.Event = field(default_factory=threading.Event)
    """Training ended: events not fired yet are not fired."""
    teardown: threading.Event = field(default_factory=threading.Event)
    fired: list[dict[str, Any]] = field(default_factory=list)
    locks: dict[str, threading.Lock] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def due(self, e: Event) -> bool:
        if e.key == STEP:
            return self.progress.step >= e.at
        return self.progress.started_at is not None and time.time() - self.progress.started_at >= e.at

    def book(self, entry: dict[str, Any]) -> None:
        with self.lock:
            self.fired.append(entry)


def _fire(i: int, e: Event, tl: Timeline, targets: Targets) -> None:
    entry: dict[str, Any] = {"n": i, **e.to_dict(), "fired": False}
    try:
        while not tl.due(e):
            if tl.over.wait(0.2):
                entry["note"] = "training ended before its key"
                return
        target = tl.locks[e.target]
        while not target.acquire(timeout=0.2):
            if tl.over.is_set():
                entry["note"] = "training ended while its target was busy"
                return
        try:
            entry.update(fired=True, start=time.time(), at_step=tl.progress.step)
            entry["note"] = INJECT[e.kind](targets, e)
        except Exception as exc:  # noqa: BLE001 - a fault that could not be done is booked, not fatal
            entry["note"] = f"failed: {type(exc).__name__}: {exc}"
        finally:
            entry["end"] = time.time()
            target.release()
    finally:
        tl.book(entry)
        tl.teardown.wait()  # outlive whatever this thread started (see the module docstring)


def _wait(pred: Any, timeout_s: float, tick: Any, every_s: float = 0.5) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        tick()
        if pred():
            return True
        time.sleep(every_s)
    return False


def run_seed(
    schedule: Schedule,
    root: Path,
    *,
    store: str = "sqlite",
    pg_url: str | None = None,
    settle_s: float = 90.0,
    timeout_s: float = 1500.0,
    say: Any = print,
) -> dict[str, Any]:
    """Run one seed's schedule; its row (see bench/soak/__main__.py for the fields)."""
    t0 = time.time()
    d = root / f"seed-{schedule.seed}"
    stack: SeedStack = start_stack(d, schedule.seed, schedule.steps, store, pg_url, schedule.controllers)
    tl = Timeline(Progress(d / "train.log"))
    threads: list[threading.Thread] = []
    poller = None
    witness = None
    try:
        from bench.soak.witness import Witness

        witness = Witness(stack.kafka).start()
        train = stack.start_training()
        poller = StorePoller(stack.engine, stack.run).start()
        targets = Targets(
            broker=stack.broker,
            kafka=stack.kafka,
            controllers=stack.controllers,
            store_url=stack.url,
            store_env=stack.env,
            train_pid=lambda: train.pid if train.poll() is None else None,
            cwd=str(d),
        )
        tl.locks = {e.target: threading.Lock() for e in schedule.events}
        for i, e in enumerate(schedule.events, 1):
            th = threading.Thread(target=_fire, args=(i, e, tl, targets), name=f"soak-event-{i}", daemon=True)
            th.start()
            threads.append(th)

        def tick() -> None:
            tl.progress.poll()
            for i, c in enumerate(stack.controllers):
                if c.check():
                    say(f"  seed {schedule.seed}: controller {i} exited unasked; started another")

        if not _wait(lambda: train.poll() is not None, timeout_s, tick):
            say(f"  seed {schedule.seed}: training still running after {timeout_s:.0f}s; stopping it")
        train_done = time.time()
        tl.over.set()
        _wait(lambda: len(tl.fired) == len(schedule.events), 120, tick)  # faults under way end and restore
        faults_end = max([f["end"] for f in tl.fired if f.get("fired")], default=train_done)
        expected = sum(executed_steps(read_record(stack.record_path)).values())
        settle = Settle(stack.engine, stack.run, expected)
        _wait(settle, settle_s, tick, every_s=1.0)
        if not settle.complete:
            # the store stopped short: ask the controller where it is before stopping it (its log
            # gets every thread's stack, cliffguard/commands/controller.py)
            for c in stack.controllers:
                c.signal(signal.SIGUSR1)
            time.sleep(1.0)
        since = time.time()
        _wait(lambda: witness.caught_up(since), 30, tick)
        seen = witness.stop()
        for c in stack.controllers:
            c.stop()
        polls = poller.stop()
        facts = store_facts(stack.engine, stack.run)
        record = read_record(stack.record_path)
        train_rc = train.poll()
        windows = [
            (f["kind"], KINDS[f["kind"]].target, f["start"], f["end"]) for f in tl.fired if f.get("fired")
        ]
        observed = Observed(
            run=stack.run,
            steps=schedule.steps,
            training_faults=stack.training_faults,
            record=record,
            train_rc=train_rc,
            events=seen.events,
            commands_seen=seen.commands,
            store=facts,
            logs=stack.logs(),
            controller_exits=[{**e, "controller": i} for i, c in enumerate(stack.controllers) for e in c.exits],
            fault_windows=windows,
            polls=polls,
            ended_at=time.time(),
        )
        checks = check_all(observed)
        try:
            (d / "observed.json").write_text(json.dumps(observed.to_json()))
        except (OSError, TypeError, ValueError) as exc:  # --recheck cannot judge this seed again; say so
            say(f"  seed {schedule.seed}: observed.json not written: {type(exc).__name__}: {exc}")
        first = tl.progress.started_at or t0
        return {
            "seed": schedule.seed,
            "ok": all(c.count == 0 for c in checks.values()),
            "run": stack.run,
            "store": store,
            "dir": str(d),
            "wall_s": round(time.time() - t0, 1),
            "train_s": round(train_done - first, 1),
            "faults_end_s": round(faults_end - first, 1),
            "settled": settle.complete,
            "steps": schedule.steps,
            "controllers": schedule.controllers,
            "training_faults": stack.training_faults,
            "schedule": schedule.to_dict(),
            "fired": sorted(
                (
                    {**f, "start": _rel(f.get("start"), first), "end": _rel(f.get("end"), first)}
                    for f in tl.fired
                ),
                key=lambda f: f["n"],
            ),
            "checks": {name: {"count": c.count, "detail": c.detail[:10]} for name, c in checks.items()},
            "counts": {
                "steps_run": sum(executed_steps(record).values()),
                "step_rows": sum(1 for r in facts["steps"] if r["rank"] == 0),
                "events_witnessed": len(seen.events),
                "commands_witnessed": len(seen.commands),
                "witness_recreations": seen.recreations,
                "incidents": len(facts["incidents"]),
                "commands": len(facts["commands"]),
                "controller_exits": sum(len(c.exits) for c in stack.controllers),
            },
            "incidents": facts["incidents"],
        }
    finally:
        tl.over.set()
        if witness is not None:
            witness.stop()
        if poller is not None:
            poller.stop()
        stack.close()
        tl.teardown.set()
        for th in threads:
            th.join(5)


def _rel(t: float | None, zero: float) -> float | None:
    return None if t is None else round(t - zero, 1)
