"""A trainer that cannot sign its events, as a first user sets one up: a plain loop that is its own
launcher, given only the command public key (``cliffguard keys generate``'s old advice), against a
real controller that holds the agent secret, over the real broker.

Expect: one clear line at the agent's start naming the missing setting; every event dead-lettered
as ``unsigned`` and counted in the store under the run's id; ``cliffguard status`` showing the run
with the reason and the count (and what to set) although the run itself never reached the store;
and the controller's log saying so in two lines, not one per event."""

from __future__ import annotations

import logging
import threading

import pytest
import torch

from cliffguard.agent.integrations import guarded_loop
from cliffguard.cli import main
from cliffguard.controller.config import ControllerConfig
from cliffguard.controller.service import ControllerService
from cliffguard.controller.store import read
from cliffguard.controller.store.db import session_scope
from cliffguard.core.keys import CommandPrivateKey, EventVerifier
from testing.controller_service import FAST_GROUP, store_engine, wait_for

pytestmark = pytest.mark.broker

RUN = "unsigned-loop"
AGENT_SECRET = b"the-agent-secret-0123456789abcdef"
PRIVATE = CommandPrivateKey.generate()


def _env(monkeypatch, kafka_cfg, tmp_path) -> None:
    for name in (
        "CLIFFGUARD_AGENT_SECRET",
        "CLIFFGUARD_AGENT_SECRET_FILE",
        "CLIFFGUARD_EVENT_KEY",
        "CLIFFGUARD_COMMAND_SECRET",
        "CLIFFGUARD_COMMAND_PUBLIC_KEY",
        "CLIFFGUARD_CONFIG",
    ):
        monkeypatch.delenv(name, raising=False)
    public = tmp_path / "command_ed25519.pub"
    public.write_bytes(PRIVATE.public_key().pem())
    monkeypatch.setenv("CLIFFGUARD_COMMAND_PUBLIC_KEY_FILE", str(public))  # and nothing else
    monkeypatch.setenv("CLIFFGUARD_KAFKA__BOOTSTRAP", kafka_cfg.bootstrap)
    monkeypatch.setenv("CLIFFGUARD_KAFKA__TOPIC_PREFIX", kafka_cfg.topic_prefix)
    monkeypatch.setenv("CLIFFGUARD_KAFKA__PARTITIONS", str(kafka_cfg.partitions))
    monkeypatch.setenv("CLIFFGUARD_AGENT__SPILL_DIR", str(tmp_path / "spill"))


