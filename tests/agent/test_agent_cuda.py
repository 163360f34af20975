"""The agent's device paths, each on the CPU and on a GPU (testing/cuda.py): the step's packed
tensor staged through its host twin, that tensor all-reduced across two ranks, and a whole Agent
on a model that lives on the device."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from cliffguard.agent.hooks import Agent, AgentConfig
from cliffguard.agent.packed_step import PackedStep
from cliffguard.agent.rank_perf import PERF_FIELDS
from cliffguard.agent.sinks import InMemorySink
from cliffguard.core.enums import EventType
from cliffguard.trainer.model import GPT, GPTConfig
from testing.cuda import DEVICES


def _on(device: str, kwargs: dict) -> dict:
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}


@pytest.mark.parametrize("device", DEVICES)
def test_the_packed_tensor_lives_on_the_device_and_holds_what_the_cpu_one_holds(device):
    w, rank, layers = 3, 1, 4
    perf = [float(i + 1) for i in range(len(PERF_FIELDS))]
    cpu = PackedStep(world=w, rank=rank, n_layers=layers, device=torch.device("cpu"))
    dev = PackedStep(world=w, rank=rank, n_layers=layers, device=torch.device(device))
    fills = [
        {"loss_sum": torch.tensor(6.0), "micro": 2, "flag": 1.0, "sq": torch.arange(1 + layers, dtype=torch.float64) + 10,
         "layers": True, "perf": perf},
        {"loss_sum": torch.tensor([2.5]), "micro": 1, "flag": 0.0, "sq": 3.0, "layers": False, "perf": None},
        {"loss_sum": torch.tensor(1.0, dtype=torch.bfloat16), "micro": 1, "flag": 0.0, "sq": None, "layers": True,
         "perf": perf},
        {"loss_sum": torch.tensor(4.0), "micro": 4, "flag": 2.0, "sq": torch.tensor([9.0], dtype=torch.float64),
         "layers": False, "perf": None},  # a layout seen before: its buffer is reused, nothing of the last fill left
    ]
    for kwargs in fills:
        want = cpu.fill(**kwargs).tolist()
        packed = dev.fill(**_on(device, kwargs))
        assert packed.device.type == device and packed.dtype == torch.float64
        assert packed.tolist() == want
    for buf in dev._buffers.values():
        if device == "cpu":  # the buffer is its own host twin: numpy writes, no copy
            assert buf.staging is None and np.shares_memory(buf.host, buf.packed.numpy())
        else:  # the scalars are written into a host tensor, then moved in one copy
            assert buf.staging is not None and buf.staging.device.type == "cpu"
            assert np.shares_memory(buf.host, buf.staging.numpy()) and buf.packed.is_cuda


def _reduce_worker(rank: int, world: int, device: str, init_file: str, out_dir: str) -> None:
    n_gpus = torch.cuda.device_count() if device == "cuda" else 0
    # NCCL wants a GPU per rank; on a one-GPU machine both ranks share it over gloo's CUDA all-reduce
    backend = "nccl" if device == "cuda" and n_gpus >= world else "gloo"
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        dev = torch.device("cpu") if device == "cpu" else torch.device("cuda", rank % n_gpus)
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        ps = PackedStep(world=world, rank=rank, n_layers=2, device=dev)
        perf = [float(10 * rank + f) for f in range(len(PERF_FIELDS))]
        sq = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64, device=dev) * (rank + 1)
        packed = ps.fill(loss_sum=torch.tensor(2.0 * (rank + 1), device=dev), micro=2, flag=float(rank), sq=sq,
                         layers=True, perf=perf)
        dist.all_reduce(packed)
        Path(out_dir, f"{rank}.json").write_text(json.dumps({"values": packed.tolist(), "backend": backend}))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("device", DEVICES)
def test_the_packed_tensor_all_reduces_to_every_ranks_slots_across_two_ranks(device, tmp_path):
    world = 2
    mp.spawn(_reduce_worker, args=(world, device, str(tmp_path / "init"), str(tmp_path)), nprocs=world)
    results = [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(world)]
    ps = PackedStep(world=world, rank=0, n_layers=2, device=torch.device("cpu"))
    want = [1.0, 2.0, 1.0, 2.0, 3.0, 6.0, 9.0]  # losses / micro, flags summed, 2 contributors, sq summed
    want += [float(10 * r + f) for f in range(len(PERF_FIELDS)) for r in range(world)]  # field-major perf block
    assert ps.perf_at(True) == 7
    for res in results:
        assert res["values"] == want, res["backend"]


def _run_agent(device: str, steps: int = 4) -> tuple[list[dict], list[dict], int]:
    """Step and grad_hist events of a tiny GPT trained ``steps`` steps on ``device`` with the agent
    (histograms and per-layer norms every step), from the same weights and batches on any device."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sink = InMemorySink()
    agent = Agent(None, model, opt, AgentConfig(run=f"unit-{device}", hist_every=1, layer_norms_every=1,
                                                calibration_s=0.05), seq_len=8, sink=sink)
    agent.start(global_batch=4)
    gen = torch.Generator().manual_seed(1)
    try:
        for _ in range(steps):
            x = torch.randint(0, 256, (4, 8), generator=gen).to(device)
            _, loss = model(x, x)
            agent.after_forward(loss, tokens=x.numel())
            loss.backward()
            agent.after_backward()
            if agent.before_optimizer_step():
                opt.step()
            opt.zero_grad(set_to_none=True)
            agent.after_step()
    finally:
        agent.close()
    steps_ev = [e.data for e in sink.events if e.type == EventType.STEP]
    hists = [e.data for e in sink.events if e.type == EventType.GRAD_HIST]
    return steps_ev, hists, model.num_params()


@pytest.mark.parametrize("device", DEVICES)
def test_an_agent_on_a_device_model_reports_what_it_reports_on_the_cpu(device):
    got, hists, n_params = _run_agent(device)
    want, want_hists, _ = _run_agent("cpu")
    assert len(got) == len(want) == 4 and len(hists) == len(want_hists) == 4
    for g, w in zip(got, want, strict=True):
        assert g["loss"] == pytest.approx(w["loss"], rel=1e-4)
        assert g["grad_norm"] == pytest.approx(w["grad_norm"], rel=1e-4)
        assert g["guard"] == "ok" and g["skipped"] is False
        assert 0 < g["mfu"] <= 1 and g["mem_allocated"] > 0
        assert set(g["layer_grad_norms"]) == set(w["layer_grad_norms"])
        assert math.sqrt(sum(v * v for v in g["layer_grad_norms"].values())) == pytest.approx(g["grad_norm"], rel=1e-6)
    for h in hists:
        layers = h["layers"]
        assert sum(sum(v["counts"]) + v["zeros"] + v["nonfinite"] for v in layers.values()) == n_params
        assert all(v["nonfinite"] == 0 and math.isfinite(v["norm"]) for v in layers.values())


@pytest.mark.parametrize("device", DEVICES)
def test_the_parameter_hash_is_the_same_on_the_device_as_on_the_cpu_and_sees_one_flipped_bit(device):
    from cliffguard.agent.param_check import param_hash

    torch.manual_seed(0)
    params = [torch.randn(256, 128), torch.randn(128), torch.randn(64, 64).to(torch.bfloat16)]
    on_dev = [p.to(device) for p in params]
    h = param_hash(on_dev)
    assert h.device.type == device and int(h) == int(param_hash(params))
    on_dev[0].view(-1).view(torch.int32)[77] ^= 1 << 20
    assert int(param_hash(on_dev)) != int(h)
