"""The consumer edge: classify is pure and total; through the broker, good events arrive typed and
bad ones land in the DLQ with their reason, origin and original bytes while the consumer goes on."""

from __future__ import annotations

import json
import math
import time
import uuid

import pytest

from agent.publisher import Publisher, PublisherConfig
from controller.config import ControllerConfig
from controller.edge import (
    CLOCK_SKEW,
    DLQ_KEEP_BYTES,
    OVERSIZED,
    SCHEMA_INVALID,
    UNDECODABLE,
    UNKNOWN_VERSION,
    ClockWindow,
    DeadLetter,
    EdgeConsumer,
    classify,
)
from core.enums import EventType
from core.events import encode_event, make_event
from tests.core.test_events import PAYLOADS, STEP

FAST_GROUP = {"max_poll_interval_ms": 3000, "session_timeout_ms": 3000, "heartbeat_interval_ms": 500}


def _classify(raw, max_bytes=10_000):
    return classify(raw, topic="t.metrics", partition=1, offset=42, max_bytes=max_bytes)


def test_classify_good_event():
    ev = make_event("step", "run-1", 3, STEP)
    assert _classify(encode_event(ev)) == ev


@pytest.mark.parametrize(("raw", "reason", "field"), [
    (None, UNDECODABLE, "$"),
    (b"\xff\xfe\x00", UNDECODABLE, "$"),
    (b'{"v":1,"id":', UNDECODABLE, "$"),
    (b"[" * 5_000, UNDECODABLE, "$"),
    (b'{"v":2,"id":"x"}', UNKNOWN_VERSION, "v"),
    (json.dumps({**make_event("step", "r", 1, STEP).to_dict(), "step": "one"}).encode(), SCHEMA_INVALID, "step"),
    (json.dumps({**make_event("step", "r", 1, STEP).to_dict(), "id": "NaN"}).encode(), SCHEMA_INVALID, "id"),
    (json.dumps({**make_event("step", "r", 1, STEP).to_dict(), "step": 2**63}).encode(), SCHEMA_INVALID, "step"),
], ids=["none", "not-utf8", "truncated", "deep", "version", "wrong-type", "nan-id", "step-past-int64"])
def test_classify_bad_input_gives_reason_and_origin(raw, reason, field):
    out = _classify(raw)
    assert isinstance(out, DeadLetter)
    assert out.reason == reason and out.detail.startswith(f"{field}:")
    assert (out.topic, out.partition, out.offset) == ("t.metrics", 1, 42)
    assert out.raw == (raw or b"")


@pytest.mark.parametrize(("ts", "dead"), [
    (1e300, True),            # forged: would freeze the run's last step and mask heartbeat silence
    (1e9 + 3601, True),       # past the skew allowed ahead
    (1e9 + 3599, False),
    (1e9 - 29 * 86400, False),  # a spill replayed a month late is still fine
    (1e9 - 31 * 86400, True),
    (-1e300, True),
])
def test_classify_dead_letters_timestamps_far_from_the_controller_clock(ts, dead):
    raw = encode_event(make_event("heartbeat", "run-1", 3, PAYLOADS[EventType.HEARTBEAT], ts=ts))
    window = ControllerConfig().clock_window()
    out = classify(raw, topic="t.metrics", partition=1, offset=42, max_bytes=10_000, clock=(window, 1e9))
    assert isinstance(out, DeadLetter) is dead
    if dead:
        assert out.reason == CLOCK_SKEW and out.detail.startswith("ts:")


def test_clock_window_fields_are_checked_under_the_config_names():
    with pytest.raises(ValueError, match="^max_clock_skew_s:"):
        ControllerConfig(max_clock_skew_s=0)
    with pytest.raises(ValueError, match="^max_event_age_s:"):
        ClockWindow(max_event_age_s=-1)


def test_classify_oversized_before_parsing():
    raw = b"{" + b" " * 20_000  # would be invalid JSON too: size is checked first
    out = _classify(raw, max_bytes=10_000)
    assert isinstance(out, DeadLetter) and out.reason == OVERSIZED and "20001" in out.detail


