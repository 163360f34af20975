"""GuardedLoop: the kit's six step calls behind batches/backward/step, in the kit's order, on a real
agent and kit (world 1, CPU, in-memory sink and command source)."""

from __future__ import annotations

import pytest
import torch

from cliffguard.agent.config import AgentConfig
from cliffguard.agent.guard import GuardConfig
from cliffguard.agent.hooks import Agent
from cliffguard.agent.integrations.loop import GuardedLoop
from cliffguard.agent.recovery import KitConfig, RecoveryKit
from cliffguard.agent.sinks import InMemorySink
from cliffguard.core.enums import CommandType, EventType
from cliffguard.core.events import make_command
from cliffguard.core.spike import SpikeConfig
from testing.trainer import FakeCommands


def _batch(i: int, spike: bool = False):
    g = torch.Generator().manual_seed(i)
    x = torch.randn(8, 4, generator=g)
    y = x.sum(dim=1, keepdim=True)
    return (x, y * 1000) if spike else (x, y)


def _loop():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    cfg = AgentConfig(run="loop", hist_every=0, heartbeat_s=60, calibration_s=0.05, command_tick_s=0.01,
                      guard=GuardConfig(spike=SpikeConfig(window=16, min_history=6)),
                      recovery=KitConfig(snapshot_every=2, ring_size=4, pause_timeout_s=0))
    sink, source = InMemorySink(), FakeCommands()
    agent = Agent(None, model, opt, cfg, sink=sink, command_source=source)

    def loss_fn(b):
        return torch.nn.functional.mse_loss(model(b[0]), b[1])

    kit = RecoveryKit(agent, model, opt, sched, loss_fn=loss_fn)
    kit.start()
    return GuardedLoop(kit, opt, sched), model, loss_fn, sink, source


def test_the_loop_trains_skips_a_spike_and_finishes_the_run():
    loop, model, loss_fn, sink, _ = _loop()
    applied = []
    for batch in loop.batches(_batch(i, spike=i == 9) for i in range(12)):
        before = model.weight.detach().clone()
        loop.backward(loss_fn(batch), tokens=8)
        applied.append(loop.step())
        assert applied[-1] == (not torch.equal(before, model.weight))
    loop.close()
    steps = [e for e in sink.events if e.type is EventType.STEP]
    assert len(steps) == 12 and applied.count(False) == 1 and applied[9] is False
    assert steps[9].data["skipped"] is True and steps[0].data["tokens"] == 8
    finished = [e for e in sink.events if e.type is EventType.RUN_FINISHED]
    assert len(finished) == 1 and finished[0].data["steps"] == 12 and "final_loss" in finished[0].data
    assert len(loop.kit.kept) == 4 and all(float(y.abs().max()) < 100 for _x, y in loop.kit.kept)


def test_a_stop_command_ends_the_batches_at_a_boundary():
    loop, _model, loss_fn, sink, source = _loop()
    seen = 0
    for batch in loop.batches(_batch(i) for i in range(50)):
        seen += 1
        loop.backward(loss_fn(batch))
        loop.step()
        if seen == 5:
            source.queue.append(make_command(CommandType.STOP, "loop"))
    loop.close()
    # (commands are polled on the agent's command tick: the stop lands at one of the next boundaries)
    assert 5 <= seen < 50 and loop.agent.step == seen
    acks = [e.data for e in sink.events if e.type is EventType.COMMAND_ACK]
    assert [a["status"] for a in acks] == ["applied"]


def test_an_exception_inside_the_with_block_fails_the_run_and_propagates():
    loop, _model, loss_fn, sink, _ = _loop()
    with pytest.raises(RuntimeError, match="boom"), loop:
        for i, batch in enumerate(loop.batches(_batch(i) for i in range(10))):
            loop.backward(loss_fn(batch))
            loop.step()
            if i == 2:
                raise RuntimeError("boom")
    types = [e.type for e in sink.events]
    assert EventType.RUN_FAILED in types and EventType.RUN_FINISHED not in types
    assert [e.data["error"] for e in sink.events if e.type is EventType.RUN_FAILED] == ["boom"]
