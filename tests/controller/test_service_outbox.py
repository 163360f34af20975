"""The command outbox publisher: order, retries with backoff, expiry (fake producer, real SQLite)."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import select

from cliffguard.controller.operator import enqueue_command
from cliffguard.controller.outbox import CommandOutbox
from cliffguard.controller.store.db import session_scope
from cliffguard.controller.store.models import CommandRow, OutboxRow, RunRow
from cliffguard.core.kafka_config import KafkaConfig
from testing.controller_service import SECRET, store_engine


class Future:
    def __init__(self, ok: bool) -> None:
        self.is_done = True
        self._ok = ok
        self.exception = None if ok else RuntimeError("broker said no")

    def succeeded(self) -> bool:
        return self._ok


class FakeProducer:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, bytes]] = []
        self.fail = False

    def send(self, topic, key, value):
        if self.fail:
            return Future(False)
        self.sent.append((topic, key, value))
        return Future(True)

    def flush(self, timeout=None):
        pass

    def close(self, timeout=None):
        pass


@pytest.fixture
def engine(tmp_path):
    with store_engine("sqlite", tmp_path) as (eng, _):
        with session_scope(eng) as s:
            s.add(RunRow(id="r"))
        yield eng


def queue(engine, ctype: str, now: float, ttl_s: float = 60.0) -> str:
    with session_scope(engine) as s:
        return enqueue_command(s, run_id="r", type=ctype, args={}, secret=SECRET, commands_topic="p.commands",
                               ttl_s=ttl_s, source="controller", now=now).id


def test_sends_in_creation_order_and_marks_commands_sent(engine):
    producer = FakeProducer()
    box = CommandOutbox(engine, KafkaConfig(), producer=producer)
    now = time.time()
    ids = [queue(engine, "pause", now), queue(engine, "validate", now + 0.001)]
    assert box.publish_due(now + 1) == 2
    assert [(t, k) for t, k, _ in producer.sent] == [("p.commands", b"r")] * 2
    assert [v for _, _, v in producer.sent] == _payloads(engine, ids)
    with session_scope(engine) as s:
        assert [s.get(CommandRow, i).status for i in ids] == ["sent", "sent"]
    assert box.publish_due(now + 2) == 0  # delivered rows are not sent again


def _payloads(engine, ids):
    with session_scope(engine) as s:
        return [s.get(OutboxRow, f"cmd_{i}").payload for i in ids]


def test_a_failed_send_backs_off_retries_and_gives_up_when_the_command_expired(engine):
    producer = FakeProducer()
    box = CommandOutbox(engine, KafkaConfig(), producer=producer, retry_s=2.0)
    now = time.time()
    cmd = queue(engine, "pause", now, ttl_s=30)
    producer.fail = True
    assert box.publish_due(now) == 0
    with session_scope(engine) as s:
        row = s.get(OutboxRow, f"cmd_{cmd}")
        assert (row.status, row.attempts, "broker said no" in row.last_error) == ("pending", 1, True)
        assert row.next_attempt_at > now
    assert box.publish_due(now + 0.5) == 0 and box.errors == 1  # not due yet: nothing tried
    producer.fail = False
    assert box.publish_due(time.time() + 3) == 1
    expired = queue(engine, "resume", now - 100, ttl_s=1)  # its expiry passed long ago
    producer.fail = True
    box.publish_due(time.time())
    with session_scope(engine) as s:
        assert s.get(OutboxRow, f"cmd_{expired}").status == "failed"
        assert s.scalars(select(OutboxRow.status).where(OutboxRow.id == f"cmd_{cmd}")).one() == "delivered"


def test_an_early_send_goes_before_the_commit_and_is_not_sent_again(engine):
    producer = FakeProducer()
    box = CommandOutbox(engine, KafkaConfig(), producer=producer)
    now = time.time()
    with session_scope(engine) as s:
        first = enqueue_command(s, run_id="r", type="pause", args={}, secret=SECRET, commands_topic="p.commands",
                                ttl_s=60, source="controller", now=now).id
        assert not box.send_early(s, first)  # the run's state (its command ids' salt) is not stored yet
    assert box.publish_due(now) == 1
    with session_scope(engine) as s:
        s.get(RunRow, "r").controller_state = {"stored": True}
    with session_scope(engine) as s:
        cmd = enqueue_command(s, run_id="r", type="pause", args={}, secret=SECRET, commands_topic="p.commands",
                              ttl_s=60, source="controller", now=now).id
        assert box.send_early(s, cmd)
        assert len(producer.sent) == 2  # on the wire while the transaction is still open
    assert box.publish_due(now + 1) == 1 and len(producer.sent) == 2 and box.early == 1
    with session_scope(engine) as s:
        assert s.get(CommandRow, cmd).status == "sent" and s.get(OutboxRow, f"cmd_{cmd}").status == "delivered"
    assert producer.sent[1][2] == _payloads(engine, [cmd])[0]


def test_an_early_send_waits_behind_an_older_pending_command_and_a_failed_one_is_retried(engine):
    producer = FakeProducer()
    box = CommandOutbox(engine, KafkaConfig(), producer=producer, retry_s=2.0)
    now = time.time()
    with session_scope(engine) as s:
        s.get(RunRow, "r").controller_state = {"stored": True}
    older = queue(engine, "pause", now)
    with session_scope(engine) as s:
        newer = enqueue_command(s, run_id="r", type="resume", args={}, secret=SECRET, commands_topic="p.commands",
                                ttl_s=60, source="controller", now=now + 0.001).id
        assert not box.send_early(s, newer)  # it would overtake the pause
    assert box.publish_due(now + 1) == 2
    assert [v for _, _, v in producer.sent] == _payloads(engine, [older, newer])
    producer.fail = True
    with session_scope(engine) as s:
        failing = enqueue_command(s, run_id="r", type="pause", args={}, secret=SECRET, commands_topic="p.commands",
                                  ttl_s=60, source="controller", now=now + 2).id
        assert box.send_early(s, failing)
    producer.fail = False
    assert box.publish_due(now + 3) == 0  # the early send failed: backoff, then sent again
    assert box.publish_due(now + 10) == 1 and len(producer.sent) == 3


def test_a_command_that_expired_before_its_turn_is_never_sent(engine):
    producer = FakeProducer()
    box = CommandOutbox(engine, KafkaConfig(), producer=producer)
    now = time.time()
    late = queue(engine, "pause", now - 100, ttl_s=1)  # e.g. pending through a broker outage
    fresh = queue(engine, "validate", now)
    assert box.publish_due(now + 1) == 1
    assert [v for _, _, v in producer.sent] == _payloads(engine, [fresh])  # the broker was fine: still not sent
    with session_scope(engine) as s:
        row, cmd = s.get(OutboxRow, f"cmd_{late}"), s.get(CommandRow, late)
        assert (row.status, row.last_error) == ("failed", "expired before it could be sent")
        assert (cmd.status, cmd.ack_detail) == ("failed", "expired before it could be sent")
    assert box.expired == 1


class FatalProducer(FakeProducer):
    """kafka-python's idempotent producer after a broker restart: every send fails, for good."""

    def __init__(self) -> None:
        super().__init__()
        self.fail = True
        self.closed = False

    def close(self, timeout=None):
        self.closed = True


