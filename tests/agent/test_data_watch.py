"""The data watch (agent/data_watch/): one batch's figures, near-duplicates, the window's payload
and the thread, on real byte windows of the standard library's code (testing/data_watch.py)."""

from __future__ import annotations

import logging
import threading

import numpy as np
import pytest
import torch

from cliffguard.agent.data_watch.batch import LEN_BINS, TokenSketch, bucket_ids, length_counts, token_slots
from cliffguard.agent.data_watch.config import DataWatchConfig
from cliffguard.agent.data_watch.near_dup import NearDuplicates
from cliffguard.agent.data_watch.watcher import DataWatch
from cliffguard.agent.hooks import Agent, AgentConfig
from cliffguard.agent.sinks import InMemorySink
from cliffguard.core.enums import EventType
from cliffguard.trainer.model import GPT, GPTConfig
from testing.data_watch import code_batches, watch


def _batch(step: int = 0, batch: int = 8) -> tuple[torch.Tensor, list[int]]:
    _, x, ids = next(code_batches(range(step, step + 1), batch=batch))
    return x, ids


# ---------------------------------------------------------------------------------------------- one batch


def test_slots_come_from_the_mask_else_the_pad_id_else_every_slot():
    x = torch.tensor([[5, 6, 0, 0], [7, 0, 0, 0]]).numpy()
    mask = np.array([[1, 1, 1, 0], [1, 0, 0, 0]])
    assert token_slots(x, mask).sum(1).tolist() == [3, 1]
    assert token_slots(x, pad_id=0).sum(1).tolist() == [2, 1]
    assert token_slots(x).all()
    with pytest.raises(ValueError, match="attention_mask: shape"):
        token_slots(x, mask[:, :2])


def test_lengths_fall_in_fixed_log2_bins():
    counts = length_counts(np.array([0, 1, 2, 3, 4, 64, 65, 10**6]))
    assert len(counts) == LEN_BINS
    assert counts[0] == 1 and counts[1] == 1 and counts[2] == 2 and counts[3] == 1  # 0 | 1 | 2-3 | 4-7
    assert counts[7] == 2 and counts[-1] == 1  # 64 and 65 in [64, 128): bin 7; a huge one in the last


def test_small_ids_have_their_own_bucket_and_large_ones_hash_into_the_range():
    ids = np.array([[0, 17, 255, 256, 50_000, 2**40]])
    b = bucket_ids(ids, 256)
    assert b[0, :3].tolist() == [0, 17, 255]
    assert ((b >= 0) & (b < 256)).all()
    assert bucket_ids(np.array([[50_000]]), 256)[0, 0] == b[0, 4]  # the same id, the same bucket


def test_novelty_is_high_for_tokens_the_run_has_not_seen():
    sketch = TokenSketch(256)
    x, _ = _batch()
    for step in range(20):
        sketch.observe(_batch(step)[0].numpy(), np.ones((8, 64), dtype=bool))
    unseen = np.full((1, 64), 200)  # a byte code never uses
    code = x[:1].numpy()
    _, nov = sketch.observe(np.concatenate([code, unseen]), np.ones((2, 64), dtype=bool))
    assert nov[1] > nov[0] + 3


# ---------------------------------------------------------------------------------------------- duplicates


def _dups(cfg=None):
    return NearDuplicates(cfg or DataWatchConfig())


def _observe(nd, step, x, ids):
    slots = np.ones(x.shape, dtype=bool)
    sig, has = nd.signatures(x.numpy(), slots)
    return nd.observe(step, ids, sig, has)


def test_a_copy_in_the_batch_is_found_and_says_whose_copy_it_is():
    x, ids = _batch()
    x = x.clone()
    x[5] = x[1]
    d = _observe(_dups(), 0, x, ids)
    assert d.in_batch.tolist() == [False] * 5 + [True] + [False] * 2
    assert d.of[5] == ids[1] and d.similarity[5] == 1.0
    assert not d.in_window.any()


def test_a_near_copy_counts_and_other_code_does_not():
    x, ids = _batch()
    x = x.clone()
    x[6] = x[2]
    x[6, 62:] = 33  # the last 2 bytes differ: 55 of the 59 distinct 8-byte shingles are shared
    d = _observe(_dups(), 0, x, ids)
    assert d.in_batch[6] and d.of[6] == ids[2] and 0.8 <= d.similarity[6] < 1.0
    nd = _dups()
    found = sum(int(_observe(nd, s, *_batch(s)).any.sum()) for s in range(100))
    # 800 windows drawn with replacement from ~31k: ~10 repeat a window by chance, a few boilerplate
    assert found <= 24