def _collect(edge: EdgeConsumer, want_records: int, want_dead: int = 0, timeout: float = 30.0):
    records, dead = [], []
    end = time.monotonic() + timeout
    while time.monotonic() < end and (len(records) < want_records or len(dead) < want_dead):
        batch = edge.poll(0.5)
        records += batch.records
        dead += batch.dead
    return records, dead


def _dlq_messages(kafka_cfg, n, timeout=15.0):
    from kafka import KafkaConsumer, TopicPartition

    c = KafkaConsumer(**kafka_cfg.client_kwargs(), enable_auto_commit=False, auto_offset_reset="earliest")
    try:
        tps = [TopicPartition(kafka_cfg.dlq_topic, p) for p in c.partitions_for_topic(kafka_cfg.dlq_topic)]
        c.assign(tps)
        c.seek_to_beginning(*tps)
        out = []
        end = time.monotonic() + timeout
        while time.monotonic() < end and len(out) < n:
            for recs in c.poll(500).values():
                out += recs
        return out
    finally:
        c.close()


@pytest.mark.broker
def test_every_event_type_published_arrives_decoded(kafka_cfg, tmp_path):
    pub = Publisher(kafka_cfg, PublisherConfig(spill_path=str(tmp_path / "spill.bin"))).start()
    sent = [make_event(t, "run-all", i, PAYLOADS[t]) for i, t in enumerate(EventType)]
    sent.append(make_event("step", "run-all", 99, {**STEP, "loss": math.nan, "grad_norm": math.inf}))
    for ev in sent:
        pub.publish(ev)
    pub.close(10)
    assert pub.stats()["sent"] == len(sent)
    edge = EdgeConsumer(kafka_cfg, f"g{uuid.uuid4().hex[:6]}", max_bytes=100_000, consumer_overrides=FAST_GROUP)
    try:
        records, dead = _collect(edge, len(sent))
    finally:
        edge.close()
    assert dead == []
    got = [r.event for r in records]
    assert [e.id for e in got] == [e.id for e in sent]  # one run = one partition = publish order
    for a, b in zip(got, sent, strict=True):
        if a.type == EventType.HEARTBEAT:
            # the publisher stamps its loss counters on heartbeats
            assert a.data["dropped_events"] == 0 and a.data["state"] == b.data["state"]
        elif a.step == 99:
            assert math.isnan(a.data["loss"]) and a.data["grad_norm"] == math.inf
        else:
            assert a == b


@pytest.mark.broker
def test_malformed_messages_go_to_the_dlq_and_the_consumer_keeps_going(kafka_cfg):
    from kafka import KafkaProducer

    good_before = make_event("step", "run-x", 1, STEP)
    good_after = make_event("step", "run-x", 2, STEP)
    bad = {
        UNDECODABLE: b"\xff not utf8 {",
        UNKNOWN_VERSION: json.dumps({**good_before.to_dict(), "v": 7}).encode(),
        SCHEMA_INVALID: json.dumps({**good_before.to_dict(), "data": {"loss": "x"}}).encode(),
        OVERSIZED: json.dumps({**good_before.to_dict(), "data": {**STEP, "pad": "x" * 5000}}).encode(),
    }
    producer = KafkaProducer(**kafka_cfg.client_kwargs())
    stream = [encode_event(good_before), *bad.values(), encode_event(good_after)]
    for raw in stream:
        producer.send(kafka_cfg.metrics_topic, key=b"run-x", value=raw)
    producer.flush(10)
    producer.close()

    edge = EdgeConsumer(kafka_cfg, f"g{uuid.uuid4().hex[:6]}", max_bytes=4000, consumer_overrides=FAST_GROUP)
    try:
        records, dead = _collect(edge, 2, len(bad))
        assert [r.event.id for r in records] == [good_before.id, good_after.id]
        assert sorted(d.reason for d in dead) == sorted(bad)
        assert dict(edge.dead_count_by_reason) == dict.fromkeys(bad, 1)
        assert edge.dlq_send_errors == 0
        part = records[0].partition
        assert all(d.partition == part for d in dead)
        assert [d.offset for d in dead] == [records[0].offset + i for i in range(1, 5)]
    finally:
        edge.close()

    dlq = _dlq_messages(kafka_cfg, len(bad))
    assert len(dlq) == len(bad)
    by_reason = {dict(m.headers)["cliffguard.reason"].decode(): m for m in dlq}
    assert set(by_reason) == set(bad)
    for reason, msg in by_reason.items():
        h = dict(msg.headers)
        assert msg.value == bad[reason]  # the original bytes, untouched
        assert msg.key == b"run-x"
        assert h["cliffguard.topic"].decode() == kafka_cfg.metrics_topic
        assert int(h["cliffguard.partition"]) == part
        assert int(h["cliffguard.offset"]) in {d.offset for d in dead}
        assert h["cliffguard.detail"]


