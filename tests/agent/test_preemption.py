"""The warning-signal watch (agent/recovery/preemption.py) and the flag slot it rides on."""

from __future__ import annotations

import os
import signal

import pytest

from cliffguard.agent.command_channel import PREEMPT_UNIT, CommandChannel
from cliffguard.agent.recovery.preemption import PreemptionConfig, PreemptionWatch, Request, report


@pytest.mark.parametrize(("signals", "why"), [(["TERM"], "not a signal name"), (["SIGNOPE"], "not a signal name"),
                                              (["SIGKILL"], "cannot be caught")])
def test_a_bad_signal_list_is_refused_naming_the_field(signals, why):
    with pytest.raises(ValueError, match=f"signals: .*{why}"):
        PreemptionConfig(signals=signals)


def test_the_deadline_and_the_exit_code_are_bounded():
    with pytest.raises(ValueError, match="deadline_s"):
        PreemptionConfig(deadline_s=0)
    with pytest.raises(ValueError, match="exit_code"):
        PreemptionConfig(exit_code=0)


def test_a_real_signal_only_notes_the_first_request_and_the_old_handler_comes_back():
    seen = []
    previous = signal.signal(signal.SIGUSR1, lambda s, f: seen.append(s))
    try:
        watch = PreemptionWatch(PreemptionConfig(signals=["SIGUSR1"]))
        assert watch.install()
        assert not watch.requested
        os.kill(os.getpid(), signal.SIGUSR1)
        first = watch.request
        assert first is not None and first.signal == "SIGUSR1"
        os.kill(os.getpid(), signal.SIGUSR1)
        assert watch.request is first  # the deadline counts from the first warning
        assert seen == []  # the handler replaced the old one while installed
        watch.uninstall()
        os.kill(os.getpid(), signal.SIGUSR1)
        assert seen == [signal.SIGUSR1]
    finally:
        signal.signal(signal.SIGUSR1, previous)


def test_close_keeps_the_handlers_of_a_warned_run_and_restores_those_of_another():
    previous = signal.getsignal(signal.SIGUSR2)
    try:
        quiet = PreemptionWatch(PreemptionConfig(signals=["SIGUSR2"]))
        quiet.install()
        quiet.close()
        assert signal.getsignal(signal.SIGUSR2) == previous
        warned = PreemptionWatch(PreemptionConfig(signals=["SIGUSR2"]))
        warned.install()
        os.kill(os.getpid(), signal.SIGUSR2)
        warned.close()  # exiting to be requeued: a second warning must not kill it mid-exit
        assert signal.getsignal(signal.SIGUSR2) == warned._on_signal
    finally:
        signal.signal(signal.SIGUSR2, previous)


def test_a_disabled_watch_installs_nothing():
    before = signal.getsignal(signal.SIGTERM)
    assert not PreemptionWatch(PreemptionConfig(enabled=False)).install()
    assert signal.getsignal(signal.SIGTERM) == before


def test_the_report_measures_the_save_against_the_deadline():
    cfg = PreemptionConfig(deadline_s=10.0)
    req = Request("SIGTERM", 100.0)
    ok = report(req, cfg, boundary_at=100.5, saved={"verified": True, "path": "/c", "detail": "d"}, saved_at=103.0)
    assert ok["save_s"] == pytest.approx(3.0) and ok["margin_s"] == pytest.approx(7.0)
    assert ok["wait_s"] == pytest.approx(0.5) and ok["verified"] and ok["exit_code"] == 75
    late = report(req, cfg, boundary_at=100.5, saved={"verified": True}, saved_at=112.0)
    assert not late["verified"] and late["margin_s"] == pytest.approx(-2.0)
    lost = report(req, cfg, boundary_at=100.5, saved=None, saved_at=110.0)
    assert not lost["verified"] and "no verified checkpoint" in lost["detail"]


class _Ranks:
    rank, world, distributed = 1, 2, False


def test_the_flag_slot_carries_commands_and_a_warning_apart():
    channel = CommandChannel(_Ranks(), emitter=None, detail=None, clock=None, step=lambda: 0)  # type: ignore[arg-type]
    assert channel.flag() == 0.0
    channel.preempt_pending = lambda: True
    assert channel.flag() == PREEMPT_UNIT  # a rank other than 0 adds only its warning
    channel.saw_flag(3.0)  # three commands, no warning
    assert channel._flag_seen and not channel.preempt_seen
    channel.saw_flag(2 * PREEMPT_UNIT)  # two ranks warned, no command
    assert not channel._flag_seen and channel.preempt_seen
    channel.saw_flag(PREEMPT_UNIT + 1)
    assert channel._flag_seen and channel.preempt_seen


_SLEEPER = """
import sys, time
from cliffguard.agent.recovery.preemption import PreemptionConfig, PreemptionWatch
stalled = sys.argv[1] == "stalled"
watch = PreemptionWatch(PreemptionConfig(signals=["SIGTERM"]), stalled=lambda: stalled)
assert watch.install()
print("ready", flush=True)
time.sleep(30)  # a rank asleep outside any collective (bench.hangs' sleep): no boundary comes
print("woke", watch.requested, flush=True)
"""


@pytest.mark.parametrize("state", ["stalled", "training"])
def test_a_signal_to_a_stalled_rank_ends_it_at_once_and_one_to_a_training_rank_is_noted(state):
    """torchrun's SIGTERM to a hung group: the rank stuck outside any collective exits now (it waited
    for the SIGKILL 30 s later, and the restart with it); a training rank only notes the request."""
    import subprocess
    import sys
    import time

    proc = subprocess.Popen([sys.executable, "-c", _SLEEPER, state], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGTERM)
        if state == "stalled":
            assert proc.wait(timeout=10) == -signal.SIGTERM
        else:
            time.sleep(1.0)
            assert proc.poll() is None  # noted: the boundary saves (none comes here)
    finally:
        proc.kill()
        proc.wait(10)
