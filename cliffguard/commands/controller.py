"""``cliffguard controller``: run the controller service until SIGINT/SIGTERM.

Settings come from ``--config FILE.toml`` < ``CLIFFGUARD_<SECTION>__<FIELD>`` env < flags, per
section: ``[kafka]``, ``[store]``, ``[controller]``, ``[recovery]``, ``[rules]``, ``[alerts]``.
The command-signing secret comes from ``CLIFFGUARD_COMMAND_SECRET`` (or ``[secrets] command``
in the TOML file) and is never printed.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading

from core.settings import ConfigError, load_toml

log = logging.getLogger(__name__)


def add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="TOML file with [kafka], [store], [controller], [recovery], [rules], [alerts]")
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
    from controller.config import secret_from_env

    return secret_from_env((toml.get("secrets") or {}).get("command"))


def build_sections(args: argparse.Namespace) -> dict:
    """Every section the controller needs, via the one config entry point (cliffguard.config)."""
    from cliffguard.config import load_all

    flags = {
        "kafka": {"bootstrap": getattr(args, "bootstrap", None), "topic_prefix": args.topic_prefix,
                  "partitions": getattr(args, "partitions", None)},
        "store": {"url": args.db},
        "controller": {"group_id": getattr(args, "group", None)},
    }
    out = load_all(args.config, flags=flags, sections=["kafka", "store", "controller", "recovery", "rules", "alerts",
                                                            "retention"])
    out["toml"] = load_toml(args.config)
    return out


def run(args: argparse.Namespace) -> int:
    from controller.broker import ensure_topics
    from controller.runstate import default_detector_factory
    from controller.service import ControllerService
    from controller.store.db import Store

    try:
        cfg = build_sections(args)
        secret = command_secret(cfg["toml"])
    except (ConfigError, ValueError) as exc:
        print(f"cliffguard controller: {exc}")
        return 2
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    store = Store.open(cfg["store"])
    try:
        ensure_topics(cfg["kafka"])
        svc = ControllerService(cfg["controller"], cfg["kafka"], store.engine, secret, cfg["alerts"],
                                recovery=cfg["recovery"], retention=cfg["retention"], detector_factory=default_detector_factory(cfg["rules"]))
        print(f"controller {cfg['controller'].group_id} on {cfg['kafka'].bootstrap} "
              f"({cfg['kafka'].metrics_topic}) store {store.engine.url.render_as_string(hide_password=True)}",
              flush=True)
        svc.run_forever(stop)
        log.info("controller stopped: %s", svc.stats)
    finally:
        store.close()
    return 0