def test_a_large_dead_letter_goes_to_the_dlq_cut_short_with_its_size():
    raw = b"x" * (DLQ_KEEP_BYTES + 10)
    d = DeadLetter(OVERSIZED, "too big", "t", 0, 5, raw)
    h = dict(d.headers())
    assert d.dlq_value() == raw[:DLQ_KEEP_BYTES]
    assert h["cliffguard.truncated"] == b"1" and int(h["cliffguard.original_size"]) == len(raw)
    small = DeadLetter(OVERSIZED, "x", "t", 0, 5, b"abc")
    assert small.dlq_value() == b"abc" and "cliffguard.truncated" not in dict(small.headers())


@pytest.mark.broker
def test_a_message_of_several_megabytes_reaches_the_dlq_truncated_and_the_partition_moves_on(kafka_cfg):
    from kafka import KafkaProducer

    huge = b'{"pad": "' + b"x" * 4_000_000 + b'"}'  # over the old 2 MB fetch limit: it stalled the partition
    after = make_event("step", "run-x", 2, STEP)
    producer = KafkaProducer(**kafka_cfg.client_kwargs(), max_request_size=8_000_000)
    producer.send(kafka_cfg.metrics_topic, key=b"run-x", value=huge)
    producer.send(kafka_cfg.metrics_topic, key=b"run-x", value=encode_event(after))
    producer.flush(10)
    producer.close()

    edge = EdgeConsumer(kafka_cfg, f"g{uuid.uuid4().hex[:6]}", consumer_overrides=FAST_GROUP)
    try:
        records, dead = _collect(edge, 1, 1, timeout=60)
        assert [r.event.id for r in records] == [after.id]
        assert [d.reason for d in dead] == [OVERSIZED]
        assert edge.dlq_truncated == 1 and edge.dlq_send_errors == 0
    finally:
        edge.close()
    (msg,) = _dlq_messages(kafka_cfg, 1)
    h = dict(msg.headers)
    assert msg.value == huge[:DLQ_KEEP_BYTES] and msg.key == b"run-x"
    assert h["cliffguard.reason"] == OVERSIZED.encode() and h["cliffguard.truncated"] == b"1"
    assert int(h["cliffguard.original_size"]) == len(huge)


@pytest.mark.broker
def test_offsets_commit_and_seek(kafka_cfg):
    from kafka import KafkaProducer

    producer = KafkaProducer(**kafka_cfg.client_kwargs())
    events = [make_event("heartbeat", "run-o", i, {"state": "running"}) for i in range(6)]
    for ev in events:
        producer.send(kafka_cfg.metrics_topic, key=b"run-o", value=encode_event(ev))
    producer.flush(10)
    producer.close()
    group = f"g{uuid.uuid4().hex[:6]}"
    assigned: list = []
    edge = EdgeConsumer(kafka_cfg, group, max_bytes=100_000, consumer_overrides=FAST_GROUP,
                        on_assigned=assigned.extend)
    try:
        records, _ = _collect(edge, 6)
        assert [r.event.step for r in records] == list(range(6))
        assert assigned and all(t == kafka_cfg.metrics_topic for t, _ in assigned)
        tp = (records[0].topic, records[0].partition)
        assert edge.commit_offsets({tp: records[3].offset + 1})
        edge.seek(tp[0], tp[1], records[1].offset)
        again, _ = _collect(edge, 5)
        assert [r.event.step for r in again] == [1, 2, 3, 4, 5]
    finally:
        edge.close()
    # A new member of the group starts where the commit said.
    edge = EdgeConsumer(kafka_cfg, group, max_bytes=100_000, consumer_overrides=FAST_GROUP)
    try:
        rest, _ = _collect(edge, 2)
        assert [r.event.step for r in rest] == [4, 5]
    finally:
        edge.close()
