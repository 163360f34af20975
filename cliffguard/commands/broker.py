"""``cliffguard broker``: run the embedded broker until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import signal
import threading

from controller.broker import BrokerError, EmbeddedBroker, ensure_topics
from core.kafka_config import KafkaConfig


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("broker", help="run the embedded Kafka-protocol broker (Tansu)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=9092, help="port to listen on (default 9092)")
    p.add_argument("--partitions", type=int, default=4, help="partitions per cliffguard topic (default 4)")
    p.add_argument("--topic-prefix", default="cliffguard", help="topic prefix (default cliffguard)")
    return p


def run(args: argparse.Namespace) -> int:
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
        ensure_topics(KafkaConfig(bootstrap=broker.bootstrap, topic_prefix=args.topic_prefix, partitions=args.partitions))
        print(f"broker listening on {broker.bootstrap} (Ctrl-C to stop)", flush=True)
        while not stop.wait(0.5):
            if not broker.running:
                print("cliffguard broker: the broker process exited")
                return 1
    finally:
        broker.stop()
    print("broker stopped")
    return 0
