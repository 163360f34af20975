"""Elastic rescaling: the batch policy, the LR rule and its ramp, the scale events, the flapping
back-off, the sampler's coverage across scale changes, and a trainer resuming at another world."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

from cliffguard.core.enums import EventType
from cliffguard.trainer.data import DataConfig, Sampler, load_corpus
from cliffguard.trainer.elastic import Elastic, ElasticConfig, plan_batch
from testing.trainer import make_trainer, small_config


@pytest.mark.parametrize("policy, world, batch, accum, micro", [
    ("proportional", 2, 8, 1, 4), ("proportional", 3, 12, 1, 4), ("halve", 2, 8, 1, 4), ("halve", 1, 8, 1, 8),
    ("keep", 2, 16, 2, 4), ("proportional", 4, 16, 1, 4)])
def test_batch_policies(policy, world, batch, accum, micro):
    plan = plan_batch(ElasticConfig(batch_policy=policy), 4, 16, 1, world)
    assert (plan.global_batch, plan.grad_accum, plan.micro_batch) == (batch, accum, micro)
    assert plan.lr_factor == pytest.approx(math.sqrt(batch / 16))


def test_a_batch_that_does_not_split_is_an_error_naming_it_never_a_silent_other_batch():
    with pytest.raises(ValueError, match=r"^global_batch: 16 does not split into 3 ranks x micro-batches of 4 "
                                         r"\(batch_policy keep\)"):
        plan_batch(ElasticConfig(batch_policy="keep"), 4, 16, 1, 3)
    with pytest.raises(ValueError, match=r"^global_batch: 10 x 3/4 ranks is not a whole batch"):
        plan_batch(ElasticConfig(), 4, 10, 1, 3)


@pytest.mark.parametrize("kw, field", [({"batch_policy": "double"}, "batch_policy"), ({"lr_rule": "cube"}, "lr_rule"),
                                       ({"rdzv_timeout_s": 0}, "rdzv_timeout_s"), ({"base_world": -1}, "base_world"),
                                       ({"final_eval_batches": -1}, "final_eval_batches"),
                                       ({"loss_window": 0}, "loss_window")])
def test_config_validation(kw, field):
    with pytest.raises(ValueError, match=f"^{field}:"):
        ElasticConfig(**kw)


def test_scale_down_then_up_events_lr_ramp_lost_progress_and_flap_backoff(tmp_path):
    cfg = ElasticConfig(enabled=True, rescale_warmup_steps=10, max_changes=2, flap_backoff_s=5.0)
    mark = tmp_path / "progress.json"
    full = Elastic(cfg, 16, 1, 4, progress_path=mark)
    full.mark_progress(57, now=1000.0)
    saved = full.state_dict()
    down = Elastic(cfg, 16, 1, 2, progress_path=mark)
    ev = down.on_restore(saved, 50, now=1012.5)
    assert ev is not None and not ev.scaled_up
    assert (ev.from_world, ev.to_world, ev.from_global_batch, ev.global_batch) == (4, 2, 16, 8)
    assert (ev.steps_lost, ev.seconds_lost, ev.backoff_s) == (7, 12.5, 0.0)
    assert down.lr_factor(50) == down.lr_factor(51) == pytest.approx(math.sqrt(0.5))  # a lower LR: at once
    up = Elastic(cfg, 16, 1, 4, progress_path=mark)
    ev = up.on_restore(down.state_dict(), 80, now=1100.0)
    assert ev.scaled_up and (ev.global_batch, ev.lr_factor) == (16, 1.0) and up.plan.global_batch == 16
    assert up.lr_factor(80) == pytest.approx(math.sqrt(0.5)) and up.lr_factor(90) == 1.0
    assert up.lr_factor(85) == pytest.approx((1 + math.sqrt(0.5)) / 2)  # a higher LR: warmed up, not a jump
    mid = Elastic(cfg, 16, 1, 2)
    mid.on_restore(up.state_dict(), 85, now=1120.0)  # down again in the middle of that warm-up: at once
    assert mid.lr_factor(85) == pytest.approx(math.sqrt(0.5))
    again = Elastic(cfg, 16, 1, 2, progress_path=mark)  # a third change within the window: the node flaps
    assert again.on_restore(up.state_dict(), 90, now=1150.0).backoff_s == 5.0
    assert Elastic(cfg, 16, 1, 4).on_restore(up.state_dict(), 80) is None  # the same world: no event


def test_a_world_change_without_elastic_is_a_clear_error():
    saved = Elastic(ElasticConfig(), 16, 1, 4).state_dict()
    with pytest.raises(ValueError, match=r"^world: checkpoint step 5 was saved at world 4, this start has 2 ranks"):
        Elastic(ElasticConfig(), 16, 1, 2).on_restore(saved, 5)


def test_sampler_covers_every_sample_once_per_epoch_across_scale_changes():
    corpus = load_corpus(DataConfig(seq_len=16, max_bytes=40_000, block_bytes=1024, apply_rules=False))
    cfg = DataConfig(seq_len=16, max_bytes=40_000, block_bytes=1024, apply_rules=False)
    n = corpus.n_train_samples
    seen: list[int] = []
    plan = [(4, 16, range(0, 7)), (2, 8, range(7, 20)), (3, 12, range(20, 26)), (4, 16, range(26, 200))]
    state = None
    for world, batch, steps in plan:
        ranks = [Sampler(corpus, cfg, batch, r, world) for r in range(world)]
        for s in ranks:
            if state is not None:
                s.load_state_dict(state)
                if s.global_batch != batch:
                    s.rebatch(steps[0], batch, world, s.rank)
        for step in steps:
            for s in ranks:
                seen.extend(s.sample_ids(step))
            assert ranks[0].step_range(step)[1] - ranks[0].step_range(step)[0] == batch
            if len(seen) >= n:
                break
        state = json.loads(json.dumps(ranks[0].state_dict()))  # through a checkpoint's JSON-ish round trip
        if len(seen) >= n:
            break
    epoch = seen[:n]
    assert sorted(epoch) == list(range(n))  # no sample twice, none skipped


def test_a_trainer_resumes_a_world_2_checkpoint_at_world_1_with_half_the_batch(tmp_path):
    cfg = small_config(tmp_path, steps=6, global_batch=4, grad_accum=1, resume=True,
                       elastic=ElasticConfig(enabled=True, base_world=2, rescale_warmup_steps=2))
    tr, sink, _ = make_trainer(cfg)
    assert tr.elastic.plan.global_batch == 2 and tr.micro_batch == 2  # base world 2: proportional half
    state = tr.capture_state()
    state["elastic"] = {**state["elastic"], "world": 2, "global_batch": 4}  # as a world-2 run saved it
    state["sampler"] = {**state["sampler"], "global_batch": 4, "segments": [[0, 0, 4]]}
    state["step"] = 3
    tr.ckpt.save(3, state, "full")
    tr.ckpt.close()
    tr.agent.close(None)
    tr, sink, _ = make_trainer(cfg)
    assert tr.run() == 0
    scaled = [e for e in sink.events if e.type is EventType.ELASTIC_SCALED_DOWN]
    assert len(scaled) == 1 and scaled[0].step == 3
    d = scaled[0].data
    assert (d["from_world"], d["to_world"], d["from_global_batch"], d["global_batch"]) == (2, 1, 4, 2)
    assert d["lr_factor"] == pytest.approx(math.sqrt(0.5))
    assert tr.sampler.segments == [(0, 0, 4), (3, 12, 2)] and tr.sampler.step_range(3) == (12, 14)
    steps = [e for e in sink.events if e.type is EventType.STEP]
    assert [e.step for e in steps] == [3, 4, 5]
    assert steps[-1].data["sample_range"] == [16, 18]
    assert dataclasses.asdict(tr.elastic.plan)["world"] == 1 and torch.get_num_threads() >= 1
    # The completed run's mark: the held-out loss and the mean of its last steps' losses (this start's).
    mark = json.loads(tr._progress_mark_path(cfg).read_text())
    assert mark["step"] == 6 and mark["val_loss"] == pytest.approx(tr.val_loss(cfg.elastic.final_eval_batches)[0])
    assert mark["loss_mean_steps"] == 3 and mark["loss_mean"] == pytest.approx(
        sum(e.data["loss"] for e in steps) / 3)


def test_the_progress_mark_averages_the_last_loss_window_steps(tmp_path):
    el = Elastic(ElasticConfig(enabled=True, loss_window=3), 8, 1, 2, progress_path=tmp_path / "mark.json")
    for step, loss in enumerate([9.0, 1.0, 2.0, float("nan"), 3.0], start=1):
        el.mark_progress(step, loss, now=10.0 * step)
    el.mark_progress(5, 3.0, now=51.0, force=True, val_loss=2.5)  # the final mark repeats the last step's loss
    mark = json.loads((tmp_path / "mark.json").read_text())
    assert (mark["loss_mean"], mark["loss_mean_steps"], mark["val_loss"], mark["loss"]) == (2.0, 3, 2.5, 3.0)
