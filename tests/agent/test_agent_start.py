"""Starting an agent: construction never blocks on an unreachable broker, and each start spills to
its own file (run + instance id), so an earlier start's stale spill is never replayed into it."""

from __future__ import annotations

import logging
import time

import torch

from cliffguard.agent.config import AgentConfig
from cliffguard.agent.hooks import Agent
from cliffguard.agent.spill import SpillFile, spill_path, stale_spills
from cliffguard.core.deployment import SECRET_ENV
from cliffguard.core.kafka_config import KafkaConfig

NOWHERE = KafkaConfig(bootstrap="127.0.0.1:9", request_timeout_ms=1000)  # discard port: nothing listens


def _agent(tmp_path, **kw) -> Agent:
    cfg = AgentConfig(run="same-run", heartbeat_s=60, calibration_s=0.05, spill_dir=str(tmp_path / "spill"))
    return Agent(None, torch.nn.Linear(2, 2), None, cfg, kafka=NOWHERE, **kw)


def _close(agent: Agent) -> None:
    agent.sink.close(timeout=0.2)  # nothing to reach: do not wait the default flush deadline
    if agent.commands is not None:
        agent.commands.close(timeout=0.2)
    agent.close()


def test_construction_with_a_wrong_bootstrap_does_not_block(tmp_path, monkeypatch):
    monkeypatch.setenv(SECRET_ENV, "x" * 32)  # so a command listener is built too
    t0 = time.monotonic()
    agent = _agent(tmp_path)
    try:
        assert time.monotonic() - t0 < 1.0
        assert agent.commands is not None
    finally:
        _close(agent)


def test_each_start_spills_to_its_own_file_and_a_stale_one_is_not_replayed(tmp_path, caplog):
    spill_dir = tmp_path / "spill"
    stale = SpillFile(spill_path(spill_dir, "same-run", 0, "0123456789ab"), 1 << 20)
    assert stale.append(b"an event of an earlier run that reused the id")
    stale.close()
    with caplog.at_level(logging.WARNING, logger="cliffguard.agent.hooks"):
        agent = _agent(tmp_path)
    try:
        mine = spill_path(spill_dir, "same-run", 0, agent.instance)
        assert agent.sink.config.spill_path == str(mine) and len(agent.instance) == 12
        assert agent.sink._spill.pending_records == 0  # nothing of the earlier start's file
        assert any("not replayed" in r.getMessage() and "0123456789ab" in r.getMessage() for r in caplog.records)
        assert stale_spills(spill_dir, "same-run", 0, agent.instance) == [spill_path(spill_dir, "same-run", 0, "0123456789ab")]
        assert stale_spills(spill_dir, "other-run", 0, agent.instance) == []
    finally:
        _close(agent)
    assert SpillFile(spill_path(spill_dir, "same-run", 0, "0123456789ab"), 1 << 20).pending_records == 1
