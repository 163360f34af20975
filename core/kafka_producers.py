"""A Kafka producer that a broker restart cannot leave dead, for every long-lived sender.

kafka-python's producer is idempotent by default with ``acks="all"``: the broker hands it a
producer id and it numbers its batches. A broker that restarts empty (Tansu on ``memory://``) or
otherwise loses that id answers ``UnknownProducerIdError``, after which the client's own retries
fail for good (``InitProducerIdResponse ... UnknownError``) — every later send on that object
fails although a new producer would succeed at once. So the rule for a sender that lives as long
as its process (the controller's command outbox, its dead-letter producer):

- a send that the broker did not acknowledge discards the producer (``RecoveringProducer.failed``);
- the next send builds a new one, after a TCP probe so that a broker that is not even listening
  costs milliseconds, not kafka-python's bootstrap timeout;
- every discard and every rebuild is logged (the first failure at WARNING with its cause) and
  counted (``discards``), so a sender stuck on a broker that stays away is visible.

The agent's publisher follows the same rule with its own state machine (agent/publisher.py).
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable
from typing import Any

from cliffguard.core.kafka_config import KafkaConfig

log = logging.getLogger(__name__)


def tcp_reachable(kafka: KafkaConfig, timeout: float = 0.5) -> bool:
    """Whether any bootstrap host accepts a TCP connection (a cheap probe before kafka-python's
    bootstrap, which waits out its whole timeout on a host that is down)."""
    for host_port in kafka.client_kwargs()["bootstrap_servers"]:
        host, _, port = host_port.rpartition(":")
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
                return True
        except OSError:
            continue
    return False


def discard_producer(producer: Any) -> None:
    """Close a producer we no longer trust without waiting on a broker that is gone."""
    try:
        producer.close(timeout=0.5)
    except Exception:  # noqa: BLE001 - flush inside close times out when records are stuck
        sender = getattr(producer, "_sender", None)
        if sender is not None:
            sender.force_close()


class BrokerUnreachable(ConnectionError):
    """No bootstrap host accepts TCP connections: no producer was built."""


class RecoveringProducer:
    """Holds one producer built by ``factory``; ``failed`` drops it so the next ``get`` builds a
    fresh one. Thread-safe: the outbox's thread and the consumer loop both send."""

    def __init__(self, kafka: KafkaConfig, factory: Callable[[], Any], *, name: str,
                 probe: Callable[[KafkaConfig], bool] = tcp_reachable) -> None:
        self.kafka = kafka
        self.name = name
        self._factory = factory
        self._probe = probe
        self._producer: Any = None
        self._lock = threading.Lock()
        self._failing = False
        self.discards = 0
        """Producers dropped after a send the broker did not acknowledge."""
        self.builds = 0

    def get(self) -> Any:
        """The current producer, built now if there is none. Raises ``BrokerUnreachable`` (or
        what kafka-python raises) when none can be built: the caller retries later."""
        with self._lock:
            if self._producer is None:
                if not self._probe(self.kafka):
                    raise BrokerUnreachable(f"no bootstrap host of {self.kafka.bootstrap} accepts connections")
                self._producer = self._factory()
                self.builds += 1
                if self._failing:
                    log.info("%s: new producer connected to %s", self.name, self.kafka.bootstrap)
                    self._failing = False
            return self._producer

    @property
    def current(self) -> Any:
        """The producer if one is built (None otherwise); never builds."""
        return self._producer

    def failed(self, producer: Any, why: object) -> None:
        """A send on ``producer`` was not acknowledged: drop it (if it is still the current one)."""
        with self._lock:
            if producer is None or producer is not self._producer:
                return  # already replaced by another thread's failure
            self._producer = None
            self.discards += 1
            first = not self._failing
            self._failing = True
        (log.warning if first else log.info)(
            "%s: a send to %s was not acknowledged (%s); dropping the producer and building a new one "
            "for the next send (a broker that restarted forgets producer ids)", self.name, self.kafka.bootstrap, why)
        discard_producer(producer)

    def close(self, timeout: float = 5.0) -> None:
        with self._lock:
            producer, self._producer = self._producer, None
        if producer is not None:
            try:
                producer.close(timeout=timeout)
            except Exception:  # noqa: BLE001
                discard_producer(producer)
