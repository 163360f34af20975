"""core/triage.py: the declared classes from re-run measurements."""

from __future__ import annotations

import math

import pytest

from cliffguard.core.triage import (
    REMEDY,
    Baseline,
    Measure,
    TriageClass,
    TriageConfig,
    carriers,
    classify,
    is_bad,
    lone_carrier,
)

BASE = Baseline(median=2.0, sigma=0.05)  # bad past 2.3 (k=6); a rank of 4 past its peers by 0.6


def m(*loss: float, norms: tuple[float, ...] = ()) -> Measure:
    return Measure(tuple(loss), tuple(norms))


def test_normal_again_on_the_same_ranks_is_transient() -> None:
    v = classify(m(2.0, 2.05, 1.98, 2.02), BASE)
    assert v.cls is TriageClass.TRANSIENT and v.remedy == "retry_step"


def test_bad_shard_that_follows_the_batch_is_data() -> None:
    same = m(2.0, 2.0, 9.0, 2.0)  # rank 2's shard is poisoned
    swapped = m(2.0, 2.0, 2.0, 9.0)  # ...and is bad on rank 3, which ran it
    v = classify(same, BASE, swapped=swapped)
    assert (v.cls, v.rank, v.remedy) == (TriageClass.DATA, 2, "skip_batch")


def test_excess_that_stays_on_the_rank_is_a_bad_rank() -> None:
    same = m(2.0, 2.0, 2.0, 2.0, norms=(1.0, 1.1, 0.9, 50.0))  # rank 3's gradients are wrong
    swapped = m(2.0, 2.0, 2.0, 2.0, norms=(1.0, 1.0, 1.1, 48.0))  # ...on rank 2's shard too
    v = classify(same, BASE, swapped=swapped)
    assert (v.cls, v.rank, v.remedy) == (TriageClass.BAD_RANK, 3, "suspect_rank")


def test_uniform_excess_with_a_bad_control_is_the_optimizer() -> None:
    v = classify(m(5.0, 5.1, 4.9, 5.0), BASE, control=m(4.8, 5.0, 5.1, 4.9))
    assert v.cls is TriageClass.OPTIMIZER and v.remedy == "rollback"


def test_uniform_excess_with_a_normal_control_is_data_on_every_shard() -> None:
    v = classify(m(5.0, 5.1, 4.9, 5.0), BASE, control=m(2.0, 2.0, 2.01, 1.99))
    assert (v.cls, v.rank) == (TriageClass.DATA, None)


def test_one_rank_past_peers_that_are_bad_too_is_no_bad_shard_the_control_decides() -> None:
    """The demo's LR blow-up (2 ranks, step 373): both shards far past the guard's scale, one more than
    the other by more than the rank margin. The worse shard follows a rotation, but the weights are
    what is bad: no rotation, the control decides (a listed healthy batch was the cost before)."""
    base = Baseline(median=2.4696, sigma=0.1330)
    same = m(6.644, 5.260)
    assert carriers(same, base, TriageConfig()) == [0] and lone_carrier(same, base, TriageConfig()) is None
    v = classify(same, base, swapped=m(5.260, 6.644), control=m(4.741, 5.907))
    assert (v.cls, v.rank) == (TriageClass.OPTIMIZER, None)
    assert classify(same, base, control=m(2.4, 2.5)).cls is TriageClass.DATA  # the whole batch, every shard
    assert lone_carrier(m(2.0, 2.0, 9.0, 2.0), BASE, TriageConfig()) == 2  # peers normal: a lone carrier


def test_one_rank_world_uses_the_control() -> None:
    assert classify(m(7.0), BASE, control=m(2.0)).cls is TriageClass.DATA
    assert classify(m(7.0), BASE, control=m(6.5)).cls is TriageClass.OPTIMIZER


def test_missing_rerun_or_disagreeing_reruns_are_unclear() -> None:
    same = m(2.0, 9.0)
    assert classify(same, BASE).cls is TriageClass.UNCLEAR
    assert classify(same, BASE, swapped=m(9.0, 9.0)).cls is TriageClass.UNCLEAR  # both carry: no answer
    assert classify(m(9.0, 9.0, 2.0, 2.0), BASE).cls is TriageClass.UNCLEAR  # two carriers
    assert classify(m(5.0, 5.0), BASE).cls is TriageClass.UNCLEAR  # uniform, no control


def test_non_finite_is_bad_and_a_carrier() -> None:
    same = m(2.0, math.nan)
    assert is_bad(same, BASE, TriageConfig()) and carriers(same, BASE, TriageConfig()) == [1]
    v = classify(same, BASE, swapped=m(math.inf, 2.0))
    assert (v.cls, v.rank) == (TriageClass.DATA, 1)


def test_the_rank_margin_scales_with_the_guard_sigma_and_the_world() -> None:
    # 0.5 above the peers: a carrier where sigma is 0.01, noise where it is 0.1
    assert carriers(m(2.0, 2.0, 2.5, 2.0), Baseline(2.0, 0.01), TriageConfig()) == [2]
    assert carriers(m(2.0, 2.0, 2.5, 2.0), Baseline(2.0, 0.1), TriageConfig()) == []


def test_every_class_has_a_remedy_and_bad_input_is_refused() -> None:
    assert set(REMEDY) == set(TriageClass)
    with pytest.raises(ValueError, match="every rank"):
        Measure(())
    with pytest.raises(ValueError, match="grad norms"):
        Measure((1.0, 2.0), (1.0,))
    with pytest.raises(ValueError, match="sigma"):
        Baseline(2.0, 0.0)
    with pytest.raises(ValueError):
        TriageConfig(grad_factor=1.0)
