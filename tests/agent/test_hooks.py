"""The Agent on a single-process loop with the in-memory sink: every event type, guard, commands.

The 2-process behaviour (all-reduce, broadcast, real broker) is in tests/trainer/test_train_e2e.py.
"""

from __future__ import annotations

import math
import time

import pytest
import torch

from cliffguard.agent.guard import GuardConfig
from cliffguard.agent.hooks import Agent, AgentConfig
from cliffguard.agent.sinks import InMemorySink
from cliffguard.core.enums import AckStatus, CommandType, EventType
from cliffguard.core.events import make_command
from cliffguard.core.spike import SpikeConfig
from cliffguard.trainer.model import GPT, GPTConfig


class FakeCommands:
    def __init__(self) -> None:
        self.queue: list = []
        self.closed = False

    def poll(self):
        out, self.queue = self.queue, []
        return out

    def close(self) -> None:
        self.closed = True


def _setup(**cfg):
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sink, source = InMemorySink(), FakeCommands()
    config = AgentConfig(run="unit", heartbeat_s=0.05, calibration_s=0.05,
                         guard=GuardConfig(spike=SpikeConfig(window=16, min_history=4)), **cfg)
    agent = Agent(None, model, opt, config, seq_len=8, sink=sink, command_source=source)
    return model, opt, agent, sink, source


def _step(model, opt, agent, *, nan: bool = False) -> bool:
    x = torch.randint(0, 256, (4, 8))
    with agent.data_wait():
        time.sleep(0.002)
    _, loss = model(x, x)
    if nan:
        loss = loss * float("nan")
    agent.after_forward(loss, tokens=x.numel())
    loss.backward()
    agent.after_backward()
    ok = agent.before_optimizer_step()
    if ok:
        opt.step()
    opt.zero_grad(set_to_none=True)
    agent.after_step()
    return ok


def test_every_event_type_with_sane_values():
    model, opt, agent, sink, source = _setup(hist_every=2, layer_norms_every=3)
    agent.start(global_batch=4, lr_schedule={"kind": "constant"})
    for _ in range(5):
        _step(model, opt, agent)
    time.sleep(0.12)
    agent.close(final_loss=agent.global_loss)
    by_type: dict[EventType, list] = {}
    for ev in sink.events:
        by_type.setdefault(ev.type, []).append(ev)
    started = by_type[EventType.RUN_STARTED][0].data
    assert started["peak_source"] == "calibration" and started["peak_flops"] > 0
    assert started["n_params"] == model.num_params() and started["seq_len"] == 8
    steps = by_type[EventType.STEP]
    assert [e.step for e in steps] == [0, 1, 2, 3, 4]
    for e in steps:
        d = e.data
        assert 0 < d["mfu"] <= 1
        assert d["comm_exposed_s"] >= 0 and d["data_wait_s"] >= 0.002
        assert d["step_time_s"] == pytest.approx(d["data_wait_s"] + d["comm_exposed_s"] + d["compute_s"])
        assert d["loss"] == d["loss_local"] > 0 and d["grad_norm"] > 0
        assert d["tokens"] == 32 and d["tokens_per_s"] > 0 and d["mem_allocated"] > 0
        assert d["guard"] == "ok" and d["skipped"] is False
        if e.step % 3 == 0:  # per-layer work only every layer_norms_every steps
            assert set(d["layer_grad_norms"]) == {n for n, _ in model.named_parameters()}
            assert math.sqrt(sum(v * v for v in d["layer_grad_norms"].values())) == pytest.approx(d["grad_norm"])
        else:
            assert "layer_grad_norms" not in d
    hists = by_type[EventType.GRAD_HIST]
    assert [e.step for e in hists] == [0, 2, 4]
    for e in hists:
        layers = e.data["layers"]
        total = sum(sum(v["counts"]) + v["zeros"] + v["nonfinite"] for v in layers.values())
        assert total == model.num_params()
    assert len(by_type[EventType.HEARTBEAT]) >= 2
    assert by_type[EventType.RUN_FINISHED][0].data["steps"] == 5
    assert source.closed and sink.closed


def test_guard_skips_nan_step_without_update():
    model, opt, agent, sink, _ = _setup(hist_every=0)
    agent.start()
    for _ in range(5):
        _step(model, opt, agent)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    assert _step(model, opt, agent, nan=True) is False
    after = dict(model.named_parameters())
    assert all(torch.equal(before[n], after[n]) for n in before)
    last = sink.events[-1] if sink.events[-1].type is EventType.STEP else [e for e in sink.events if e.type is EventType.STEP][-1]
    assert last.data["guard"] == "skip" and last.data["skipped"] is True
    assert _step(model, opt, agent) is True  # training goes on with the next batch
    agent.close()


def test_commands_reach_the_step_boundary_and_acks_are_emitted():
    model, opt, agent, sink, source = _setup(hist_every=0)
    agent.start()
    _step(model, opt, agent)
    assert agent.poll_commands() == []
    cmd = make_command(CommandType.SET_LR_SCALE, "unit", {"lr_scale": 0.5})
    source.queue.append(cmd)
    _step(model, opt, agent)
    got = agent.poll_commands()
    assert [c.id for c in got] == [cmd.id]
    agent.ack(cmd, AckStatus.APPLIED, "ok")
    assert agent.poll_commands() == []  # delivered once
    acks = [e for e in sink.events if e.type is EventType.COMMAND_ACK]
    assert acks[0].data == {"cmd": cmd.id, "cmd_type": "set_lr_scale", "status": "applied", "detail": "ok"}
    cmds, value = agent.exchange("tick")
    assert cmds == [] and value == "tick"
    agent.close()


