"""kafka-python kept off the training's Python random stream (agent/kafka_client.py): every module
of the installed kafka-python that draws from the global ``random`` is one the agent rebinds, and
after that a client's draws (bootstrap choice, jitter, node order) leave the global state alone."""

from __future__ import annotations

import importlib
import pkgutil
import random

import kafka

from cliffguard.agent.kafka_client import KAFKA_RANDOM_USERS, keep_kafka_off_global_random


def _global_random_users() -> set[str]:
    users = set()
    for info in pkgutil.walk_packages(kafka.__path__, "kafka."):
        name = info.name
        if name.startswith("kafka.benchmarks") or name.endswith("__main__") or ".cli" in name:
            continue  # not what a client runs (and a CLI module parses sys.argv when imported)
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue  # an optional dependency (GSSAPI, ...) this install lacks
        for value in vars(module).values():
            if value is random or getattr(value, "__self__", None) is random._inst:
                users.add(name)
    return users


def test_every_kafka_module_drawing_from_the_global_random_is_rebound():
    before = _global_random_users()
    assert before <= set(KAFKA_RANDOM_USERS), (
        f"kafka-python modules not rebound: {sorted(before - set(KAFKA_RANDOM_USERS))}"
    )
    keep_kafka_off_global_random()
    assert _global_random_users() == set()


def test_a_kafka_clients_draws_leave_the_global_stream_alone():
    from kafka.cluster import collect_hosts
    from kafka.net.manager import KafkaConnectionManager

    keep_kafka_off_global_random()
    random.seed(7)
    state = random.getstate()
    collect_hosts("a:1,b:2,c:3", randomize=True)  # the bootstrap order
    KafkaConnectionManager.jitter_pct(None)  # reconnect backoff jitter (uses no instance state)
    assert random.getstate() == state