def test_an_earlier_batch_in_the_window_is_found_until_it_ages_out():
    nd = _dups(DataWatchConfig(dup_window_steps=5))
    x, ids = _batch(0)
    _observe(nd, 0, x, ids)
    again = _observe(nd, 3, x, [i + 1 for i in ids])
    assert again.in_window.all() and not again.in_batch.any() and again.of == ids
    late = _observe(nd, 10, x, ids)  # steps 0 and 3 are more than 5 steps back
    assert not late.any.any()


def test_rewind_forgets_the_steps_to_be_replayed():
    nd = _dups()
    for s in range(10):
        _observe(nd, s, *_batch(s))
    nd.rewind(5)
    replay = _observe(nd, 5, *_batch(5))
    assert not replay.any.any()
    assert _observe(nd, 6, *_batch(2)).in_window.all()  # steps before 5 are still remembered


def test_padding_is_no_shingle():
    nd = _dups()
    x = torch.zeros((2, 64), dtype=torch.long)  # two all-padding rows
    sig, has = nd.signatures(x.numpy(), np.zeros((2, 64), dtype=bool))
    assert not has.any()
    assert not nd.observe(0, [1, 2], sig, has).any.any()


# ---------------------------------------------------------------------------------------------- the watch


def test_a_window_per_every_steps_with_every_figure():
    events = watch(code_batches(range(30)))
    assert [e.step for e in events] == [9, 19, 29]
    d = events[1].data
    assert d["first_step"] == 10 and d["steps"] == list(range(10, 20)) and d["batches"] == 10
    assert d["sequences"] == 80 and d["tokens"] == 80 * 64 and d["pad_share"] == 0.0
    assert sum(d["sketch"]) == 80 * 64 and len(d["sketch"]) == 256
    assert d["len_counts"][7] == 80  # every window is 64 bytes long
    assert len(d["step_ppl"]) == len(d["step_garbled"]) == len(d["step_dup"]) == 10
    assert min(d["step_ppl"]) > 1.0 and max(d["step_ppl"]) < 2.5  # code under a model of code
    reasons = d["outlier_reasons"]
    assert reasons.count("novelty") == 8 and reasons.count("perplexity") == 8
    assert set(d["outlier_ids"]) <= {i for _, _, ids in code_batches(range(10, 20)) for i in ids}


def test_duplicates_are_counted_once_in_the_sketch_and_named():
    def batches():
        for step, x, ids in code_batches(range(20)):
            if step == 12:
                x = x.clone()
                x[4:] = x[0]
            yield step, x, ids

    d = watch(batches())[1].data
    assert d["step_dup"][2] == 0.5 and d["dup_in_batch"] == 4 / 80
    assert sum(d["sketch"]) == 76 * 64  # the four copies' tokens are left out
    named = {i for r, i in zip(d["outlier_reasons"], d["outlier_ids"], strict=True) if r == "duplicate"}
    _, _, ids = next(code_batches(range(12, 13)))
    assert set(ids[4:]) <= named


def test_the_pad_share_and_lengths_of_a_padded_batch():
    cfg = DataWatchConfig(every=1, queue=100, pad_id=0)
    out = []
    w = DataWatch(cfg, lambda t, d, step: out.append(d)).start()
    x, ids = _batch()
    x = x.clone()
    x[:4, 32:] = 0
    w.observe(0, x, ids)
    w.observe(1, x, ids, attention_mask=torch.ones_like(x))  # a mask wins over the pad id
    w.close()
    assert out[0]["pad_share"] == pytest.approx(4 * 32 / (8 * 64)) and out[0]["len_counts"][6] == 4
    assert out[1]["pad_share"] == 0.0 and "step_ppl" not in out[0]


def test_a_replayed_step_sends_the_window_so_far_and_is_not_its_own_duplicate():
    batches = [*code_batches(range(15)), *code_batches(range(12, 20))]  # back to 12 after 14
    events = watch(iter(batches))
    assert [(e.data["first_step"], e.step) for e in events] == [(0, 9), (10, 14), (12, 19)]
    assert all(e.data["dup_share"] == 0.0 for e in events)


