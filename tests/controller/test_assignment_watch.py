"""controller/assignment_watch.py: no partitions held is a standby while the group's stored offsets
move, and otherwise a rejoin, with the wait doubling each time one did not help."""

from __future__ import annotations

from cliffguard.controller.assignment_watch import Unassigned, UnassignedWatch


def test_holding_partitions_never_asks_for_a_look_and_off_means_off():
    w = UnassignedWatch(after_s=60)
    assert not any(w.due(1, t) for t in range(0, 1000, 10))
    off = UnassignedWatch(after_s=0)
    assert not any(off.due(0, t) for t in range(0, 1000, 10))


def test_a_look_is_due_after_the_wait_counted_from_when_the_assignment_emptied():
    w = UnassignedWatch(after_s=60)
    assert not w.due(2, 0)
    assert not w.due(0, 100)  # emptied at 100 (a rebalance, a revoke)
    assert not w.due(0, 159)
    assert w.due(0, 160) and w.unassigned_s(160) == 60


def test_a_peer_storing_offsets_lately_is_a_standby_said_once():
    w = UnassignedWatch(after_s=60)
    w.due(0, 1_000)
    assert w.due(0, 1_060)
    assert w.judge(newest_stored_at=1_030.0, now=1_060) is Unassigned.STANDBY
    assert w.first_standby() and not w.first_standby()
    assert not w.due(0, 1_119) and w.due(0, 1_120)  # looked at again after the same wait
    assert w.rejoins == 0


def test_offsets_this_instance_stored_before_it_lost_its_partitions_are_not_a_peers():
    w = UnassignedWatch(after_s=60)
    w.due(1, 990)
    w.due(0, 1_000)  # emptied at 1000; the group's newest offset is its own, from 999
    assert w.due(0, 1_060) and w.judge(newest_stored_at=999.0, now=1_060) is Unassigned.REJOIN


def test_no_peer_progress_rejoins_and_the_wait_doubles_up_to_the_cap():
    w = UnassignedWatch(after_s=60, max_backoff_s=300)
    w.due(0, 0)
    looks, now = [], 60.0
    for _ in range(5):
        assert w.due(0, now)
        assert w.judge(newest_stored_at=None, now=now) is Unassigned.REJOIN
        looks.append(now)
        while not w.due(0, now):
            now += 1
    assert [b - a for a, b in zip(looks, looks[1:], strict=False)] == [120, 240, 300, 300]
    assert w.rejoins == 5


def test_stale_peer_offsets_do_not_make_a_standby_and_holding_partitions_again_resets():
    w = UnassignedWatch(after_s=60)
    w.due(0, 900)
    assert w.due(0, 1_061) and w.judge(newest_stored_at=1_000.0, now=1_061) is Unassigned.REJOIN  # 61 s old
    assert w.due(1, 1_070) is False and w.rejoins == 0  # partitions held: the count starts over
    w.due(0, 1_080)
    assert not w.due(0, 1_139) and w.due(0, 1_140)


def test_offsets_it_stored_itself_after_its_partitions_went_are_not_a_peers_either():
    w = UnassignedWatch(after_s=60)
    w.due(0, 1_000)
    w.stored(1_001.0)  # a batch polled before the assignment emptied, committed just after
    assert w.due(0, 1_060) and w.judge(newest_stored_at=1_001.0, now=1_060) is Unassigned.REJOIN
    w2 = UnassignedWatch(after_s=60)
    w2.due(0, 1_000)
    w2.stored(1_001.0)
    assert w2.due(0, 1_060) and w2.judge(newest_stored_at=1_002.0, now=1_060) is Unassigned.STANDBY
