"""agent/recovery/bad_batches.py: a batch classified as data is never fed again, through the
bundled trainer's sampler: after a rollback to an older state, a restart and a world-size change."""

from __future__ import annotations

import pytest

from cliffguard.agent.recovery.bad_batches import BadBatch, BadBatchList
from cliffguard.trainer.data import DataConfig, Sampler, load_corpus


@pytest.fixture(scope="module")
def corpus():
    return load_corpus(DataConfig(seq_len=32, max_bytes=200_000, block_bytes=4096))


def _sampler(corpus, world: int = 2, rank: int = 0) -> Sampler:
    return Sampler(corpus, DataConfig(seq_len=32, max_bytes=200_000, block_bytes=4096), 8, rank=rank, world=world)


def _fed(sampler: Sampler, steps: range) -> set[int]:
    return {sid for step in steps for r in range(sampler.world) for sid in sampler.sample_ids(step, rank=r)}


def test_a_bad_shard_is_never_fed_again_after_a_rollback_a_restart_and_a_rebatch(corpus) -> None:
    sampler = _sampler(corpus)
    steps = range(0, 2 * corpus.n_train_samples // 8)  # two epochs: every sample comes round again
    older = sampler.state_dict()  # a rollback target saved before the batch went bad
    bad = BadBatchList(exclude=lambda ids: sampler.flag(ids, 0.0))
    ids = sampler.sample_ids(5, rank=1)
    assert bad.add(BadBatch(5, tuple(ids), 1, "data"))
    assert not bad.add(BadBatch(5, tuple(ids), 1, "data")), "the same entry twice"
    assert not set(ids) & _fed(sampler, steps)

    sampler.load_state_dict(older)  # the rollback
    assert not set(ids) & _fed(sampler, steps)

    restarted = _sampler(corpus)  # a new process: sampler and list from the checkpoint
    restarted.load_state_dict(sampler.state_dict())
    again = BadBatchList(exclude=lambda i: restarted.flag(i, 0.0))
    again.load_state_dict(bad.state_dict())
    assert again.sample_ids == set(ids)
    restarted.rebatch(10, 8, world=4, rank=3)  # the elastic world-size change
    assert not set(ids) & _fed(restarted, steps)


def test_loading_an_older_list_forgets_nothing() -> None:
    bad = BadBatchList()
    bad.add(BadBatch(3, (1, 2), 0))
    older = bad.state_dict()
    bad.add(BadBatch(9, (7,), None, "whole batch"))
    bad.load_state_dict(older)
    assert [e.step for e in bad.entries] == [3, 9]


@pytest.mark.parametrize("state", [{}, {"entries": [{"step": "3", "sample_ids": [1]}]},
                                   {"entries": [{"step": 3, "sample_ids": [1]}, {"step": 3, "sample_ids": [1], "rank": "0"}]}])
def test_a_hostile_state_is_refused_and_loses_nothing(state) -> None:
    bad = BadBatchList()
    bad.add(BadBatch(1, (4,), 0))
    with pytest.raises(ValueError, match="bad"):
        bad.load_state_dict(state)
    assert bad.sample_ids == {4}
