"""The Accelerate tracker, with the in-memory sink (the Hugging Face callback: test_integrations_hf.py)."""

from __future__ import annotations

import torch
from accelerate import Accelerator

from cliffguard.agent.hooks import Agent, AgentConfig
from cliffguard.agent.integrations import AgentTracker
from cliffguard.agent.sinks import InMemorySink
from cliffguard.core.enums import EventType
from cliffguard.trainer.model import GPT, GPTConfig


def _model():
    torch.manual_seed(0)
    return GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8))


def test_accelerate_tracker_turns_logged_scalars_into_events():
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sink = InMemorySink()
    agent = Agent(None, model, opt, AgentConfig(run="trk", heartbeat_s=60, calibration_s=0.05), seq_len=8, sink=sink)
    acc = Accelerator(cpu=True, log_with=[AgentTracker(agent)])
    acc.init_trackers("proj", config={"lr": 0.1})
    for step in range(3):
        acc.log({"loss": 2.0 - 0.1 * step, "lr": 0.1, "tokens": 64, "note": "text is ignored"}, step=step)
    acc.log({"val_acc": 0.5}, step=3)  # no loss: not a step
    acc.end_training()
    types = [e.type for e in sink.events]
    assert types[0] is EventType.RUN_STARTED and sink.events[0].data["config"] == {"lr": 0.1}
    steps = [e for e in sink.events if e.type is EventType.STEP]
    assert [e.step for e in steps] == [0, 1, 2]
    assert [e.data["loss"] for e in steps] == [2.0, 1.9, 1.8]
    assert all(e.data["lr"] == 0.1 and e.data["tokens"] == 64 and e.data["mfu"] > 0 for e in steps)
    assert EventType.RUN_FINISHED in types and sink.closed
