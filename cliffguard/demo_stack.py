"""The monitoring side of a demo: embedded broker, topics, a fresh SQLite store, a throwaway key set
and the controller, started the same way for ``cliffguard demo`` and ``cliffguard demo --elastic``.

The controller gets the Ed25519 private key and the agent secret; ``trainer_env`` is what a
trainer launch needs (the public key and the agent secret; its workers get only the public key
and their run's event key from the launcher).
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cliffguard.core.deployment import AGENT_SECRET_ENV, PRIVATE_KEY_ENV, PUBLIC_KEY_ENV
from cliffguard.core.keys import generate_keys

CONTROLLER_ENV = {
    # The demo's broker is Tansu: a group's first join waits ~max_poll_interval_ms.
    "CLIFFGUARD_CONTROLLER__GROUP_ID": "cliffguard-demo",
    "CLIFFGUARD_CONTROLLER__MAX_POLL_INTERVAL_MS": "3000",
    "CLIFFGUARD_CONTROLLER__SESSION_TIMEOUT_MS": "3000",
    "CLIFFGUARD_CONTROLLER__HEARTBEAT_INTERVAL_MS": "500",
}


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "cliffguard.cli", *args]


def pick_port(wanted: int, what: str, say) -> int:
    from cliffguard.controller.broker import free_port, port_is_free

    if wanted and port_is_free("127.0.0.1", wanted):
        return wanted
    port = free_port()
    if wanted:
        say(f"port {wanted} is taken; the {what} uses {port} instead")
    return port


@dataclass(slots=True)
class MonitoringStack:
    """What ``start_monitoring`` started; ``close`` stops the broker and closes the store (the
    controller is a child of the caller's ``ProcessSet``, stopped with it)."""

    broker: Any
    store: Any
    db_url: str
    controller: Any
    env: dict[str, str]
    trainer_env: dict[str, str]

    @property
    def bootstrap(self) -> str:
        return self.broker.bootstrap

    def close(self) -> None:
        self.broker.stop()
        self.store.close()


def start_monitoring(out_dir: Path, procs: Any, *, broker_port: int, say,
                     controller_env: dict[str, str] | None = None) -> MonitoringStack:
    """Broker (``broker_port``, or a free one when taken / 0), topics, ``<out_dir>/cliffguard.db``
    (migrated before anyone else touches it), keys in ``<out_dir>/keys`` and the controller
    (``controller_env`` on top of ``CONTROLLER_ENV``). On failure what was started is stopped."""
    from cliffguard.commands.dashboard import without_command_secret
    from cliffguard.controller.broker import EmbeddedBroker, ensure_topics
    from cliffguard.controller.store.db import Store

    out_dir = out_dir.resolve()  # the store URL and the key files are handed to processes running elsewhere
    broker = EmbeddedBroker(port=pick_port(broker_port, "broker", say), log_path=out_dir / "broker.log").start()
    store = None
    try:
        kafka = broker.kafka_config(partitions=1)
        ensure_topics(kafka)
        say(f"broker on {broker.bootstrap} (topics {kafka.metrics_topic}, {kafka.commands_topic}, {kafka.dlq_topic})")
        db_url = f"sqlite:///{out_dir / 'cliffguard.db'}"
        store = Store.open(db_url)
        keys = generate_keys(out_dir / "keys")
        env = {**without_command_secret(os.environ), "PYTHONUNBUFFERED": "1"}
        agent_secret = {f"{AGENT_SECRET_ENV}_FILE": str(keys["agent_secret"])}
        controller = procs.spawn("controller", cli("controller", "--db", db_url, "--bootstrap", broker.bootstrap),
                                 env={**env, **CONTROLLER_ENV, **(controller_env or {}),
                                      f"{PRIVATE_KEY_ENV}_FILE": str(keys["private"]), **agent_secret},
                                 log_path=out_dir / "controller.log")
        say(f"controller started (pid {controller.proc.pid}); store {db_url}; log {out_dir / 'controller.log'}")
    except BaseException:
        broker.stop()
        if store is not None:
            store.close()
        raise
    return MonitoringStack(broker=broker, store=store, db_url=db_url, controller=controller, env=env,
                           trainer_env={**env, f"{PUBLIC_KEY_ENV}_FILE": str(keys["public"]), **agent_secret})


def collect(store: Any, run_id: str) -> dict[str, Any]:
    """Incidents (oldest first, with transitions), alerts, commands sent, loss figures and steps
    lost, from the store."""
    from cliffguard.commands.badbatches import TRIAGED, bad_batches
    from cliffguard.controller.store import read
    from cliffguard.demo_summary import incident_summary

    with store.session() as s:
        run = read.get_run(s, run_id)
        incs = read.incidents(s, run_id, limit=None)[::-1]
        out = [incident_summary(i, read.transitions(s, run_id, incident_id=i["id"], limit=None)) for i in incs]
        curve = read.loss_curve(s, run_id, max_points=None)
        flags = [f for f in read.data_flags(s, run_id, limit=None) if f["rule"] == "transient_spike"]
        listed = bad_batches(read.evidence(s, run_id, kind=TRIAGED, limit=None))
        steps_lost = read.redone_steps(s, run_id)
        alerts = read.alerts(s, run_id, limit=None)[::-1]
        commands_sent = len(read.commands(s, run_id, limit=None))
    finite = [p for p in curve if p["loss"] is not None and math.isfinite(p["loss"])]
    tail = sorted(finite, key=lambda p: p["ts"])[-10:]
    return {
        "run_status": None if run is None else run["status"],
        "last_step": None if run is None else run["last_step"],
        "lr_scale": None if run is None else run["lr_scale"],
        "lr_scale_applied": None if run is None else run.get("lr_scale_applied"),
        "validation": None if run is None else (run.get("summary") or {}).get("validation"),
        "incidents": out,
        "initial_loss": finite[0]["loss"] if finite else None,
        "final_loss": sum(p["loss"] for p in tail) / len(tail) if tail else None,
        "steps_lost": steps_lost,
        "flagged_samples": sum(len(f["sample_ids"]) for f in flags),
        "listed_samples": sum(len(b["sample_ids"]) for b in listed),  # triage's bad-batch list (cliffguard badbatches)
        "alerts": [{"id": a["id"], "level": a["level"], "rule": a["rule"], "action": a["action"],
                    "evidence": {"step": (a["evidence"] or {}).get("step")}} for a in alerts],
        "commands_sent": commands_sent,
    }
