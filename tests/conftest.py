"""Test tiers, and the shared fixtures: the real embedded broker and a real PostgreSQL.

``python -m pytest`` runs the unit tier: every test without a tier marker (no broker, no
PostgreSQL, no browser, no multi-process run; a few minutes). ``--all-tiers`` (what
``scripts/test.sh`` and CI run) adds the tiers below; an explicit ``-m EXPR`` picks tests by its
own expression instead. A test that uses the ``broker``/``kafka_cfg`` or ``pg_url`` fixture is
in that tier whether or not it says so, so no integration test can slip into the unit tier.

In CI (``CI=true``) a missing service is a failure, not a skip (testing/services.py).
"""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

import pytest

from cliffguard.controller.broker import EmbeddedBroker, ensure_topics
from testing.services import missing as _missing

# tier marker -> what a test of that tier needs (the markers are declared in pyproject.toml)
TIERS = {
    "broker": "the real embedded Kafka-protocol broker (Tansu)",
    "postgres": "a real PostgreSQL server",
    "slow": "multi-process training or end-to-end runs",
    "browser": "headless Chromium",
    "slurm": "a one-machine Slurm cluster (slurm-wlm, munge)",
}
# fixtures that put a test into a tier
FIXTURE_TIER = {"broker": "broker", "kafka_cfg": "broker", "pg_url": "postgres", "slurm_cluster": "slurm"}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--all-tiers", action="store_true", default=False,
                     help="run every tier (" + ", ".join(TIERS) + "), not only the unit tier")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for fixture in set(getattr(item, "fixturenames", ())) & FIXTURE_TIER.keys():
            item.add_marker(FIXTURE_TIER[fixture])
    if config.getoption("--all-tiers") or config.option.markexpr:
        return
    keep: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        (dropped if any(item.get_closest_marker(t) for t in TIERS) else keep).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


def pytest_report_header(config: pytest.Config) -> str:
    if config.getoption("--all-tiers"):
        return "tiers: all (unit, " + ", ".join(TIERS) + ")"
    if config.option.markexpr:
        return f"tiers: chosen by -m {config.option.markexpr!r}"
    return "tiers: unit only (--all-tiers, or scripts/test.sh, runs " + ", ".join(TIERS) + " too)"


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
def slurm_cluster(tmp_path_factory):
    """A one-machine Slurm cluster (``cliffguard slurm up``) for the session, stopped after it."""
    import shutil

    from cliffguard.slurm.cluster import Cluster, ClusterConfig

    if shutil.which("slurmctld") is None and not os.path.exists("/usr/sbin/slurmctld"):
        _missing("Slurm (apt-get install slurm-wlm munge)")
    cluster = Cluster(ClusterConfig(dir=str(tmp_path_factory.mktemp("slurm")), cpus=4, grace_s=30))
    try:
        cluster.up()
    except Exception as exc:  # noqa: BLE001 - a cluster that does not come up is a missing service
        cluster.down()
        _missing(f"a local Slurm cluster ({exc})")
    yield cluster
    cluster.down()


@pytest.fixture(scope="session")
def pg_url():
    """A SQLAlchemy URL of a real PostgreSQL database, from CLIFFGUARD_TEST_PG_URL."""
    url = os.environ.get("CLIFFGUARD_TEST_PG_URL")
    if not url:
        _missing("PostgreSQL (set CLIFFGUARD_TEST_PG_URL)")
    return url


_STRAY = Path(__file__).resolve().parents[1] / "cliffguard.db"
"""The store's default path, relative to the current directory: a test (or a process one left
running) that opens a store without naming one writes it into the checkout."""


def _stray_check(item: pytest.Item):
    """Says which test first left ``cliffguard.db`` in the checkout root (seen after a clean-clone run,
    its writer not yet found): a warning in the summary, so the culprit is named without failing CI."""
    existed = _STRAY.exists()
    yield
    if not existed and _STRAY.exists():
        item.warn(pytest.PytestWarning(f"{item.nodeid} left {_STRAY} behind: a store opened without --db/db_url "
                                       "(or a process started by an earlier test) writes the default path"))


@pytest.fixture(autouse=True)
def _main_module_restored():
    """Puts ``sys.modules["__main__"]`` back after each test. Streamlit's AppTest runs the dashboard
    script as ``__main__`` and leaves it there; every later spawned child (torch.multiprocessing,
    multiprocessing "spawn") then re-ran ``dashboard/app.py`` as its main module before its target:
    the stray ``cliffguard.db`` in the checkout, bare-mode Streamlit warnings in unrelated tests, and a
    resharding test whose workers failed after it."""
    main = sys.modules.get("__main__")
    yield
    if main is not None and sys.modules.get("__main__") is not main:
        sys.modules["__main__"] = main


pytest_runtest_setup = pytest.hookimpl(hookwrapper=True)(_stray_check)
pytest_runtest_call = pytest.hookimpl(hookwrapper=True)(_stray_check)
pytest_runtest_teardown = pytest.hookimpl(hookwrapper=True)(_stray_check)
