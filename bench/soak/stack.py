"""One seed's processes, started the way ``cliffguard demo`` starts them (I/O): the embedded broker,
a migrated store (a SQLite file, or a PostgreSQL schema of its own reached through a pgpass file),
a throwaway key set, ``cliffguard controller`` and a 2-process ``cliffguard train`` of the bundled
GPT with the demo's two training faults. Every path handed to a child is absolute."""

from __future__ import annotations

import os
import subprocess
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import URL, Engine
from sqlalchemy.engine import make_url

from bench.soak.faults import ControllerProcess, SoakBroker
from cliffguard.commands.dashboard import without_command_secret
from cliffguard.commands.demo import default_faults
from cliffguard.controller.broker import ensure_topics, free_port
from cliffguard.controller.store.db import Store
from cliffguard.core.deployment import AGENT_SECRET_ENV, PRIVATE_KEY_ENV, PUBLIC_KEY_ENV
from cliffguard.core.keys import generate_keys
from cliffguard.demo_stack import CONTROLLER_ENV, cli
from testing.pg_schema import create_schema, drop_schema

REPO = Path(__file__).resolve().parents[2]
NPROC = 2
PROGRESS_EVERY = 5
"""Rank 0 prints a progress line every this many steps: the clock of step-keyed faults."""


@dataclass
class SeedStack:
    dir: Path
    run: str
    steps: int
    broker: SoakBroker
    engine: Engine
    url: str
    """The store's URL as the children get it (no password in it)."""
    env: dict[str, str]
    """The children's base environment (no key, a pgpass file for PostgreSQL)."""
    controllers: list[ControllerProcess]
    """One ``cliffguard controller``, or several in one consumer group (one holds the partition)."""
    training_faults: list[str]
    train: subprocess.Popen[bytes] | None = None
    trainer_env: dict[str, str] = field(default_factory=dict)

    @property
    def kafka(self) -> Any:
        return self.broker.kafka_config(partitions=1)

    @property
    def record_path(self) -> Path:
        return self.dir / "runs" / self.run / "trainer-record.jsonl"

    def start_training(self) -> subprocess.Popen[bytes]:
        argv = cli(
            "train",
            "--nproc",
            str(NPROC),
            "--bootstrap",
            self.broker.bootstrap,
            "--run",
            self.run,
            "--out-dir",
            str(self.dir / "runs"),
            "--steps",
            str(self.steps),
            "--progress-every",
            str(PROGRESS_EVERY),
        )
        for f in self.training_faults:
            argv += ["--fault", f]
        with (self.dir / "train.log").open("ab") as fh:
            self.train = subprocess.Popen(
                argv,
                env=self.trainer_env,
                stdout=fh,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                cwd=str(self.dir),
            )
        return self.train

    def logs(self) -> dict[str, str]:
        return {p.name: p.read_text(errors="replace") for p in sorted(self.dir.glob("*.log"))}

    def close(self) -> None:
        from cliffguard.procs import stop_group

        if self.train is not None and self.train.poll() is None:
            stop_group(self.train, grace_s=5.0)
        for c in self.controllers:
            c.stop()
        self.broker.stop()
        if self.url.startswith("postgresql"):
            drop_schema(self.engine)
        else:
            self.engine.dispose()


def _store(d: Path, kind: str, pg_url: str | None) -> tuple[Engine, str, dict[str, str]]:
    """(engine for the soak's reads, URL for the children, env they need for it)."""
    if kind == "sqlite":
        url = f"sqlite:///{d / 'cliffguard.db'}"
        return Store.open(url).engine, url, {}
    if not pg_url:
        raise ValueError("--store postgres: no PostgreSQL (give --pg-url or set CLIFFGUARD_TEST_PG_URL)")
    engine, full_url = create_schema(pg_url, "soak")
    full = make_url(full_url)
    pgpass = d / "pgpass"
    pgpass.write_text(f"{full.host}:{full.port or 5432}:{full.database}:{full.username}:{full.password}\n")
    os.chmod(pgpass, 0o600)
    bare = URL.create(full.drivername, full.username, None, full.host, full.port, full.database, full.query)
    return engine, bare.render_as_string(hide_password=False), {"PGPASSFILE": str(pgpass)}


def start_stack(
    d: Path, seed: int, steps: int, store: str = "sqlite", pg_url: str | None = None, controllers: int = 1
) -> SeedStack:
    """Broker, topics, store, keys and the controller(s) of one seed (the trainer starts later)."""
    d.mkdir(parents=True, exist_ok=True)
    broker = SoakBroker(port=free_port(), log_path=d / "broker.log").start()
    try:
        ensure_topics(broker.kafka_config(partitions=1))
        engine, url, store_env = _store(d, store, pg_url)
        keys = generate_keys(d / "keys")
        env = {
            **without_command_secret(os.environ),
            "PYTHONUNBUFFERED": "1",
            **store_env,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        }
        agent_secret = {f"{AGENT_SECRET_ENV}_FILE": str(keys["agent_secret"])}
        group = f"soak-{seed}-{uuid.uuid4().hex[:6]}"
        procs: list[ControllerProcess] = []
        for i in range(controllers):
            procs.append(ControllerProcess(
                argv=cli("controller", "--db", url, "--bootstrap", broker.bootstrap, "--group", group),
                env={**env, **CONTROLLER_ENV, f"{PRIVATE_KEY_ENV}_FILE": str(keys["private"]), **agent_secret},
                log_path=d / ("controller.log" if i == 0 else f"controller-{i}.log"),
                cwd=str(d),
            ).start())
    except BaseException:
        for c in procs:
            c.stop()
        broker.stop()
        raise
    return SeedStack(
        dir=d,
        run=f"soak-{seed}-{uuid.uuid4().hex[:4]}",
        steps=steps,
        broker=broker,
        engine=engine,
        url=url,
        env=env,
        controllers=procs,
        training_faults=default_faults(steps),
        trainer_env={**env, f"{PUBLIC_KEY_ENV}_FILE": str(keys["public"]), **agent_secret},
    )
