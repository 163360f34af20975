"""The embedded broker: a context manager that really serves Kafka, and clear errors when it cannot."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from cliffguard.controller.broker import (
    BrokerError,
    EmbeddedBroker,
    ensure_topics,
    find_broker_binary,
    port_is_free,
)

pytestmark = pytest.mark.broker


def _broker_available() -> None:
    try:
        find_broker_binary()
    except BrokerError as exc:
        from testing.services import missing as _missing

        _missing(f"embedded broker ({exc})")


def test_context_manager_serves_kafka_and_stops(tmp_path):
    _broker_available()
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    with EmbeddedBroker(port=0, log_path=tmp_path / "broker.log") as broker:
        assert broker.running and not port_is_free(broker.host, broker.port)
        cfg = broker.kafka_config(topic_prefix="cm", partitions=3)
        ensure_topics(cfg)
        producer = KafkaProducer(**cfg.client_kwargs())
        producer.send(cfg.metrics_topic, key=b"k", value=b"hello").get(10)
        producer.close()
        consumer = KafkaConsumer(**cfg.client_kwargs(), enable_auto_commit=False)
        assert consumer.partitions_for_topic(cfg.metrics_topic) == {0, 1, 2}
        tps = [TopicPartition(cfg.metrics_topic, p) for p in range(3)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        values = []
        for _ in range(20):
            for recs in consumer.poll(500).values():
                values += [r.value for r in recs]
            if values:
                break
        consumer.close()
        assert values == [b"hello"]
    assert not broker.running
    assert port_is_free(broker.host, broker.port)


def test_restart_keeps_the_address_and_starts_empty():
    _broker_available()
    from kafka.admin import KafkaAdminClient

    with EmbeddedBroker(port=0) as broker:
        cfg = broker.kafka_config(topic_prefix="rs")
        ensure_topics(cfg)
        broker.restart(down_s=0.2)
        assert broker.running
        admin = KafkaAdminClient(**cfg.client_kwargs())
        try:
            assert cfg.metrics_topic not in admin.list_topics()  # in-memory storage: gone
        finally:
            admin.close()


def test_port_taken_is_a_clear_error():
    _broker_available()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        broker = EmbeddedBroker(port=port)
        with pytest.raises(BrokerError, match=f"port {port} .* is taken"):
            broker.start()
        assert not broker.running


def test_missing_binary_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("CALF_TANSU_BIN", str(tmp_path / "no-such-tansu"))
    with pytest.raises(BrokerError, match="CALF_TANSU_BIN"):
        EmbeddedBroker(port=0).start()


@pytest.mark.skipif(not os.path.exists("/proc/self/environ"), reason="needs /proc")
def test_the_broker_child_inherits_no_key(monkeypatch):
    from cliffguard.core.deployment import KEY_ENVS

    for name in KEY_ENVS:
        monkeypatch.setenv(name, "do-not-leak-0123456789")
    with EmbeddedBroker(port=0) as broker:
        raw = Path(f"/proc/{broker._proc.pid}/environ").read_bytes()
    env = dict(item.decode().split("=", 1) for item in raw.split(b"\0") if b"=" in item)
    assert "RUST_LOG" in env and not set(KEY_ENVS) & set(env)
