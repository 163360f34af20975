"""Which rank speaks for the run: the lowest heard from, incrementally or over a set."""

from __future__ import annotations

from cliffguard.core.ranks import RUN_RANK, speaker, takes_over


def test_the_lowest_rank_heard_speaks():
    assert speaker([]) is None
    assert speaker([3, 1, 2]) == 1
    assert speaker({2: "x", RUN_RANK: "y"}) == RUN_RANK


def test_takes_over_is_speaker_seen_one_rank_at_a_time():
    current = None
    heard: list[int] = []
    for rank in [2, 3, 1, 2, 0, 1]:
        heard.append(rank)
        if takes_over(rank, current):
            current = rank
        assert current == speaker(heard)
    assert not takes_over(1, 1) and not takes_over(2, 1) and takes_over(0, 1) and takes_over(5, None)
