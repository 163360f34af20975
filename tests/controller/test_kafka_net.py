"""The controller's kafka-python clients report a task step as blocking only past ``SLOW_TASK_S``
(controller/kafka_net.py): a 0.2 s step, what a large fetch read takes under GIL contention, is
logged by kafka-python's default client and not by the controller's."""

from __future__ import annotations

import logging
import time

from kafka.net.compat import KafkaNetClient

from cliffguard.controller.kafka_net import SLOW_TASK_S, net_client_kwargs


def _slow_step():
    time.sleep(0.2)  # one step of a task that holds the I/O thread this long (not a synchronisation)
    return None
    yield  # a generator: kafka-python's task protocol


def _blocking_warnings(client, caplog) -> list[str]:
    caplog.clear()
    try:
        with caplog.at_level(logging.WARNING, logger="kafka.net.selector"):
            client._net.call_soon(_slow_step)
            client._net.poll(0.5)
    finally:
        client.close()
    return [r.getMessage() for r in caplog.records if "blocking the event loop" in r.getMessage()]


def test_a_step_below_the_threshold_is_not_reported_as_blocking(caplog):
    assert SLOW_TASK_S >= 1.0
    assert len(_blocking_warnings(KafkaNetClient(bootstrap_servers=["127.0.0.1:1"]), caplog)) == 1
    ours = net_client_kwargs()["kafka_client"](bootstrap_servers=["127.0.0.1:1"])
    assert ours._net.config["slow_task_threshold_secs"] == SLOW_TASK_S
    assert _blocking_warnings(ours, caplog) == []
