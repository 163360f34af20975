"""Connection settings for any Kafka-protocol cluster, shared by the agent and the controller.

Nothing here is specific to the embedded broker: point ``bootstrap`` at a real Kafka cluster and
pass SASL/TLS settings through ``security_protocol`` and friends (they go to kafka-python as is).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cliffguard.core.declared import bounded, check_declared, one_of

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"


@dataclass(kw_only=True, slots=True)
class KafkaConfig:
    bootstrap: str = DEFAULT_BOOTSTRAP
    """Comma-separated host:port list of brokers."""
    topic_prefix: str = "cliffguard"
    """Topics are <prefix>.metrics, <prefix>.commands, <prefix>.dlq and <prefix>.suspects."""
    partitions: int = bounded(4, ge=1)
    """Partitions per topic when cliffguard creates them (runs are keyed, so a run stays on one)."""
    replication: int = bounded(1, ge=1)
    """Replication factor when cliffguard creates topics (3 on a real cluster)."""
    security_protocol: str = one_of("PLAINTEXT", ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"),
                                    reason="must be PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL")
    """PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL, passed through to kafka-python."""
    sasl_mechanism: str | None = None
    sasl_plain_username: str | None = None
    sasl_plain_password: str | None = field(default=None, repr=False)
    ssl_cafile: str | None = None
    request_timeout_ms: int = 10_000
    """Per-request timeout for producers/consumers/admin."""

    def __post_init__(self) -> None:
        check_declared(self)
        hosts = [h.strip() for h in self.bootstrap.split(",") if h.strip()]
        if not hosts:
            raise ValueError("bootstrap: at least one host:port is needed")
        for h in hosts:
            host, sep, port = h.rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"bootstrap: {h!r} is not host:port")
        if not self.topic_prefix or any(c not in "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-" for c in self.topic_prefix):
            raise ValueError("topic_prefix: use letters, digits, '.', '_' or '-'")

    @property
    def metrics_topic(self) -> str:
        return f"{self.topic_prefix}.metrics"

    @property
    def commands_topic(self) -> str:
        return f"{self.topic_prefix}.commands"

    @property
    def dlq_topic(self) -> str:
        return f"{self.topic_prefix}.dlq"

    @property
    def suspects_topic(self) -> str:
        """The suspect-node list launchers read before their node joins (compacted, keyed by node:
        core/admission.py)."""
        return f"{self.topic_prefix}.suspects"

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments common to KafkaProducer/KafkaConsumer/KafkaAdminClient."""
        kw: dict[str, Any] = {
            "bootstrap_servers": [h.strip() for h in self.bootstrap.split(",") if h.strip()],
            "security_protocol": self.security_protocol,
            "request_timeout_ms": self.request_timeout_ms,
        }
        for name in ("sasl_mechanism", "sasl_plain_username", "sasl_plain_password", "ssl_cafile"):
            value = getattr(self, name)
            if value is not None:
                kw[name] = value
        return kw
