"""The fault wrappers (trainer/fault_wrappers.py): each fault reaches the loop through the object it
wraps, and without faults every wrapper is the object itself."""

from __future__ import annotations

import torch

from cliffguard.trainer.fault_wrappers import FaultWiring, wire_faults
from cliffguard.trainer.faults import FaultInjector
from cliffguard.trainer.schedule import WarmupCosine


class _Batches:
    def __init__(self) -> None:
        self.skipped: list[tuple[int, int]] = []

    def batch(self, step: int):
        x = torch.zeros(2, 4, dtype=torch.long)
        return x, x.clone(), list(range(2))

    def skip(self, first: int, stop: int) -> None:
        self.skipped.append((first, stop))


class _Model(torch.nn.Module):
    def forward(self, x):
        return x, x.float().mean()


def test_without_faults_every_wrapper_is_the_object_itself():
    wiring = wire_faults([], rank=0)
    sampler, schedule = _Batches(), WarmupCosine(1.0, 0.1, 2, 10)
    factory = lambda: None  # noqa: E731
    assert wiring.sampler(sampler) is sampler and wiring.schedule(schedule) is schedule
    assert wiring.producers(factory) is factory
    model = _Model()
    wiring.attach(model)
    assert not model._forward_hooks and not model._forward_pre_hooks


def test_each_fault_reaches_the_loop_through_its_wrapper():
    slept, killed = [], []
    faults = FaultInjector(["corrupt@1", "nan@2", "lr_blowup@3x10:1", "slow_rank@0:0.5:2", "kill_rank@0:4",
                            "broker_outage@1:1"], rank=0, kill=lambda: killed.append(True), sleep=slept.append)
    wiring = FaultWiring(faults)
    inner = _Batches()
    sampler = wiring.sampler(inner)
    schedule = wiring.schedule(WarmupCosine(1.0, 1.0, 0, 10))
    model = _Model()
    wiring.attach(model)
    losses, downs = [], []
    for step in range(5):
        x, _y, _ = sampler.batch(step)
        downs.append(wiring.switch.down)
        assert (x.abs().sum() > 0) == (step == 1)  # only step 1's batch is corrupted
        losses += [float(model(x)[1]) for _ in range(2)]  # two micro-batches
        assert schedule.lr_at(step) == (10.0 if step == 3 else 1.0)
    assert downs == [False, True, False, False, False]
    assert [torch.isnan(torch.tensor(v)).item() for v in losses[4:6]] == [True, True]
    assert sum(torch.isnan(torch.tensor(v)).item() for v in losses) == 2
    assert slept == [0.5, 0.5, 0.5]  # steps 2, 3 and 4: once per step, not per micro-batch
    assert killed == [True]
    sampler.skip(3, 5)  # everything else is the wrapped sampler's
    assert inner.skipped == [(3, 5)]
    model.eval()
    assert not torch.isnan(model(torch.zeros(2, 4))[1])  # validating: never a fault
