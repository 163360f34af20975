"""kafka-python plumbing shared by the agent's publisher and command listener: topic creation, a
cheap reachability probe, closing a producer that may be stuck, a partitioner that remembers its
key's hash, and kafka-python kept off the training's Python random stream. No event logic here
(``agent/publisher.py`` has that)."""

from __future__ import annotations

import importlib
import random
from typing import Any

from cliffguard.core.kafka_config import KafkaConfig
from cliffguard.core.kafka_producers import discard_producer, tcp_reachable

__all__ = ["discard_producer", "ensure_topic", "key_hash_partitioner", "tcp_reachable"]

KAFKA_RANDOM_USERS = ("kafka.cluster", "kafka.consumer.subscription_state", "kafka.net.compat",
                      "kafka.net.connection", "kafka.net.http_connect", "kafka.net.manager", "kafka.net.socks5",
                      "kafka.partitioner.default", "kafka.partitioner.sticky")
"""kafka-python's modules that draw from the module-level ``random`` (bootstrap choice, node
order, reconnect jitter, partition order); tests/agent/test_kafka_random.py fails on a new one."""
_KAFKA_RANDOM = random.Random()  # seeded from os.urandom: nothing here needs to be reproducible


def keep_kafka_off_global_random() -> None:
    """Give kafka-python's modules a ``random.Random`` of their own.

    They call ``random.choice``/``shuffle``/``uniform`` on their I/O threads (every connect, every
    backoff, every metadata refresh with several brokers), which draws from the one global stream
    a training loop seeds for its data order and augmentation: attaching the agent would change
    the run's random stream, at moments that depend on network timing. kafka-python takes no
    generator, so its modules' ``random`` name is rebound to a private instance (same methods),
    in the training process only. Idempotent; called before any client is built."""
    for name in KAFKA_RANDOM_USERS:
        try:
            module = importlib.import_module(name)
        except ImportError:  # another kafka-python layout: the test names what changed
            continue
        if getattr(module, "random", None) is random:
            module.random = _KAFKA_RANDOM


def ensure_topic(kafka: KafkaConfig, topic: str, timeout_s: float | None = None) -> None:
    """Create ``topic`` with the configured partitions if the cluster does not have it."""
    from kafka.admin import KafkaAdminClient, NewTopic
    from kafka.errors import TopicAlreadyExistsError

    keep_kafka_off_global_random()
    timeout_ms = int(timeout_s * 1000) if timeout_s is not None else kafka.request_timeout_ms
    admin = KafkaAdminClient(**kafka.client_kwargs(), client_id="cliffguard-agent-admin",
                             bootstrap_timeout_ms=timeout_ms)
    try:
        if topic not in set(admin.list_topics()):
            try:
                admin.create_topics(
                    [NewTopic(name=topic, num_partitions=kafka.partitions, replication_factor=kafka.replication)],
                    timeout_ms=timeout_ms,
                )
            except TopicAlreadyExistsError:
                pass  # someone else created it meanwhile
    finally:
        admin.close()


def key_hash_partitioner() -> Any:
    """kafka-python's default partitioner with each key's murmur2 hash remembered: it is pure
    Python (~25 us a record) and an agent sends one key, its run id, for ever. Same partitions."""
    from kafka.partitioner.default import DefaultPartitioner, murmur2

    class KeyHashCache(DefaultPartitioner):
        def __init__(self) -> None:
            self._hashes: dict[bytes, int] = {}

        def partition(self, topic, key, serialized_key, value, serialized_value, cluster):  # noqa: ANN001, ANN201
            if serialized_key is None:
                return super().partition(topic, key, serialized_key, value, serialized_value, cluster)
            if topic not in cluster.topics():
                raise ValueError(f"Topic {topic} not found in ClusterMetadata")
            h = self._hashes.get(serialized_key)
            if h is None:
                if len(self._hashes) > 1024:
                    self._hashes.clear()
                h = self._hashes[serialized_key] = murmur2(serialized_key) & 0x7FFFFFFF
            all_partitions = sorted(cluster.partitions_for_topic(topic))
            return all_partitions[h % len(all_partitions)]

    return KeyHashCache()