def test_a_producer_the_broker_did_not_acknowledge_is_replaced_before_the_next_pass(engine):
    built: list[FakeProducer] = [FatalProducer(), FakeProducer()]
    box = CommandOutbox(engine, KafkaConfig(), retry_s=0.01)
    box._producer._factory = lambda: built.pop(0)  # the builder the real Kafka producer comes from
    box._producer._probe = lambda _k: True
    first = box._producer.get()
    now = time.time()
    cmd = queue(engine, "pause", now)
    assert box.publish_due(now) == 0 and first.closed and box._producer.discards == 1
    assert box.publish_due(time.time() + 1) == 1  # a new producer, built for this pass
    with session_scope(engine) as s:
        assert s.get(CommandRow, cmd).status == "sent"


class RaisingProducer(FakeProducer):
    def __init__(self, exc: BaseException) -> None:
        super().__init__()
        self.exc = exc

    def send(self, topic, key, value):
        raise self.exc


@pytest.mark.parametrize("exc, traceback", [(ConnectionError("no bootstrap host accepts connections"), False),
                                            (ValueError("a bug"), True)])
def test_an_early_send_the_broker_refuses_is_one_line_and_a_bug_keeps_its_traceback(engine, caplog, exc, traceback):
    """A broker that is down is expected under faults (the soak counted its tracebacks as ours);
    anything else is a bug and is logged with its traceback."""
    import logging

    box = CommandOutbox(engine, KafkaConfig(), producer=RaisingProducer(exc))
    with session_scope(engine) as s:
        s.get(RunRow, "r").controller_state = {"stored": True}
    with session_scope(engine) as s, caplog.at_level(logging.WARNING, logger="cliffguard.controller.outbox"):
        cmd = enqueue_command(s, run_id="r", type="pause", args={}, secret=SECRET, commands_topic="p.commands",
                              ttl_s=60, source="controller", now=time.time()).id
        assert not box.send_early(s, cmd)
    said = [r for r in caplog.records if "early send" in r.getMessage()]
    assert len(said) == 1 and str(exc) in said[0].getMessage() and bool(said[0].exc_info) is traceback
