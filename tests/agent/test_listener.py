"""Command listener through the real broker: starts at the end, filters by run, verifies, and
refuses each bad command with its own status while the good ones reach the loop in order."""

from __future__ import annotations

import json
import time

import pytest

from cliffguard.agent.listener import CommandListener
from cliffguard.core.enums import AckStatus
from cliffguard.core.events import encode_command, make_command
from cliffguard.core.kafka_config import KafkaConfig
from cliffguard.core.signing import CommandVerifier, Secret, sign_command

SECRET = Secret("listener-secret-0123456789")
RUN = "run-L"

pytestmark = pytest.mark.broker


def _send(kafka_cfg, items):
    from kafka import KafkaProducer

    p = KafkaProducer(**kafka_cfg.client_kwargs())
    for key, value in items:
        p.send(kafka_cfg.commands_topic, key=key.encode(), value=value)
    p.flush(10)
    p.close()


def _cmd(ctype="pause", run=RUN, args=None, ttl=60.0, now=None, secret=SECRET):
    return sign_command(make_command(ctype, run, args or {}, ttl_s=ttl, now=now), secret)


def _poll_until(listener, rejects, n_ok, n_rej, timeout=15.0):
    got = []
    end = time.monotonic() + timeout
    while time.monotonic() < end and (len(got) < n_ok or len(rejects) < n_rej):
        got += listener.poll()
        time.sleep(0.05)
    return got


def test_listener_accepts_good_commands_in_order_and_refuses_the_rest(kafka_cfg):
    stale = _cmd("stop")
    _send(kafka_cfg, [(RUN, encode_command(stale))])  # before start: must not be acted on
    rejects: list[tuple[str, str, AckStatus, str]] = []
    listener = CommandListener(kafka_cfg, RUN, CommandVerifier(RUN, SECRET),
                               lambda *a: rejects.append(a)).start()
    try:
        pause, validate = _cmd("pause"), _cmd("validate", args={"batches": 4})
        rollback = _cmd("rollback", args={"to_step": 10, "lr_scale": 0.5})
        bad_sig = _cmd("resume", secret=Secret("not-the-right-secret!"))
        other_body = _cmd("stop", run="run-OTHER")
        expired = _cmd("resume", ttl=1.0, now=time.time() - 100)
        other_run_traffic = _cmd("stop", run="run-OTHER")
        _send(kafka_cfg, [
            (RUN, encode_command(pause)),
            ("run-OTHER", encode_command(other_run_traffic)),  # another trainer's: silently skipped
            (RUN, encode_command(bad_sig)),
            (RUN, encode_command(validate)),
            (RUN, encode_command(other_body)),
            (RUN, encode_command(expired)),
            (RUN, encode_command(pause)),  # replay
            (RUN, b'{"v":1,"id":"' + b"a" * 32 + b'","type":"pause"'),  # truncated
            (RUN, b"\xff\xfe"),
            (RUN, encode_command(rollback)),
        ])
        got = _poll_until(listener, rejects, 3, 6)
        assert [c.id for c in got] == [pause.id, validate.id, rollback.id]
        assert got[2].args == {"to_step": 10, "lr_scale": 0.5}
        by_id = {r[0]: r for r in rejects}
        assert len(rejects) == 6, rejects
        assert by_id[bad_sig.id][2] is AckStatus.REJECTED and "bad_signature" in by_id[bad_sig.id][3]
        assert by_id[other_body.id][2] is AckStatus.REJECTED and "other_run" in by_id[other_body.id][3]
        assert by_id[expired.id][2] is AckStatus.EXPIRED
        assert by_id[pause.id][2] is AckStatus.DUPLICATE and by_id[pause.id][1] == "pause"
        assert "a" * 32 not in by_id  # truncated JSON: the id cannot be read either
        undecodable = [r for r in rejects if r[0] == ""]
        assert len(undecodable) == 2
        assert all(r[2] is AckStatus.REJECTED and r[3].startswith("undecodable: $:") for r in undecodable)
        assert stale.id not in {c.id for c in got} | set(by_id)
        assert other_run_traffic.id not in by_id
        assert listener.poll() == []  # non-blocking and nothing left
    finally:
        listener.close()


