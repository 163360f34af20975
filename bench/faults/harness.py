"""What every fault scenario uses: its context, topics and stores, the controller as a real
``cliffguard controller`` process, waits with explicit deadlines, and reads of the store.

The scripted trainer (``FakeTrainer``) and the store set-up are the tests' own
(testing/controller_service.py), so the suite and the tests fake a trainer the same way.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, func, select

from cliffguard.controller.broker import ensure_topics
from cliffguard.controller.store.db import session_scope
from cliffguard.controller.store.models import CommandRow, DlqCountRow, IncidentRow, RunRow, StepMetricRow
from cliffguard.core.events import encode_event, make_event
from cliffguard.core.kafka_config import KafkaConfig
from testing.controller_service import FAST_GROUP, SECRET, FakeTrainer, store_engine

__all__ = ["SECRET", "Ctx", "ControllerProc", "FakeTrainer", "Measured", "ScenarioFailed", "fresh_kafka",
           "raw_event", "store", "wait_until"]

REPO = Path(__file__).resolve().parents[2]


class ScenarioFailed(AssertionError):
    """A check of a scenario did not hold (the row is ``failed``, with this message)."""


@dataclass
class Measured:
    """The counts a scenario measured; ``failures`` lists the checks that did not hold."""

    events_produced: int = 0
    events_stored: int = 0
    commands_sent: int = 0
    commands_obeyed: int = 0
    forged_sent: int = 0
    forged_obeyed: int = 0
    duplicate_commands: int = 0
    rollbacks: int = 0
    recover_s: float | None = None
    crashes: int = 0
    detail: str = ""
    failures: list[str] = field(default_factory=list)

    @property
    def lost_events(self) -> int:
        return max(0, self.events_produced - self.events_stored)

    def check(self, ok: bool, what: str) -> bool:
        """Record a failed check (the scenario goes on measuring); returns ``ok``."""
        if not ok:
            self.failures.append(what)
        return ok

    def note(self, text: str) -> None:
        self.detail = f"{self.detail}; {text}" if self.detail else text

    def to_dict(self) -> dict[str, Any]:
        return {"events_produced": self.events_produced, "events_stored": self.events_stored,
                "lost_events": self.lost_events, "commands_sent": self.commands_sent,
                "commands_obeyed": self.commands_obeyed, "forged_sent": self.forged_sent,
                "forged_obeyed": self.forged_obeyed, "duplicate_commands": self.duplicate_commands,
                "rollbacks": self.rollbacks, "recover_s": self.recover_s, "crashes": self.crashes,
                "detail": self.detail, "failures": self.failures}


@dataclass(frozen=True)
class Ctx:
    """Where a scenario runs: the suite's broker, its PostgreSQL (if any), a private temp dir."""

    bootstrap: str
    pg_url: str | None
    tmp: Path

    def path(self, *parts: str) -> Path:
        p = self.tmp.joinpath(*parts)
        p.parent.mkdir(parents=True, exist_ok=True)
        return p


def fresh_kafka(bootstrap: str, partitions: int = 1) -> KafkaConfig:
    """Topics of their own on ``bootstrap`` (a unique prefix), created now."""
    cfg = KafkaConfig(bootstrap=bootstrap, topic_prefix=f"f{uuid.uuid4().hex[:10]}", partitions=partitions)
    ensure_topics(cfg)
    return cfg


def wait_until(pred: Callable[[], Any], timeout_s: float, what: str, every_s: float = 0.1) -> float:
    """Poll ``pred`` until true; the seconds it took, or ScenarioFailed naming ``what``."""
    t0 = time.monotonic()
    while True:
        if pred():
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout_s:
            raise ScenarioFailed(f"{what}: not within {timeout_s:.0f}s")
        time.sleep(every_s)


def raw_event(type: str, run: str, step: int, data: dict, **envelope: Any) -> bytes:
    """A well-formed event's bytes with envelope fields overridden (a step or ts the codec refuses)."""
    obj = json.loads(encode_event(make_event(type, run, 0, data)))
    obj["step"] = step
    obj.update(envelope)
    return json.dumps(obj).encode()


