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


class _Code:
    """Batches of real code (the default corpus's kind), ids per step."""

    def batch(self, step: int):
        from testing.data_watch import code_batches

        _, x, ids = next(code_batches(range(step, step + 1)))
        window = torch.cat([x, x[:, -1:]], dim=1)
        return window[:, :-1], window[:, 1:], ids


def test_the_data_faults_change_the_batch_content_and_keep_targets_consistent():
    from cliffguard.trainer.data_rules import DataRules

    sampler = wire_faults(["garble@1:1", "dup_burst@2:2", "data_shift@4"], rank=0, seed=7).sampler(_Code())
    batches = [sampler.batch(s) for s in range(6)]
    clean = [_Code().batch(s) for s in range(6)]
    assert torch.equal(batches[0][0], clean[0][0])
    x, y, ids = batches[1]
    flagged = (DataRules().garbled(x) > 1).tolist()
    assert flagged == [True, False] * 4 and torch.equal(x[1::2], clean[1][0][1::2]) and ids == clean[1][2]
    assert torch.equal(x[:, 1:], y[:, :-1])  # the targets are the same garbled text, shifted by one
    assert torch.equal(batches[3][0], batches[2][0]) and batches[3][2] == batches[2][2] == clean[2][2]
    prose = bytes(batches[4][0][0].tolist())
    assert prose != bytes(clean[4][0][0].tolist()) and b" the " in b"".join(bytes(r.tolist()) for r in batches[4][0])
    assert batches[5][2] == clean[5][2]  # the ids stay the sampler's


def test_a_bad_rank_scales_every_training_forward_of_its_node_and_not_a_validation():
    from cliffguard.trainer.faults import BAD_RANK_FACTOR

    faults = FaultInjector(["bad_rank@0:1"], rank=0)
    wiring = FaultWiring(faults)
    sampler = wiring.sampler(_Batches())
    model = _Model()
    wiring.attach(model)
    x = torch.ones(2, 4, dtype=torch.long)
    losses = []
    for step in range(3):
        sampler.batch(step)
        losses += [float(model(x)[1]) for _ in range(2)]  # the step's forward, then a re-run of it
    assert losses == [1.0, 1.0] + [BAD_RANK_FACTOR] * 4
    model.eval()
    assert float(model(x)[1]) == 1.0
