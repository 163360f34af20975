"""controller/poll_watch.py: a poll that runs past its timeout is said once and its network thread woken."""

from __future__ import annotations

import logging

from cliffguard.controller.poll_watch import PollWatch


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_an_overdue_poll_is_said_once_and_woken_every_look_until_it_returns(caplog):
    clock, woken = Clock(), []
    w = PollWatch(lambda: woken.append(clock.t) or True, after_s=5.0, clock=clock)
    assert w.check() is False  # no poll under way
    w.entered(1.0)
    clock.t += 5.9
    assert w.check() is False and woken == []  # within its timeout and the grace
    with caplog.at_level(logging.WARNING, logger="cliffguard.controller.edge"):
        clock.t += 0.2
        assert w.check() is True
        clock.t += 1.0
        assert w.check() is True
        w.left()
    said = [r.getMessage() for r in caplog.records]
    assert [round(t, 1) for t in woken] == [106.1, 107.1] and w.wakes == 2
    assert len([m for m in said if "has not come back" in m]) == 1
    assert any("came back after 7 s" in m for m in said)
    assert w.check() is False  # returned: nothing more to do


def test_a_poll_back_in_time_is_never_woken_and_a_watch_with_nothing_to_wake_counts_none():
    clock = Clock()
    w = PollWatch(lambda: False, after_s=5.0, clock=clock)
    w.entered(1.0)
    clock.t += 2.0
    w.left()
    clock.t += 60
    assert w.check() is False
    w.entered(1.0)
    clock.t += 10
    assert w.check() is False and w.wakes == 0


def test_the_watch_thread_starts_and_stops():
    w = PollWatch(lambda: True, every_s=0.01).start()
    w.close()
    assert not w._thread.is_alive()
