"""``cliffguard controller``: run the controller service until SIGINT/SIGTERM.

Settings come from ``--config FILE.toml`` < ``CLIFFGUARD_<SECTION>__<FIELD>`` env < flags
(``cliffguard/config.py``): the deployment's ``[kafka]``, ``[spike]``, ``[policy]`` and keys
(``[secrets]``, ``core/deployment.py``: the Ed25519 private key it signs commands with, else the
HMAC secret; the agent secret events are checked with; never printed), and the
controller's ``[store]``, ``[controller]``, ``[recovery]``, ``[rules]``, ``[alerts]``, ``[retention]``,
``[goodput]``.
"""

from __future__ import annotations

import argparse
import faulthandler
import logging
import signal
import threading
import time

from cliffguard.core.settings import ConfigError

log = logging.getLogger(__name__)


def add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="TOML file with [kafka], [spike], [policy], [secrets], [store], [controller], "
                                    "[recovery], [rules], [alerts]")
    p.add_argument("--db", help="store URL (default sqlite:///cliffguard.db)")
    p.add_argument("--topic-prefix", help="Kafka topic prefix (default cliffguard)")


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("controller", help="run the controller service (consumer group on the metrics topic)")
    add_common(p)
    p.add_argument("--bootstrap", help="Kafka bootstrap host:port[,host:port] (default 127.0.0.1:9092)")
    p.add_argument("--group", help="consumer group id; instances in one group share the runs")
    p.add_argument("--partitions", type=int, help="partitions when creating missing topics")
    return p


def command_secret(toml: dict):
    """The deployment's command-signing key by its one rule (the Ed25519 private key, else the
    HMAC secret); a ValueError saying where to set it when there is none."""
    from cliffguard.core.deployment import DeploymentConfig, resolve_keys, resolve_secret

    secret, source = resolve_secret(toml)
    return DeploymentConfig(secret=secret, secret_source=source, **resolve_keys(toml)).require_signing_key()


CONTROLLER_SECTIONS = ["kafka", "spike", "policy", "store", "controller", "recovery", "rules", "alerts", "retention",
                       "goodput"]


def resolve_common(args: argparse.Namespace, sections: list[str]):
    """The deployment and ``sections`` via the one config resolver (cliffguard/config.py), with
    the options of ``add_common`` (and the controller's, where the command has them) as flags."""
    from cliffguard.config import load_all

    flags = {
        "kafka": {"bootstrap": getattr(args, "bootstrap", None), "topic_prefix": args.topic_prefix,
                  "partitions": getattr(args, "partitions", None)},
        "store": {"url": args.db},
        "controller": {"group_id": getattr(args, "group", None)},
    }
    return load_all(args.config, flags=flags, sections=sections)


def open_store_quietly(args: argparse.Namespace, prog: str):
    """The store an operator's command opens (``--db`` / ``[store]``): never created, an older schema
    upgraded and said (cliffguard/commands/store_open.py); None after printing why not (the command exits 2)."""
    from cliffguard.commands.store_open import open_recorded_store

    try:
        store_cfg = resolve_common(args, ["store"])["store"]
    except ConfigError as exc:
        print(f"cliffguard {prog}: {exc}")
        return None
    return open_recorded_store(store_cfg, prog)


def build_sections(args: argparse.Namespace):
    """Every section the controller needs."""
    return resolve_common(args, CONTROLLER_SECTIONS)


