"""Node heartbeats: each rank's file, the leader's arrays, a silent rank's growing age."""

from __future__ import annotations

import pytest

from cliffguard.agent.node_beats import NodeBeats, NodeLayout


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_layout_from_torchrun_env_and_without_it():
    lay = NodeLayout.from_env(5, 8, {"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"})
    assert not lay.leader and list(lay.ranks) == [4, 5, 6, 7]
    assert list(NodeLayout.from_env(5, 8, {}).ranks) == [5]
    assert list(NodeLayout.from_env(5, 6, {"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"}).ranks) == [5]  # inconsistent


def test_the_leader_reports_steps_ages_and_collectives(tmp_path):
    clock = Clock()
    beats = {r: NodeBeats(tmp_path / "b", NodeLayout(r, r, 3), clock=clock) for r in range(3)}
    beats[0].write(7, "")
    beats[1].write(7, "all_reduce")
    clock.now += 40  # rank 2 never wrote; rank 1 froze 40 s ago
    beats[0].write(9, "")
    got = beats[0].read()
    assert got["ranks"] == [0, 1, 2] and got["steps"] == [9, 7, 0]
    assert got["ages_s"] == [0.0, pytest.approx(40.0), pytest.approx(40.0)]
    assert got["collectives"] == ["", "all_reduce", ""]


def test_a_previous_lifes_file_and_garbage_are_not_signs_of_life(tmp_path):
    clock = Clock()
    old = NodeBeats(tmp_path / "b", NodeLayout(1, 1, 2), clock=clock)
    old.write(50, "")
    clock.now += 100
    leader = NodeBeats(tmp_path / "b", NodeLayout(0, 0, 2), clock=clock)
    (tmp_path / "b" / "r0.json").write_text("{not json")
    clock.now += 5
    got = leader.read()
    assert got["steps"] == [0, 0] and got["ages_s"] == [5.0, 5.0]


def test_a_directory_owned_through_a_link_is_refused(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(ValueError, match="symlink"):
        NodeBeats(tmp_path / "link", NodeLayout(0, 0, 1))
