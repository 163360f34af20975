"""Which ranks witness each other (agent/replica_groups.py) and the comparison within those
groups (agent/param_check.py ``compare_groups``): pure, no processes."""

from __future__ import annotations

import pytest
import torch

from cliffguard.agent.param_check import compare_groups
from cliffguard.agent.replica_groups import _mesh_groups, layout_of, local_tensor, zero_layout


def test_plain_tensors_are_one_group_only_when_known_replicated() -> None:
    ps = [torch.zeros(3), torch.ones(2)]
    assert layout_of(ps, 4, replicated=True).groups == ((0, 1, 2, 3),)
    none = layout_of(ps, 4, replicated=False)
    assert not none.has_witnesses and not none.sharded and "not known to hold one model" in none.why_none


def test_a_mesh_groups_ranks_by_their_coordinates_along_the_sharded_dimensions() -> None:
    mesh = torch.arange(6).reshape(3, 2)  # replicate x shard
    keys = _mesh_groups(mesh, (False, True))
    assert [r for r in range(6) if keys[r] == keys[1]] == [1, 3, 5]
    assert [r for r in range(6) if keys[r] == keys[0]] == [0, 2, 4]
    every_own = _mesh_groups(torch.arange(4).reshape(4), (True,))
    assert len(set(every_own.values())) == 4  # plain FSDP: no two ranks share a shard
    all_replicas = _mesh_groups(torch.arange(4).reshape(4), (False,))
    assert len(set(all_replicas.values())) == 1


@pytest.mark.parametrize(("stage", "witnesses"), [(0, True), (1, True), (2, True), (3, False)])
def test_zero_stages_three_partitions_the_parameters_themselves(stage, witnesses) -> None:
    layout = zero_layout(stage, 4)
    assert layout.has_witnesses is witnesses
    assert ("ZeRO-3" in layout.why_none) is (not witnesses)


def test_a_view_of_a_parameter_is_hashed_through_its_param() -> None:
    class View:
        def __init__(self, p: torch.Tensor) -> None:
            self.param = p

    p = torch.ones(2)
    assert local_tensor(View(p)) is p and local_tensor(p) is p


def test_groups_are_compared_within_themselves_and_a_mismatch_named_only_with_a_majority() -> None:
    groups = ((0, 2, 4), (1, 3, 5))
    ok = compare_groups([7, 9, 7, 9, 7, 9], groups)  # different shards differ; that is not a mismatch
    assert ok.agree and ok.suspects == ()
    bad = compare_groups([7, 9, 7, 8, 7, 9], groups)
    assert not bad.agree and bad.suspects == (3,) and bad.named
    assert sorted(map(sorted, bad.groups)) == [[0, 2, 4], [1, 5], [3]]
    pair = compare_groups([7, 9, 7, 8], ((0, 2), (1, 3)))  # two witnesses: the mismatch, not the culprit
    assert not pair.agree and not pair.named and pair.suspects == (1, 3)
    assert compare_groups([1, 1, 2], None).suspects == (2,)  # None: every rank witnesses every other (DDP)