def run(args: argparse.Namespace) -> int:
    from cliffguard.controller.broker import ensure_topics
    from cliffguard.controller.runstate import default_detector_factory
    from cliffguard.controller.service import ControllerService
    from cliffguard.controller.store.db import Store
    from cliffguard.controller.store.errors import StoreLost

    try:
        cfg = build_sections(args)
        secret = cfg.deployment.require_signing_key()
    except (ConfigError, ValueError) as exc:
        print(f"cliffguard controller: {exc}")
        return 2
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    cfg["controller"].apply_gc_threshold()
    try:
        store = Store.open(cfg["store"])
    except Exception as exc:  # noqa: BLE001 - say what is wrong with the store, then exit
        print(f"cliffguard controller: cannot open the store: {_store_message(exc)}", flush=True)
        return STORE_LOST_EXIT
    try:
        if not _wait_for_broker(cfg["kafka"], stop, lambda: ensure_topics(cfg["kafka"])):
            return 0
        svc = ControllerService(cfg["controller"], cfg["kafka"], store.engine, secret, cfg["alerts"],
                                event_verifier=cfg.deployment.event_verifier(),
                                recovery=cfg["recovery"], retention=cfg["retention"], goodput=cfg["goodput"],
                                detector_factory=default_detector_factory(cfg["rules"]))
        print(f"controller {cfg['controller'].group_id} on {cfg['kafka'].bootstrap} "
              f"({cfg['kafka'].metrics_topic}) store {store.engine.url.render_as_string(hide_password=True)}",
              flush=True)
        dep = cfg.deployment
        print(f"commands signed with {'Ed25519 ' + str(dep.public_fingerprint) if dep.private_key else 'the HMAC secret'}; "
              f"events {'checked' if dep.agent_secret else 'NOT checked (no agent secret)'}", flush=True)
        while not _started(svc, stop, lambda: ensure_topics(cfg["kafka"])):
            if stop.is_set():
                return 0
        svc.run_forever(stop, _stall_watchdog(cfg["controller"].stall_dump_s))
        faulthandler.cancel_dump_traceback_later()
        log.info("controller stopped: %s", svc.stats)
    except StoreLost as exc:
        # A supervisor restarts us; running on would write into a void or lose the offsets.
        print(f"cliffguard controller: stopped, the store is lost: {exc}", flush=True)
        return STORE_LOST_EXIT
    finally:
        store.close()
    return 0


def _stall_watchdog(stall_dump_s: float):  # noqa: ANN202
    """SIGUSR1 prints every thread's stack to the log; with ``stall_dump_s`` the loop re-arms
    faulthandler's timer before each iteration, so one that never returns prints them too
    (the standard library's watchdog: a C thread, nothing to run in Python while we are stuck)."""
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    if not stall_dump_s:
        return None

    def rearm() -> None:
        faulthandler.dump_traceback_later(stall_dump_s, repeat=True)

    return rearm


STORE_LOST_EXIT = 3
"""Exit status when the store is gone, read-only or replaced (2: a configuration error)."""


def _store_message(exc: BaseException) -> str:
    """The database's own first line, without the SQL or a URL's password."""
    orig = getattr(exc, "orig", None) or exc
    first = str(orig).splitlines()[0] if str(orig) else ""
    return f"{type(orig).__name__}: {first}"


def _wait_for_broker(kafka, stop: threading.Event, connect) -> bool:  # noqa: ANN001
    """Wait until ``connect`` (the topics' creation) succeeds, saying so: a controller started, or
    restarted by a supervisor, while the broker is down must wait for it, not exit with a
    traceback (the store is open; the agents spill meanwhile). False when stopped first."""
    wait, said = 0.5, 0.0
    while not stop.is_set():
        try:
            connect()
            if said:
                log.warning("broker %s reachable; starting", kafka.bootstrap)
            return True
        except Exception as exc:  # noqa: BLE001 - any failure to reach it: wait and try again
            now = time.monotonic()
            if not said or now - said >= 60:
                log.warning("broker %s not reachable (%s: %s); waiting for it", kafka.bootstrap,
                            type(exc).__name__, exc)
                said = now
        stop.wait(wait)
        wait = min(wait * 2, 5.0)
    return False


def _started(svc, stop: threading.Event, connect) -> bool:  # noqa: ANN001
    """Start the service's consumer; a broker gone again in between means waiting once more."""
    try:
        svc.start()
        return True
    except Exception as exc:  # noqa: BLE001 - kafka-python's bootstrap raises when no broker answers
        if type(exc).__name__ not in ("KafkaTimeoutError", "NoBrokersAvailable", "KafkaConnectionError"):
            raise
        log.warning("broker %s went away while the controller started (%s); waiting for it", svc.kafka.bootstrap, exc)
        svc.close()
        _wait_for_broker(svc.kafka, stop, connect)
        return False
