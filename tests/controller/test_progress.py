"""controller/progress.py: a partition that reads nothing while its log grows is found once per interval."""

from __future__ import annotations

from cliffguard.controller.progress import ProgressWatch

TP = ("m", 0)


def test_a_partition_standing_still_behind_its_log_end_is_stuck_once_per_interval():
    w = ProgressWatch(30.0)
    w.moved(TP, 100, now=0.0)
    assert w.due([TP], now=29.0) == []
    assert w.due([TP], now=30.0) == [TP]
    st = w.judge(TP, 100, 185, now=30.0)
    assert st is not None and (st.position, st.end, st.still_s) == (100, 185, 30.0)
    assert w.due([TP], now=39.0) == []  # the clock starts again after a look: the seek gets a third of it
    assert w.due([TP], now=40.0) == [TP]
    assert w.judge(TP, 100, 150, now=40.0).times == 2
    w.moved(TP, 150, now=41.0)  # it read: the full interval again
    assert w.due([TP], now=70.0) == [] and w.due([TP], now=71.0) == [TP]


def test_a_partition_at_its_log_end_or_one_that_moved_is_not_stuck():
    w = ProgressWatch(30.0)
    w.moved(TP, 100, now=0.0)
    assert w.judge(TP, 100, 100, now=31.0) is None  # idle: nothing new in the log
    assert w.judge(TP, 100, 90, now=62.0) is None  # a broker that reports a low end offset
    w.moved(TP, 150, now=70.0)
    assert w.due([TP], now=99.0) == []
    assert w.judge(TP, 160, 200, now=101.0) is None  # it moved since the batch we saw


def test_off_and_forgotten_partitions():
    assert ProgressWatch(0.0).due([TP], now=1e9) == []
    w = ProgressWatch(10.0)
    w.due([TP], now=0.0)  # first seen: its clock starts
    assert w.due([TP], now=10.0) == [TP] and w.judge(TP, 0, 5, now=10.0) is not None
    w.forget([TP])
    assert w.due([TP], now=11.0) == []


def test_a_partition_the_controller_held_itself_is_not_stuck_right_after_the_hold():
    """The soak: a store lock of 25 s held the batch (partitions paused); the first empty poll after
    it was taken for a 46 s stall."""
    w = ProgressWatch(15.0)
    w.moved(TP, 100, now=0.0)
    for t in (5.0, 10.0, 20.0, 25.0):  # held: the service restarts the clock while it holds
        w.wait([TP], now=t)
    assert w.due([TP], now=26.0) == []
    assert w.due([TP], now=40.0) == [TP] and w.judge(TP, 100, 150, now=40.0).still_s == 15.0


def test_a_partition_stuck_again_after_a_seek_counts_its_looks_until_it_reads():
    """The seek of the first look did not help (kafka-python's group state wedged): the second look
    says so (``times`` 2), and the service builds a fresh consumer; reading anything resets it."""
    w = ProgressWatch(10.0)
    w.moved(TP, 100, now=0.0)
    assert w.judge(TP, 100, 150, now=10.0).times == 1
    assert w.judge(TP, 40, 150, now=20.0) is None  # the seek moved it back: it gets its interval
    assert w.judge(TP, 40, 150, now=30.0).times == 2
    w.moved(TP, 60, now=31.0)  # it read
    assert w.judge(TP, 60, 150, now=41.0).times == 1
    assert w.judge(TP, 150, 150, now=51.0) is None  # caught up
    assert w.judge(TP, 150, 160, now=61.0).times == 1


def test_a_partition_whose_client_cannot_say_its_position_is_judged_where_it_last_was():
    w = ProgressWatch(10.0)
    w.moved(TP, 100, now=0.0)
    st = w.judge(TP, None, 150, now=10.0)
    assert st is not None and st.position == 100
    assert ProgressWatch(10.0).judge(TP, None, 150, now=10.0) is None  # never seen: nothing to say