def test_schema_invalid_command_is_refused_with_its_id(kafka_cfg):
    rejects = []
    listener = CommandListener(kafka_cfg, RUN, CommandVerifier(RUN, SECRET), lambda *a: rejects.append(a)).start()
    try:
        bad = _cmd("rollback", args={"to_step": 1, "lr_scale": 0.5}).to_dict()
        bad["args"] = {"to_step": "soon", "lr_scale": 0.5}
        _send(kafka_cfg, [(RUN, json.dumps(bad).encode())])
        _poll_until(listener, rejects, 0, 1)
        assert rejects == [(bad["id"], "rollback", AckStatus.REJECTED, rejects[0][3])]
        assert "args.to_step" in rejects[0][3]
    finally:
        listener.close()


def test_a_failing_reject_callback_does_not_stop_the_others(kafka_cfg):
    def boom(*_):
        raise RuntimeError("ack path broken")

    listener = CommandListener(kafka_cfg, RUN, CommandVerifier(RUN, SECRET), boom).start()
    try:
        good = _cmd("pause")
        _send(kafka_cfg, [(RUN, b"garbage"), (RUN, encode_command(good))])
        got = _poll_until(listener, [], 1, 0)
        assert [c.id for c in got] == [good.id]
        assert listener.errors == 1
    finally:
        listener.close()


@pytest.mark.slow
def test_listener_survives_a_broker_restart_that_loses_the_topic(tmp_path):
    """Tansu restarts empty: the listener must still get commands sent after the restart."""
    from cliffguard.controller.broker import EmbeddedBroker, ensure_topics, free_port

    try:
        broker = EmbeddedBroker(port=free_port()).start()
    except Exception as exc:  # noqa: BLE001
        from testing.services import missing as _missing

        _missing(f"embedded broker ({exc})")
    try:
        cfg = broker.kafka_config(topic_prefix="lr", partitions=2)
        ensure_topics(cfg)
        listener = CommandListener(cfg, RUN, CommandVerifier(RUN, SECRET), lambda *a: None).start()
        try:
            first = _cmd("pause")
            _send(cfg, [(RUN, encode_command(first))])
            assert [c.id for c in _poll_until(listener, [], 1, 0)] == [first.id]
            broker.restart(down_s=2.0)
            ensure_topics(cfg)  # the controller side recreates its topics on start
            after = _cmd("resume")
            _send(cfg, [(RUN, encode_command(after))])
            assert [c.id for c in _poll_until(listener, [], 1, 0, timeout=30)] == [after.id]
            assert listener.recreations == 1
        finally:
            listener.close()
    finally:
        broker.stop()


def test_a_junk_flood_keeps_the_inbox_bounded_and_the_log_short(caplog):
    rejects = []
    listener = CommandListener(KafkaConfig(), RUN, CommandVerifier(RUN, SECRET), lambda *a: rejects.append(a),
                               inbox_max=256, log_first=20, consumer_factory=lambda: None)
    caplog.set_level("WARNING", logger="cliffguard.agent.listener")
    for i in range(5000):  # what the consumer thread hands over, as fast as the broker delivers
        listener._enqueue(b"junk %d" % i, f"cmds[0]@{i}")
        if i % 1000 == 999:
            assert listener.poll() == []
    good = _cmd()
    listener._enqueue(encode_command(good), "cmds[0]@5000")
    assert [c.id for c in listener.poll()] == [good.id]
    listener.close()
    assert listener.received == 5001 and listener.dropped == 5000 - 5 * 256
    assert len(rejects) == 5 * 256  # every refused record that was kept is still acked
    assert len(caplog.records) <= 30, len(caplog.records)
    assert any("more in the last" in r.getMessage() for r in caplog.records)


def test_a_genuine_command_behind_a_full_inbox_of_junk_is_still_applied():
    """Refusals and authentic commands queue apart: a flood that fills the inbox before the next
    step boundary cannot push out the pause that arrives after it."""
    rejects = []
    listener = CommandListener(KafkaConfig(), RUN, CommandVerifier(RUN, SECRET), lambda *a: rejects.append(a),
                               inbox_max=16, consumer_factory=lambda: None)
    forged = _cmd(secret=Secret("not-the-controller-key-0123456789"))
    for i in range(100):
        listener._enqueue(b"junk %d" % i if i % 2 else encode_command(forged), f"cmds[0]@{i}")
    good = _cmd()
    listener._enqueue(encode_command(good), "cmds[0]@100")
    assert [c.id for c in listener.poll()] == [good.id]
    assert listener.dropped == 100 - 16 and len(rejects) == 16
    listener.close()
