"""The step's packed tensor: every slot where agent/hooks.py reads it, rebuilt clean each fill."""

from __future__ import annotations

import torch

from cliffguard.agent.packed_step import PackedStep
from cliffguard.agent.rank_perf import PERF_FIELDS


def test_fill_writes_this_ranks_slots_and_zeroes_the_rest_each_time():
    w, rank, layers = 3, 1, 4
    ps = PackedStep(world=w, rank=rank, n_layers=layers, device=torch.device("cpu"))
    perf = [float(i + 1) for i in range(len(PERF_FIELDS))]
    sq = torch.arange(1 + layers, dtype=torch.float64) + 10
    v = ps.fill(loss_sum=torch.tensor(6.0), micro=2, flag=0.0, sq=sq, layers=True, perf=perf).tolist()
    assert len(v) == w + 2 + 1 + layers + len(PERF_FIELDS) * w
    assert v[:w] == [0.0, 3.0, 0.0] and v[ps.flag_at] == 0.0 and v[ps.contributors_at] == 1.0
    assert v[ps.sq_at : ps.sq_at + 1 + layers] == sq.tolist()
    block = v[ps.perf_at(True) :]
    assert [block[f * w + rank] for f in range(len(PERF_FIELDS))] == perf
    assert sum(block) == sum(perf)  # the other ranks' slots stay 0
    # the next step reuses its layout's buffer: nothing of the last fill survives
    v = ps.fill(loss_sum=torch.tensor([2.5]), micro=1, flag=2.0, sq=None, layers=True, perf=None).tolist()
    assert v == [0.0, 2.5, 0.0, 2.0] + [0.0] * (1 + 1 + layers)
    v = ps.fill(loss_sum=torch.tensor(1.0, dtype=torch.bfloat16), micro=1, flag=0.0, sq=torch.tensor([4.0], dtype=torch.float64),
                layers=False, perf=None).tolist()
    assert v == [0.0, 1.0, 0.0, 0.0, 1.0, 4.0]


def test_a_hash_block_follows_the_perf_block_and_carries_the_hash_exactly():
    w, rank, layers = 3, 2, 2
    ps = PackedStep(world=w, rank=rank, n_layers=layers, device=torch.device("cpu"))
    h = torch.tensor((1 << 52) - 3, dtype=torch.int64)  # the largest kind of value: still exact in float64
    perf = [1.0] * len(PERF_FIELDS)
    v = ps.fill(loss_sum=torch.tensor(1.0), micro=1, flag=0.0, sq=None, layers=False, perf=perf, param_hash=h).tolist()
    at = ps.hashes_at(False, True)
    assert at == ps.perf_at(False) + len(PERF_FIELDS) * w and len(v) == at + w
    assert v[at:] == [0.0, 0.0, float((1 << 52) - 3)] and int(v[at + rank]) == (1 << 52) - 3
    assert sum(v[ps.perf_at(False) : at]) == sum(perf)
    v = ps.fill(loss_sum=torch.tensor(1.0), micro=1, flag=0.0, sq=None, layers=True, perf=None, param_hash=h).tolist()
    assert len(v) == ps.hashes_at(True, False) + w and v[-1] == float((1 << 52) - 3)
