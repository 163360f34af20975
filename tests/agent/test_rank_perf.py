"""The ranks event's arrays: each rank's means in its own slots, cut into chunks by publishers."""

from __future__ import annotations

import math

import pytest

from cliffguard.agent.rank_perf import PERF_FIELDS, PerfAccumulator, publishes_chunk, ranks_payload
from cliffguard.core.enums import EventType
from cliffguard.core.events import make_event


def _step(t: float, mem: int) -> dict:
    return {"step_time_s": t, "data_wait_s": t / 10, "comm_exposed_s": t / 5, "mfu": 0.4, "tokens_per_s": 100.0,
            "mem_allocated": mem, "mem_reserved": 2 * mem}


def test_means_over_the_interval_and_the_newest_memory():
    acc = PerfAccumulator()
    acc.add(_step(0.1, 10))
    acc.add(_step(0.3, 20))
    slot = dict(zip(PERF_FIELDS, acc.slot(), strict=True))
    assert slot["step_time_s"] == pytest.approx(0.2) and slot["mem_reserved"] == 40 and acc.n == 2
    acc.reset()
    assert acc.n == 0 and acc.slot()[0] == 0.0


def test_chunks_come_from_their_first_rank_and_decode():
    world, per_event = 10, 4
    block = [0.0] * (len(PERF_FIELDS) * world)
    for r in range(world):  # what the SUM all-reduce leaves on every rank
        for f, v in enumerate(PerfAccumulator().slot()):
            block[f * world + r] = v + r
    losses = [2.0 + r for r in range(world)]
    publishers = [r for r in range(world) if publishes_chunk(r, per_event)]
    assert publishers == [0, 4, 8]
    chunks = [ranks_payload(block, losses, world=world, rank=r, per_event=per_event, steps=10) for r in publishers]
    assert [len(c["step_time_s"]) for c in chunks] == [4, 4, 2]
    assert chunks[2]["step_time_s"] == [8.0, 9.0] and chunks[2]["loss_local"] == [10.0, 11.0]
    assert chunks[1]["mem_allocated"] == [4, 5, 6, 7] and all(isinstance(v, int) for v in chunks[1]["mem_allocated"])
    for c in chunks:
        make_event(EventType.RANKS, "r", 10, c, world=world)  # valid on the wire
    nan_block = list(block)
    nan_block[5 * world] = math.nan  # a rank's memory slot went non-finite: 0, never a crash
    assert ranks_payload(nan_block, losses, world=world, rank=0, per_event=4, steps=1)["mem_allocated"][0] == 0
