"""``cliffguard broker``: run the embedded broker until SIGINT/SIGTERM.

The topics it creates are the deployment's (``[kafka]`` topic prefix and partitions from
``--config`` < ``CLIFFGUARD_KAFKA__*`` < the options below, ``cliffguard/config.py``), so the
trainer and the controller that read the same file find them."""

from __future__ import annotations

import argparse
import signal
import threading

from cliffguard.controller.broker import BrokerError, EmbeddedBroker, ensure_topics
from cliffguard.core.kafka_config import KafkaConfig
from cliffguard.core.settings import ConfigError


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("broker", help="run the embedded Kafka-protocol broker (Tansu)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=9092, help="port to listen on (default 9092)")
    p.add_argument("--config", help="TOML file whose [kafka] topic_prefix and partitions the topics follow")
    p.add_argument("--partitions", type=int, help="partitions per cliffguard topic (default 4)")
    p.add_argument("--topic-prefix", help="topic prefix (default cliffguard)")
    return p


def resolve(args: argparse.Namespace):
    """The deployment config whose [kafka] topic layout the broker creates."""
    from cliffguard.config import load_deployment

    return load_deployment(args.config, flags={"kafka": {"topic_prefix": args.topic_prefix,
                                                         "partitions": args.partitions}})


def run(args: argparse.Namespace) -> int:
    try:
        kafka = resolve(args).kafka
    except ConfigError as exc:
        print(f"cliffguard broker: {exc}")
        return 2
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    broker = EmbeddedBroker(args.host, args.port)
    try:
        broker.start()
    except BrokerError as exc:
        print(f"cliffguard broker: {exc}")
        return 1
    try:
        # only the topic layout: the embedded broker speaks plaintext whatever a cluster's settings say
        ensure_topics(KafkaConfig(bootstrap=broker.bootstrap, topic_prefix=kafka.topic_prefix,
                                  partitions=kafka.partitions))
        print(f"broker listening on {broker.bootstrap} (Ctrl-C to stop)", flush=True)
        while not stop.wait(0.5):
            if not broker.running:
                print("cliffguard broker: the broker process exited")
                return 1
    finally:
        broker.stop()
    print("broker stopped")
    return 0