@contextmanager
def store(ctx: Ctx, kind: str = "sqlite") -> Iterator[tuple[Engine, str]]:
    """A migrated store (SQLite file or a fresh PostgreSQL schema, dropped afterwards)."""
    if kind == "postgres" and not ctx.pg_url:
        raise ScenarioFailed("PostgreSQL wanted but the suite has none")
    root = ctx.tmp / f"store-{uuid.uuid4().hex[:6]}"
    root.mkdir(parents=True)
    with store_engine(kind, root, ctx.pg_url) as pair:
        yield pair


# -- the controller process -------------------------------------------------------------------

CONTROLLER_ENV = {
    "CLIFFGUARD_CONTROLLER__SESSION_TIMEOUT_MS": str(FAST_GROUP["session_timeout_ms"]),
    "CLIFFGUARD_CONTROLLER__HEARTBEAT_INTERVAL_MS": str(FAST_GROUP["heartbeat_interval_ms"]),
    "CLIFFGUARD_CONTROLLER__MAX_POLL_INTERVAL_MS": str(FAST_GROUP["max_poll_interval_ms"]),
    "CLIFFGUARD_CONTROLLER__OUTBOX_INTERVAL_S": "0.2",
    "CLIFFGUARD_CONTROLLER__TICK_S": "0.2",
    "CLIFFGUARD_RECOVERY__STABLE_WINDOW": "5",
    "CLIFFGUARD_RECOVERY__RECOVER_WINDOW": "5",
}


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a child process: this checkout first on the path, the suite's secret."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
           "CLIFFGUARD_COMMAND_SECRET": SECRET.reveal().decode()}
    env.update(extra or {})
    return env