def test_agent_config_validation():
    with pytest.raises(ValueError, match="run"):
        AgentConfig(run="")
    for bad in ["team a/run 7", "-lead", "NaN", "x" * 129]:
        with pytest.raises(ValueError, match="^run: "):
            AgentConfig(run=bad)
    AgentConfig(run="team-a.run_7:x")
    with pytest.raises(ValueError, match="heartbeat_s"):
        AgentConfig(run="r", heartbeat_s=0)
    for field, bad in [("ranks_every", -1), ("ranks_per_event", 0), ("ranks_per_event", 4097), ("detail_steps", -1)]:
        with pytest.raises(ValueError, match=f"^{field}: "):
            AgentConfig(run="r", **{field: bad})


def test_a_calibrated_peak_beaten_by_the_model_is_raised_so_mfu_stays_at_most_one():
    model, opt, agent, sink, _ = _setup()
    agent.start(global_batch=4)
    agent.probe.peak_flops = 1.0  # as if calibration ran while other processes held every core
    _step(model, opt, agent)
    agent.close()
    step = next(e for e in sink.events if e.type is EventType.STEP)
    assert step.data["mfu"] == pytest.approx(1.0)
    assert agent.peak_source == "calibration+observed" and agent.peak_flops > 1.0


def test_a_configured_peak_is_never_moved():
    model, opt, agent, sink, _ = _setup(peak_flops=1.0)
    agent.start(global_batch=4)
    _step(model, opt, agent)
    agent.close()
    step = next(e for e in sink.events if e.type is EventType.STEP)
    assert agent.peak_source == "config" and agent.peak_flops == 1.0
    assert step.data["mfu"] > 1.0  # the operator's number is reported against, not corrected


def test_rank_zero_sends_a_run_level_step_and_ranks_every_n_steps():
    model, opt, agent, sink, _ = _setup(hist_every=0, ranks_every=3)
    agent.start()
    for _ in range(7):
        _step(model, opt, agent)
    agent.close()
    steps = [e for e in sink.events if e.type is EventType.STEP]
    assert all(e.data["rank_losses"]["argmax"] == 0 and e.data["rank_losses"]["outliers"] == [] for e in steps)
    ranks = [e for e in sink.events if e.type is EventType.RANKS]
    assert [(e.step, e.data["steps"]) for e in ranks] == [(3, 3), (6, 3)]
    mean = sum(e.data["step_time_s"] for e in steps[3:6]) / 3
    assert ranks[1].data["step_time_s"] == [pytest.approx(mean)] and ranks[1].data["loss_local"] == [steps[6].data["loss_local"]]
    assert ranks[1].data["mem_reserved"][0] == steps[5].data["mem_reserved"]
    beats = [e for e in sink.events if e.type is EventType.HEARTBEAT]
    assert beats and beats[0].data["ranks"] == [0] and beats[0].data["collectives"] == [""]


def test_a_detail_command_opens_the_per_rank_window_and_is_acked():
    from cliffguard.agent.dispatch import dispatch

    model, opt, agent, sink, source = _setup(hist_every=0)
    agent.start()
    _step(model, opt, agent)
    source.queue.append(make_command(CommandType.DETAIL, "unit", {"steps": 5}))
    source.queue.append(make_command(CommandType.DETAIL, "unit", {"steps": 0}))
    _step(model, opt, agent)
    cmds = agent.poll_commands()
    outcomes = [dispatch(c, None, agent.modes, agent.ack).status for c in cmds]  # the route needs no target
    assert outcomes == [AckStatus.APPLIED, AckStatus.REJECTED]
    assert agent.probe.detail.active(2) and agent.probe.detail.active(6) and not agent.probe.detail.active(7)
    agent.close()

def test_start_declares_the_capabilities_it_is_given_and_none_when_not_given():
    _, _, agent, sink, _ = _setup()
    agent.start(capabilities=["validate", CommandType.PAUSE])
    agent.close()
    assert sink.events[0].data["capabilities"] == [CommandType.PAUSE, CommandType.VALIDATE]
    _, _, agent, sink, _ = _setup()
    agent.start()
    agent.close()
    assert "capabilities" not in sink.events[0].data  # the controller reads that as every command
    _, _, agent, _, _ = _setup()
    with pytest.raises(ValueError, match="capabilities: unknown command 'fly'"):
        agent.start(capabilities=["fly"])


@pytest.mark.parametrize("buckets", [True, False])
def test_under_ddp_the_step_grad_norm_comes_from_the_reduced_buckets_and_matches_the_gradients(tmp_path, buckets):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = DDP(GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8)))
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        sink = InMemorySink()
        agent = Agent(None, model, opt, AgentConfig(run="unit", calibration_s=0.05, layer_norms_every=2,
                                                           grad_norm_from_buckets=buckets), seq_len=8, sink=sink)
        agent.start()
        for _ in range(4):
            x = torch.randint(0, 256, (4, 8))
            _, loss = model(x, x)
            agent.after_forward(loss, tokens=x.numel())
            loss.backward()
            agent.after_backward()
            from_buckets = agent.probe._bucket_norm_sq is not None
            agent.before_optimizer_step()
            expected = math.sqrt(sum(float(p.grad.double().square().sum()) for p in model.parameters()))
            opt.step()
            opt.zero_grad(set_to_none=True)
            d = agent.after_step()
            assert from_buckets == buckets and d["grad_norm"] == pytest.approx(expected, rel=1e-5)
            assert ("layer_grad_norms" in d) == ((agent.step - 1) % 2 == 0)
        agent.close()
    finally:
        dist.destroy_process_group()