def _train(steps: int) -> int:
    """The README's plain loop; returns how many events its publisher sent."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = [(torch.randn(8, 16), torch.randn(8, 1)) for _ in range(steps)]

    def loss_fn(batch):
        return torch.nn.functional.mse_loss(model(batch[0]), batch[1])

    loop = guarded_loop(model, optimizer, run=RUN, loss_fn=loss_fn, global_batch=8)
    for batch in loop.batches(loader):
        loop.backward(loss_fn(batch), tokens=8)
        loop.step()
    loop.close()
    return loop.agent.sink.stats()["sent"]


def test_unsigned_events_are_said_at_start_counted_per_run_and_shown_by_status(
    kafka_cfg, tmp_path, monkeypatch, caplog, capsys
):
    _env(monkeypatch, kafka_cfg, tmp_path)
    cfg = ControllerConfig(group_id="ctl-unsigned", tick_s=0.2, outbox_interval_s=0.2, **FAST_GROUP)
    with store_engine("sqlite", tmp_path) as (engine, url):
        svc = ControllerService(cfg, kafka_cfg, engine, PRIVATE, event_verifier=EventVerifier(AGENT_SECRET))
        stop = threading.Event()
        thread = threading.Thread(target=svc.run_forever, args=(stop,), daemon=True)
        svc.start()
        thread.start()
        try:
            with caplog.at_level(logging.WARNING):
                sent = _train(40)
                assert sent >= 42  # run.started, 40 steps, memory checkpoints, run.finished

                def counted() -> int:
                    with session_scope(engine) as s:
                        return sum(r["count"] for r in read.dlq_runs(s, RUN))

                wait_for(lambda: counted() == sent, timeout_s=60)
        finally:
            stop.set()
            thread.join(20)
        # the agent said it at start, once, naming what to set
        start_lines = [r for r in caplog.records if r.name == "cliffguard.agent.build"]
        assert len(start_lines) == 1 and start_lines[0].levelno == logging.ERROR
        said = start_lines[0].getMessage()
        assert f"run {RUN} cannot sign its events" in said and "CLIFFGUARD_AGENT_SECRET_FILE" in said
        # the controller: every event refused as unsigned, for this run, and none of it in the runs
        with session_scope(engine) as s:
            rows = read.dlq_runs(s)
            assert read.get_run(s, RUN) is None and read.list_runs(s) == []
        assert [(r["run_id"], r["reason"], r["count"]) for r in rows] == [(RUN, "unsigned", sent)]
        # its log: the first dead letter in full, then a count per minute for the rest (one at the
        # close when the run took less than a minute), never a line per event
        edge = [r.getMessage() for r in caplog.records if r.name == "cliffguard.controller.edge"]
        assert edge[0].startswith("dead letter ") and ": unsigned: " in edge[0] and 2 <= len(edge) <= 3, edge
        counts = [int(line.split()[0]) for line in edge[1:]]
        assert all(
            "more dead letters unsigned in the last" in line and f"runs: {RUN} x" in line for line in edge[1:]
        )
        assert sum(counts) == sent - 1
        # cliffguard status: the run, its reason and count, and what to set
        capsys.readouterr()
        assert main(["status", "--db", url]) == 0
        out = capsys.readouterr().out
        assert out.startswith("no runs in the store\n\nruns whose events are dead-lettered")
        row = next(line for line in out.splitlines() if line.strip().startswith(RUN))
        assert row.split()[:3] == [RUN, "unsigned", str(sent)]
        assert "CLIFFGUARD_AGENT_SECRET_FILE" in out
        assert main(["status", RUN, "--db", url]) == 1
        assert "none of its events was accepted" in capsys.readouterr().out


def test_with_the_agent_secret_the_same_loop_is_heard(kafka_cfg, tmp_path, monkeypatch, caplog):
    _env(monkeypatch, kafka_cfg, tmp_path)
    secret = tmp_path / "agent.secret"
    secret.write_bytes(AGENT_SECRET + b"\n")
    secret.chmod(0o600)
    monkeypatch.setenv("CLIFFGUARD_AGENT_SECRET_FILE", str(secret))  # what keys generate now says to set
    cfg = ControllerConfig(group_id="ctl-signed", tick_s=0.2, outbox_interval_s=0.2, **FAST_GROUP)
    with store_engine("sqlite", tmp_path) as (engine, _url):
        svc = ControllerService(cfg, kafka_cfg, engine, PRIVATE, event_verifier=EventVerifier(AGENT_SECRET))
        stop = threading.Event()
        thread = threading.Thread(target=svc.run_forever, args=(stop,), daemon=True)
        svc.start()
        thread.start()
        try:
            with caplog.at_level(logging.WARNING, logger="cliffguard.agent.build"):
                _train(20)

            def finished() -> bool:
                with session_scope(engine) as s:
                    run = read.get_run(s, RUN)
                    return run is not None and run["status"] == "finished"

            wait_for(finished, timeout_s=60)
        finally:
            stop.set()
            thread.join(20)
        with session_scope(engine) as s:
            run = read.get_run(s, RUN)
            assert read.dlq_runs(s) == [] and run["config"]["global_batch"] == 8
            assert (
                run["summary"]["validation"]["every"] == 50
            )  # run.finished's summary, through the controller
    assert not [r for r in caplog.records if r.name == "cliffguard.agent.build"]
