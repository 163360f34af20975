"""The SDC watch's pure parts: the parameter hash sees one flipped bit, the comparison names the
odd rank out only when a majority agrees, and the record keeps the last step they agreed."""

from __future__ import annotations

import logging

import pytest
import torch

from cliffguard.agent.param_check import HASH_BITS, ParamCheck, compare, param_hash


def _flip(t: torch.Tensor, index: int, bit: int) -> None:
    flat = t.view(-1).view(torch.int32) if t.dtype == torch.float32 else t.view(-1).view(torch.int16)
    flat[index] ^= (1 << bit) if bit < 31 else -(1 << 31)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bit", [0, 7, 15])
def test_one_flipped_bit_anywhere_changes_the_hash(dtype, bit):
    torch.manual_seed(0)
    params = [torch.randn(64, 32).to(dtype), torch.randn(32).to(dtype), torch.randn(7, 3).to(dtype)]
    before = int(param_hash(params))
    assert 0 <= before < 1 << HASH_BITS
    for which, idx in ((0, 0), (1, 31), (2, 20)):
        copy = [p.clone() for p in params]
        _flip(copy[which], idx, bit)
        assert int(param_hash(copy)) != before, (which, idx)
    assert int(param_hash([p.clone() for p in params])) == before  # bit-identical copies agree


def test_swapped_tensors_hash_differently_and_a_sign_bit_counts():
    a, b = torch.full((4,), 1.5), torch.full((4,), -2.0)
    assert int(param_hash([a, b])) != int(param_hash([b, a]))
    c = a.clone()
    _flip(c, 2, 31)  # the sign bit: 1.5 -> -1.5
    assert int(param_hash([c, b])) != int(param_hash([a, b]))


def test_compare_names_the_odd_rank_out_only_with_a_majority():
    assert compare([5.0, 5.0, 5.0, 5.0]).agree
    r = compare([5.0, 5.0, 9.0, 5.0])
    assert (r.agree, r.suspects, r.named, r.groups) == (False, (2,), True, ((0, 1, 3), (2,)))
    two = compare([5.0, 9.0])
    assert (two.agree, two.suspects, two.named) == (False, (0, 1), False)  # two replicas cannot say which
    split = compare([1.0, 1.0, 2.0, 2.0])
    assert (split.suspects, split.named) == ((0, 1, 2, 3), False)
    three_ways = compare([1.0, 1.0, 1.0, 2.0, 3.0])
    assert (three_ways.suspects, three_ways.named) == ((3, 4), True)


def test_ranks_that_never_agreed_are_told_they_may_not_be_replicas(caplog):
    with caplog.at_level(logging.ERROR, logger="cliffguard.agent.param_check"):
        field = ParamCheck().judge(0, [1.0, 2.0, 3.0], rank=0)
    assert "last_agreed" not in field and 'param_check = "off"' in caplog.text


def test_the_record_keeps_the_last_agreed_step_through_a_rollback_and_a_restart(caplog):
    pc = ParamCheck()
    assert pc.judge(100, [3.0, 3.0, 3.0], rank=0) == {"agree": True}
    assert pc.judge(200, [3.0, 3.0, 3.0], rank=1) == {"agree": True}
    with caplog.at_level(logging.ERROR, logger="cliffguard.agent.param_check"):
        field = pc.judge(300, [3.0, 4.0, 3.0], rank=0)
    assert field == {"agree": False, "suspects": [1], "named": True, "groups": [[0, 2], [1]], "last_agreed": 200,
                     "mismatches": 1}
    assert "step 300" in caplog.text and "rank(s) [1]" in caplog.text and "step 200" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="cliffguard.agent.param_check"):
        pc.judge(400, [3.0, 4.0, 3.0], rank=2)  # a rank that agrees with the majority says nothing
    assert not caplog.text
    pc.rewound(150)  # rolled back to 150: the state there was agreed (the replicas agreed later, at 200)
    assert pc.last_agreed == 150
    restored = ParamCheck()
    restored.load_state_dict(pc.state_dict())
    assert (restored.last_agreed, restored.mismatches) == (150, 2)


@pytest.mark.parametrize(("mode", "replicated", "world", "step", "every", "due"), [
    ("auto", True, 2, 100, 100, True), ("auto", False, 2, 100, 100, False), ("on", False, 2, 100, 100, True),
    ("off", True, 2, 100, 100, False), ("auto", True, 1, 100, 100, False), ("auto", True, 4, 150, 100, False),
    ("auto", True, 4, 150, 50, True), ("auto", True, 4, 0, 100, True), ("auto", True, 4, 100, 0, False)])
def test_a_check_is_due_on_multiples_of_every_for_replicated_models(mode, replicated, world, step, every, due):
    assert ParamCheck.due(step, every=every, mode=mode, world=world, replicated=replicated) is due
