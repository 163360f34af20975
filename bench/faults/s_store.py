"""Holes in the store: poisoned steps, locks, a read-only or vanished database, its password."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import threading
import time
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.exc import OperationalError

from bench.faults.harness import (
    ControllerProc,
    Ctx,
    FakeTrainer,
    Measured,
    ScenarioFailed,
    commands_of,
    controlled,
    dead_letters,
    fresh_kafka,
    raw_event,
    run_row,
    steps_stored,
    store,
    wait_until,
)
from bench.faults.registry import scenario
from cliffguard.controller.store.db import init_db, make_engine, session_scope
from cliffguard.controller.store.models import StepMetricRow
from testing.controller_service import prefix, spike
from testing.controller_stack import step_data


@scenario("h01_far_step_keeps_metrics", "1: one step event of 10^15 (or 2^31-1) folded a run's real rows",
          timeout_s=90, smoke=True)
def far_step(ctx: Ctx) -> Measured:
    m = Measured()
    with controlled(ctx, m) as lp:
        t, run = lp.trainer, "far"
        t.steps(run, 0, 149)
        t.send_raw(run, raw_event("step", run, 10**15, step_data(2.0, 0)))
        t.send(run, "step", 2**31 - 1, step_data(2.0, 0))  # the largest step the wire accepts
        m.forged_sent = 2
        t.steps(run, 150, 299)
        m.events_produced = 300
        m.recover_s = wait_until(lambda: len(steps_stored(lp.engine, run) & set(range(300))) == 300, 60,
                                 "300 real steps stored")
        with session_scope(lp.engine) as s:
            folded = s.scalars(select(StepMetricRow.step).where(StepMetricRow.run_id == run,
                                                            StepMetricRow.resolution > 1)).all()
        m.events_stored = len(steps_stored(lp.engine, run) & set(range(300))) - len(folded)
        row = run_row(lp.engine, run)
        m.forged_obeyed = int(bool(folded)) + int(bool(row and row.downsampled_below))
        m.check(not folded, f"{len(folded)} real rows folded into buckets")
        m.check(dead_letters(lp.engine).get("schema_invalid", 0) >= 1, f"10^15 not dead-lettered: {dead_letters(lp.engine)}")
        m.note(f"300/300 real rows at full resolution; dead letters {dead_letters(lp.engine)}")
    return m


@scenario("h02_huge_step_keeps_timeouts", "2: a step >= 2^63 (> 2^31 on PostgreSQL) stopped every run's timeouts",
          timeout_s=120, postgres=True)
def huge_step(ctx: Ctx) -> Measured:
    m = Measured()
    with controlled(ctx, m, kind="postgres", env={"CLIFFGUARD_RECOVERY__COMMAND_TIMEOUT_S": "3"}) as lp:
        t = lp.trainer
        t.steps("poison", 0, 9)
        for step in (2**63, 2**64 + 5, 2**31, -(2**63) - 1):
            t.send_raw("poison", raw_event("step", "poison", step, step_data(2.0, 0)))
            m.forged_sent += 1
        t.steps("poison", 10, 19)
        prefix(t, "innocent")
        spike(t, "innocent", 41)
        first = t.expect("innocent", "pause", 60)  # never acked: its timeout must still fire
        t0 = time.monotonic()
        again = t.expect("innocent", "pause", 30)
        m.recover_s = time.monotonic() - t0
        m.check(again.id != first.id, "the resent pause has a new id")
        wait_until(lambda: len(steps_stored(lp.engine, "poison")) >= 20, 30, "the poison run's 20 real steps")
        m.events_produced = 20 + 44
        m.events_stored = len(steps_stored(lp.engine, "poison") & set(range(20)))
        m.events_stored += len(steps_stored(lp.engine, "innocent") & set(range(44)))
        rows = commands_of(lp.engine, "innocent")
        m.commands_sent, m.commands_obeyed = len(rows), len(t.received.get("innocent", []))
        m.check(dead_letters(lp.engine).get("schema_invalid", 0) >= 4, f"dead letters {dead_letters(lp.engine)}")
        m.check(lp.ctl.alive, "the controller is still up")
        m.note(f"innocent run's pause timed out and was resent after {m.recover_s:.1f}s (PostgreSQL)")
    return m


class _Lock:
    """An exclusive SQLite lock held by another connection (a backup, a sqlite3 shell) for ``seconds``."""

    def __init__(self, path: str, seconds: float) -> None:
        self.path, self.seconds = path, seconds
        self.held = threading.Event()
        self.thread = threading.Thread(target=self._hold, daemon=True)

    def _hold(self) -> None:
        con = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        con.execute("BEGIN EXCLUSIVE")
        self.held.set()
        time.sleep(self.seconds)  # the fault itself: how long the lock is held
        con.execute("ROLLBACK")
        con.close()

    def __enter__(self) -> _Lock:
        self.thread.start()
        self.held.wait(30)
        return self

    def __exit__(self, *exc: object) -> None:
        self.thread.join(self.seconds + 30)


@scenario("h05_sqlite_lock_loses_nothing", "5: a long SQLite lock made a batch fail and one event was skipped",
          timeout_s=150)
def sqlite_lock(ctx: Ctx) -> Measured:
    m = Measured()
    with controlled(ctx, m, env={"CLIFFGUARD_STORE__BUSY_TIMEOUT_MS": "500"}) as lp:
        t, run = lp.trainer, "locked"
        t.steps(run, 0, 9)
        wait_until(lambda: len(steps_stored(lp.engine, run)) >= 10, 60, "10 steps before the lock")
        path = lp.url.removeprefix("sqlite:///")
        with _Lock(path, 12.0):
            t.steps(run, 10, 59)  # arrive while the store is locked well past busy_timeout
        t0 = time.monotonic()
        m.events_produced = 60
        wait_until(lambda: len(steps_stored(lp.engine, run)) >= 60, 90, "60 steps after the lock")
        m.recover_s = time.monotonic() - t0
        m.events_stored = len(steps_stored(lp.engine, run) & set(range(60)))
        m.check(sum(dead_letters(lp.engine).values()) == 0, f"dead letters {dead_letters(lp.engine)}")
        m.note(f"lock held 12 s (busy_timeout 0.5 s); {m.events_stored} of 60 rows, "
               f"{sum(dead_letters(lp.engine).values())} dead letters")
    return m


def _read_only(path: Path) -> bool:
    """Remount ``path`` read-only (a bind mount onto itself); False where mounts are not permitted."""
    r = subprocess.run(["mount", "--bind", str(path), str(path)], capture_output=True)
    if r.returncode:
        return False
    if subprocess.run(["mount", "-o", "remount,bind,ro", str(path)], capture_output=True).returncode:
        subprocess.run(["umount", str(path)], capture_output=True)
        return False
    return True


def _exits_clearly(ctl: ControllerProc, m: Measured, words: tuple[str, ...], timeout_s: float) -> None:
    try:
        m.recover_s = wait_until(lambda: not ctl.alive, timeout_s, "the controller stops")
    except ScenarioFailed:
        m.check(False, f"the controller kept running {timeout_s:.0f}s on a broken store")
        return
    code = ctl.proc.returncode if ctl.proc else None
    ctl.expected_exit = True  # the exit asked for by the scenario's fault
    m.check(code is not None and code > 0, f"exit code {code} (want > 0, not a signal)")
    tail = ctl.log_text()[-2000:].lower()
    m.check(any(w in tail for w in words), f"no clear error ({'/'.join(words)}) in the log: {tail[-300:]!r}")


@scenario("h06_read_only_store_stops", "6: a read-only database file killed the controller with SIGBUS",
          timeout_s=150)
def read_only_store(ctx: Ctx) -> Measured:
    m = Measured()
    kafka = fresh_kafka(ctx.bootstrap)
    root = ctx.tmp / "ro"
    root.mkdir()
    url = f"sqlite:///{root / 'store.db'}"
    init_db(make_engine(url))
    t = FakeTrainer(kafka)
    ctl = ControllerProc(kafka, url, ctx.path("controller.log")).start()
    mounted = False
    try:
        engine = make_engine(url)
        t.steps("ro", 0, 49)
        wait_until(lambda: len(steps_stored(engine, "ro")) >= 50, 60, "50 steps before the fault")
        mounted = _read_only(root)
        if not mounted:
            raise ScenarioFailed("cannot remount the store read-only here (mount not permitted)")
        t.steps("ro", 50, 99)
        _exits_clearly(ctl, m, ("read-only", "readonly", "read only"), 60)
        subprocess.run(["umount", str(root)], check=True)
        mounted = False
        ctl2 = ControllerProc(kafka, url, ctx.path("controller.log"), group=ctl.group).start()
        try:
            m.events_produced = 100
            wait_until(lambda: len(steps_stored(engine, "ro")) >= 100, 60, "100 steps after the store is writable")
            m.events_stored = len(steps_stored(engine, "ro") & set(range(100)))
            m.note(f"exit code {ctl.proc.returncode if ctl.proc else None} after {_secs(m.recover_s)}; after the "
                   f"remount a restart stored {m.events_stored} of 100 rows")
        finally:
            if ctl2.crashed:
                m.crashes += 1
            ctl2.stop()
    finally:
        if mounted:
            subprocess.run(["umount", str(root)])
        if ctl.crashed:
            m.crashes += 1
        ctl.stop()
        t.close()
    return m


@scenario("h06_deleted_store_stops", "6: a deleted store directory gave 40 s of 'successful' commits",
          timeout_s=150)
def deleted_store(ctx: Ctx) -> Measured:
    m = Measured()
    kafka = fresh_kafka(ctx.bootstrap)
    root = ctx.tmp / "gone"
    url = f"sqlite:///{root / 'store.db'}"
    t = FakeTrainer(kafka)
    ctl = ControllerProc(kafka, url, ctx.path("controller.log")).start()
    try:
        t.steps("gone", 0, 99)
        wait_until(lambda: _stored_count(url, "gone") >= 100, 60, "100 steps before the fault")
        shutil.rmtree(root)
        t.steps("gone", 100, 299)
        _exits_clearly(ctl, m, ("store", "database"), 60)
        # a new, empty store beside offsets committed to Kafka: everything comes back from the log start
        ctl2 = ControllerProc(kafka, url, ctx.path("controller.log"), group=ctl.group).start()
        try:
            m.events_produced = 300
            try:
                wait_until(lambda: _stored_count(url, "gone") >= 300, 60, "300 steps in the new store")
            except ScenarioFailed as exc:
                m.check(False, str(exc))
            m.events_stored = _stored_count(url, "gone")
            m.note(f"exit code {ctl.proc.returncode if ctl.proc else None} after {_secs(m.recover_s)}; the new "
                   f"empty store rebuilt from the log start: {m.events_stored} of 300 rows")
        finally:
            if ctl2.crashed and ctl2.proc and ctl2.proc.returncode < 0:
                m.crashes += 1
            ctl2.stop()
    finally:
        if ctl.crashed:
            m.crashes += 1
        ctl.stop()
        t.close()
    return m


def _secs(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}s"


def _stored_count(url: str, run: str) -> int:
    """Steps of ``run`` in the SQLite store at ``url``; 0 while it does not exist or is not migrated yet."""
    if not Path(url.removeprefix("sqlite:///")).exists():
        return 0
    engine = make_engine(url)
    try:
        return len(steps_stored(engine, run) & set(range(10**6)))
    except OperationalError:
        return 0
    finally:
        engine.dispose()


@scenario("h15_pg_password_not_on_command_line", "15: the PostgreSQL password put on the command line",
          timeout_s=90, postgres=True)
def pg_password(ctx: Ctx) -> Measured:
    from sqlalchemy.engine import URL, make_url

    m = Measured()
    assert ctx.pg_url is not None
    with store(ctx, "postgres") as (engine, url):
        full = make_url(url)
        password = full.password
        bare = URL.create(full.drivername, full.username, None, full.host, full.port, full.database,
                          full.query).render_as_string(hide_password=False)
        pgpass = ctx.path("pgpass")
        pgpass.write_text(f"{full.host}:{full.port}:{full.database}:{full.username}:{password}\n")
        os.chmod(pgpass, 0o600)
        kafka = fresh_kafka(ctx.bootstrap)
        ctl = ControllerProc(kafka, bare, ctx.path("controller.log"), env={"PGPASSFILE": str(pgpass)}).start()
        t = FakeTrainer(kafka)
        try:
            t.steps("pw", 0, 29)
            m.events_produced = 30
            wait_until(lambda: len(steps_stored(engine, "pw")) >= 30, 60, "30 steps stored via a pgpass file")
            m.events_stored = len(steps_stored(engine, "pw"))
            assert ctl.proc is not None
            cmdline = Path(f"/proc/{ctl.proc.pid}/cmdline").read_bytes().decode(errors="replace")
            m.check(str(password) not in cmdline, "the password is on the controller's command line")
            m.check(str(password) not in ctl.log_text(), "the password is in the controller's log")
            root = Path(__file__).resolve().parents[2]
            shown = [p.name for p in [root / "README.md", *sorted((root / "docs").rglob("*.md"))]
                     if ":pass@" in p.read_text()]
            m.check(not shown, f"the docs still show a password inside the PostgreSQL URL: {shown}")
            m.note("controller on a URL without password (pgpass file): not in its command line or log")
        finally:
            t.close()
            if ctl.crashed:
                m.crashes += 1
            ctl.stop()
    return m