class ControllerProc:
    """One ``cliffguard controller`` process; an exit we did not ask for is a crash."""

    def __init__(self, kafka: KafkaConfig, db_url: str, log_path: Path, *, group: str | None = None,
                 env: dict[str, str] | None = None, args: list[str] | None = None) -> None:
        self.kafka, self.db_url, self.log_path = kafka, db_url, log_path
        self.group = group or f"faults-{uuid.uuid4().hex[:6]}"
        self.env = child_env({**CONTROLLER_ENV, **(env or {})})
        self.args = args or []
        self.proc: subprocess.Popen[bytes] | None = None
        self.expected_exit = False
        self.starts = 0

    def start(self) -> ControllerProc:
        cmd = [sys.executable, "-m", "cliffguard.cli", "controller", "--bootstrap", self.kafka.bootstrap,
               "--topic-prefix", self.kafka.topic_prefix, "--db", self.db_url, "--group", self.group, *self.args]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as fh:
            self.proc = subprocess.Popen(cmd, env=self.env, stdout=fh, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True, cwd=str(REPO))
        self.expected_exit = False
        self.starts += 1
        return self

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def crashed(self) -> bool:
        """Exited (or was killed) without being asked to."""
        return self.proc is not None and self.proc.poll() is not None and not self.expected_exit

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Fault injection: the exit this causes is expected."""
        assert self.proc is not None
        self.expected_exit = True
        self.proc.send_signal(sig)
        self.proc.wait(15)

    def stop(self) -> int | None:
        """SIGTERM and wait (SIGKILL after 15 s); the exit code, or None if it was already gone."""
        if self.proc is None:
            return None
        was_running = self.proc.poll() is None
        if was_running:
            self.expected_exit = True
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def __enter__(self) -> ControllerProc:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# -- reads of the store ----------------------------------------------------------------------


def steps_stored(engine: Engine, run: str) -> set[int]:
    with session_scope(engine) as s:
        return set(s.scalars(select(StepMetricRow.step).where(StepMetricRow.run_id == run)))


def commands_of(engine: Engine, run: str) -> list[CommandRow]:
    with session_scope(engine) as s:
        rows = s.scalars(select(CommandRow).where(CommandRow.run_id == run).order_by(CommandRow.issued_at)).all()
        s.expunge_all()
        return list(rows)


def incidents_of(engine: Engine, run: str) -> list[IncidentRow]:
    with session_scope(engine) as s:
        rows = s.scalars(select(IncidentRow).where(IncidentRow.run_id == run).order_by(IncidentRow.opened_at)).all()
        s.expunge_all()
        return list(rows)


def run_row(engine: Engine, run: str) -> RunRow | None:
    with session_scope(engine) as s:
        row = s.get(RunRow, run)
        if row is not None:
            s.expunge(row)
        return row


def dead_letters(engine: Engine) -> dict[str, int]:
    """Dead letters counted per reason (every topic)."""
    with session_scope(engine) as s:
        rows = s.execute(select(DlqCountRow.reason, func.sum(DlqCountRow.count)).group_by(DlqCountRow.reason)).all()
    return {reason: int(n) for reason, n in rows}


# -- a controller process with a scripted trainer in front of it --------------------------------


@dataclass
class Loop:
    kafka: KafkaConfig
    engine: Engine
    url: str
    ctl: ControllerProc
    trainer: FakeTrainer


@contextmanager
def controlled(ctx: Ctx, m: Measured, *, kind: str = "sqlite", env: dict[str, str] | None = None,
               partitions: int = 1) -> Iterator[Loop]:
    """A fresh topic set and store, a ``cliffguard controller`` on them and a scripted trainer.

    A controller that exits while the scenario runs counts as a crash in ``m``."""
    kafka = fresh_kafka(ctx.bootstrap, partitions)
    with store(ctx, kind) as (engine, url):
        ctl = ControllerProc(kafka, url, ctx.path("controller.log"), env=env).start()
        trainer = FakeTrainer(kafka)
        try:
            yield Loop(kafka, engine, url, ctl, trainer)
        finally:
            trainer.close()
            if ctl.crashed:
                m.crashes += 1
                m.note(f"controller exited {ctl.proc.returncode if ctl.proc else '?'} unasked: "
                       f"{ctl.log_text()[-300:]!r}")
            ctl.stop()


def obeyed(trainer: FakeTrainer, run: str) -> int:
    """Commands of ``run`` the scripted trainer received and verified (what a trainer would apply)."""
    return len(trainer.received.get(run, []))


# -- a real agent on a tiny model, in the scenario's own process ---------------------------------


class TinyTraining:
    """The real ``Agent`` attached to a 2-layer model's loop; each ``step()`` is timed end to end,
    so a hook that blocks on the broker or the disk shows as a slow step."""

    def __init__(self, run: str, kafka: KafkaConfig | None, spill_dir: Path, secret: Any = None) -> None:
        import torch

        from cliffguard.agent.hooks import Agent, AgentConfig
        from cliffguard.trainer.fault_wrappers import OutageSwitch

        torch.manual_seed(0)
        torch.set_num_threads(1)
        self.torch = torch
        self.model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-2)
        cfg = AgentConfig(run=run, hist_every=0, heartbeat_s=1.0, calibration_s=0.02, spill_dir=str(spill_dir))
        self.outage = OutageSwitch()
        """``down = True``: the agent's producers act as if the broker were gone (its events spill)."""
        self.agent = Agent(None, self.model, self.opt, cfg, kafka=kafka, secret=secret, wrap_producer=self.outage.producers)
        self.agent.start()
        self.step_s: list[float] = []

    def step(self) -> None:
        t0 = time.perf_counter()
        x = self.torch.randn(8, 16)
        loss = ((self.model(x) - 1.0) ** 2).mean()
        self.agent.after_forward(loss, tokens=8)
        loss.backward()
        self.agent.after_backward()
        if self.agent.before_optimizer_step():
            self.opt.step()
        self.opt.zero_grad()
        self.agent.after_step()
        self.step_s.append(time.perf_counter() - t0)

    def close(self) -> None:
        self.agent.close()