def test_a_full_queue_skips_and_counts_and_the_next_event_says_so(caplog):
    gate = threading.Event()
    out = []
    w = DataWatch(DataWatchConfig(every=1, queue=2), lambda t, d, step: out.append(d),
                  garbled=lambda x: (gate.wait(10), torch.zeros(x.shape[0]))[1]).start()
    with caplog.at_level(logging.WARNING):
        for step, x, ids in code_batches(range(6)):
            w.observe(step, x, ids)
    assert w.dropped >= 3 and "skipped so far" in caplog.text
    gate.set()
    w.close()
    assert sum(d.get("dropped", 0) for d in out) == w.dropped


def test_a_scorer_that_raises_is_logged_and_the_rest_goes_on(caplog):
    calls = []

    def flaky(x):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("boom")
        return torch.ones(x.shape[0])

    out = []
    w = DataWatch(DataWatchConfig(every=1, queue=100), lambda t, d, step: out.append(d), perplexity=flaky).start()
    with caplog.at_level(logging.ERROR):
        for step, x, ids in code_batches(range(3)):
            w.observe(step, x, ids)
        w.close()
    assert w.errors == 1 and "perplexity scorer raised at step 1" in caplog.text
    assert out[0]["step_ppl"] == [1.0] and out[2]["step_ppl"] == [1.0]
    assert "step_ppl" not in out[1]  # nothing where it raised
    assert [d["steps"] for d in out] == [[0], [1], [2]]


def test_a_scorer_missing_for_part_of_a_window_leaves_nan_at_those_steps():
    out = []
    w = DataWatch(DataWatchConfig(every=3, queue=100), lambda t, d, step: out.append(d),
                  perplexity=lambda x: torch.ones(x.shape[0]) if x.shape[1] == 64 else 1 / 0).start()
    batches = list(code_batches(range(3)))
    w.observe(0, batches[0][1][:, :32], batches[0][2])  # a narrower batch: measured as a group of its own
    for step, x, ids in batches[1:]:
        w.observe(step, x, ids)
    w.close()
    ppl = out[0]["step_ppl"]
    assert ppl[0] != ppl[0] and ppl[1:] == [1.0, 1.0] and out[0]["pad_share"] == 0.0


def test_close_sends_the_partial_window_and_later_batches_are_ignored():
    out = []
    w = DataWatch(DataWatchConfig(queue=100), lambda t, d, step: out.append((step, d))).start()
    for step, x, ids in code_batches(range(13)):
        w.observe(step, x, ids)
    w.close()
    w.observe(13, *_batch(13))
    assert [(s, d["batches"]) for s, d in out] == [(9, 10), (12, 3)]


# ---------------------------------------------------------------------------------------------- the agent


def _agent(**watch_cfg):
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8))
    sink = InMemorySink()
    agent = Agent(None, model, None, AgentConfig(run="dw", heartbeat_s=5, calibration_s=0.05,
                                                 data_watch=DataWatchConfig(**watch_cfg)), seq_len=8, sink=sink)
    return agent, sink


def test_the_agent_watches_its_batches_and_sends_the_last_window_before_the_run_ends():
    agent, sink = _agent(every=4)
    agent.start()
    assert agent.watch_data() is agent.data_watch is not None
    for step, x, ids in code_batches(range(6)):
        agent.observe_batch(x, ids, step=step)
    agent.close()
    types = [e.type for e in sink.events]
    stats = [e for e in sink.events if e.type is EventType.DATA_STATS]
    assert [e.step for e in stats] == [3, 5]
    assert types.index(EventType.RUN_FINISHED) > types.index(EventType.DATA_STATS, types.index(EventType.DATA_STATS) + 1)


@pytest.mark.parametrize("cfg", [{"enabled": False}, {"ranks": 0}])
def test_no_watch_where_it_is_off_and_observe_batch_is_then_a_no_op(cfg):
    agent, sink = _agent(**cfg)
    assert agent.watch_data() is None
    agent.observe_batch(*_batch())
    agent.close()
    assert not any(e.type is EventType.DATA_STATS for e in sink.events)


def test_config_validation():
    with pytest.raises(ValueError, match="^bands: 3 does not divide num_perm 16"):
        DataWatchConfig(bands=3)
    with pytest.raises(ValueError, match="^every:"):
        DataWatchConfig(every=0)
