"""The consumer edge: classify is pure and total; through the broker, good events arrive typed and
bad ones land in the DLQ with their reason, origin and original bytes while the consumer goes on."""

from __future__ import annotations

import json
import math
import time
import uuid

import pytest

from cliffguard.agent.drafts import EventDraft
from cliffguard.agent.publisher import Publisher, PublisherConfig
from cliffguard.controller.bounds import StepBounds, int_bounds
from cliffguard.controller.config import ControllerConfig
from cliffguard.controller.edge import EdgeConsumer
from cliffguard.controller.edge_classify import (
    BAD_SIGNATURE,
    CLOCK_SKEW,
    DLQ_KEEP_BYTES,
    OUT_OF_RANGE,
    OVERSIZED,
    SCHEMA_INVALID,
    STEP_JUMP,
    UNDECODABLE,
    UNKNOWN_VERSION,
    UNSIGNED,
    ClockWindow,
    DeadLetter,
    EdgeBatch,
    EdgeRecord,
    classify,
    classify_polled,
    header,
)
from cliffguard.controller.store.fit import INT64
from cliffguard.core.batch_decode import BatchDecoder
from cliffguard.core.enums import EventType
from cliffguard.core.events import encode_event, make_event
from cliffguard.core.keys import EVENT_SIG_HEADER, EventSigner, EventVerifier, event_key
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


AGENT_SECRET = b"edge-agent-secret-0123456789"


@pytest.mark.parametrize(("signer", "reason"), [
    (None, UNSIGNED),
    (EventSigner(event_key(AGENT_SECRET, "run-2")), BAD_SIGNATURE),                    # another run's key
    (EventSigner(event_key(b"not-the-agent-secret-000", "run-1")), BAD_SIGNATURE),      # another secret
    (EventSigner(event_key(AGENT_SECRET, "run-1")), None),
], ids=["no-header", "other-run-key", "other-secret", "signed"])
def test_classify_dead_letters_unsigned_and_badly_signed_events(signer, reason):
    raw = encode_event(make_event("step", "run-1", 3, STEP))
    sig = None if signer is None else signer.sign(raw)
    out = classify(raw, topic="t.metrics", partition=0, offset=1, max_bytes=10_000,
                   signature=(EventVerifier(AGENT_SECRET), sig))
    if reason is None:
        assert out.run == "run-1"
    else:
        assert isinstance(out, DeadLetter) and out.reason == reason and "run-1" in out.detail


def test_a_signature_over_other_bytes_is_refused():
    signer = EventSigner(event_key(AGENT_SECRET, "run-1"))
    raw = encode_event(make_event("step", "run-1", 3, STEP))
    forged = encode_event(make_event("step", "run-1", 3, {**STEP, "loss": 1e6}))
    out = classify(forged, topic="t", partition=0, offset=1, max_bytes=10_000,
                   signature=(EventVerifier(AGENT_SECRET), signer.sign(raw)))
    assert isinstance(out, DeadLetter) and out.reason == BAD_SIGNATURE


@pytest.mark.parametrize(("etype", "data", "dead"), [
    ("validation", {"val_loss": 2.0, "batches": 2**31}, True),     # an INTEGER column
    ("validation", {"val_loss": 2.0, "batches": 2**31 - 1}, False),
    ("step", {**STEP, "tokens": 2**31}, True),                     # tokens per step: INTEGER too
    ("step", {**STEP, "mem_allocated": 2**63}, True),              # past any store's integers
    ("step", {**STEP, "mem_allocated": 2**40}, False),             # a BIGINT column
    ("run.started", {**PAYLOADS[EventType.RUN_STARTED], "n_params": 2**64}, True),  # stored as JSON
    ("step", {**STEP, "extra": 2**70}, True),           # a field of a newer minor: beyond 64 bits still
    ("step", {**STEP, "sample_range": [0, 2**70]}, True),
], ids=["int32-column", "int32-max", "int32-step-column", "int64", "bigint-fits", "json-int64", "unknown-int70",
        "list-int70"])
def test_classify_dead_letters_integers_that_do_not_fit_their_storage(etype, data, dead):
    raw = encode_event(make_event(etype, "run-1", 3, data))
    out = _classify(raw)
    assert isinstance(out, DeadLetter) is dead
    if dead:
        assert out.reason == OUT_OF_RANGE and out.detail.startswith("data.")


def test_classify_dead_letters_a_step_jump_and_accepts_going_back_only_after_a_rollback():
    bounds = StepBounds(max_step_jump=1_000)

    def step(n, etype="step", data=None):
        raw = encode_event(make_event(etype, "run-1", n, STEP if data is None else data))
        return classify(raw, topic="t", partition=0, offset=n, max_bytes=10_000, steps=bounds)

    assert not isinstance(step(5_000), DeadLetter)
    assert not isinstance(step(5_001), DeadLetter)  # confirms the run's mark
    forged = step(2**31 - 1)
    assert isinstance(forged, DeadLetter) and forged.reason == STEP_JUMP and forged.detail.startswith("step:")
    assert bounds.high("run-1") == 5_001  # the forged step moved nothing
    assert not isinstance(step(4_200), DeadLetter)  # out of order within the bound: fine
    assert step(3_000).reason == STEP_JUMP            # far back with no rollback reported
    ack = {"cmd": "c1", "cmd_type": "rollback", "status": "applied", "detail": ""}
    assert not isinstance(step(3_000, "command.ack", ack), DeadLetter)  # acked at the rolled-back step
    assert not isinstance(step(3_001), DeadLetter)    # after the applied rollback
    assert step(3_001 + 3_000).reason == STEP_JUMP
    started = {**PAYLOADS[EventType.RUN_STARTED]}
    assert not isinstance(step(0, "run.started", started), DeadLetter)  # a restart from step 0
    assert not isinstance(step(1), DeadLetter)


def _polled(messages, signed=False):
    """``messages`` as ``KafkaConsumer.poll`` hands them over: {partition: [record]}; ``signed``:
    the first 12 and 4 in 5 of the rest with a signature under their run's key, the others without."""
    from collections import namedtuple

    tp, rec = namedtuple("TP", "topic partition"), namedtuple("Rec", "value offset key headers")
    out: dict = {}
    for i, raw in enumerate(messages):
        headers = []
        if signed and (i < 12 or i % 5) and raw is not None:
            run = "run-1" if b'"run-1"' in raw else "run-a" if b'"run-a"' in raw else "run-b"
            headers = [(EVENT_SIG_HEADER, EventSigner(event_key(AGENT_SECRET, run)).sign(raw))]
        out.setdefault(tp("t.metrics", i % 3), []).append(rec(raw, i, b"k%d" % i, headers))
    return out


def _poll_outcome(messages, clock, *, verifier=None, batched=True, max_bytes=10_000):
    """Records and dead letters of one poll: ``classify_polled`` or ``classify`` per message."""
    polled, steps, batch = _polled(messages, verifier is not None), StepBounds(max_step_jump=1_000), EdgeBatch()
    if batched:
        decoder = BatchDecoder(int_bounds, INT64)
        classify_polled(batch, polled, max_bytes=max_bytes, decoder=decoder, clock=clock, verifier=verifier,
                        steps=steps)
    else:
        for tp, recs in polled.items():
            for r in recs:
                sig = None if verifier is None else (verifier, header(r.headers, EVENT_SIG_HEADER))
                out = classify(r.value, topic=tp.topic, partition=tp.partition, offset=r.offset, max_bytes=max_bytes,
                               key=r.key, clock=clock, signature=sig, steps=steps)
                if isinstance(out, DeadLetter):
                    batch.dead.append(out)
                else:
                    batch.records.append(EdgeRecord(tp.topic, tp.partition, r.offset, out))
                batch.next_offsets[(tp.topic, tp.partition)] = r.offset + 1
    return batch.records, batch.dead, batch.next_offsets


@pytest.mark.parametrize("signed", [False, True])
def test_a_polled_batch_is_classified_exactly_as_message_by_message(signed):
    """The tight loop of ``classify_polled`` (typed decoder bounded by the store's integers) gives
    the records and dead letters, reasons and details that ``classify`` gives per message: on
    hostile and mutated messages, integers beyond the columns, clock skew and step jumps."""
    pytest.importorskip("msgspec")
    from tests.core.test_batch_decode import _messages

    now = 1e9
    ts = {"ts": now}
    msgs = [encode_event(make_event("step", "run-a", 5_000 + i, STEP, ts=now)) for i in range(5)]
    msgs += [encode_event(make_event("step", "run-a", 9_000, STEP, ts=now)),               # a step jump
             encode_event(make_event("step", "run-b", 1, STEP, ts=now + 7200)),             # ahead of the clock
             encode_event(make_event("step", "run-b", 1, {**STEP, "tokens": 2**31}, ts=now)),  # an INTEGER column
             encode_event(make_event("validation", "run-b", 2, {"val_loss": 2.0, "batches": 2**31 - 1}, ts=now)),
             encode_event(make_event("step", "run-b", 3, {**STEP, "sample_range": [0, 2**63]}, ts=now)),
             None, b"x" * 10_001]
    for raw in _messages(600, 7):  # valid and mutated events of every type, their ts moved into the window
        try:
            obj = json.loads(raw)
            raw = json.dumps({**obj, **ts} if isinstance(obj, dict) and "ts" in obj else obj).encode()
        except ValueError:
            pass
        msgs.append(raw)
    verifier = EventVerifier(AGENT_SECRET) if signed else None
    batched = _poll_outcome(msgs, (ClockWindow(), now), verifier=verifier)
    assert batched == _poll_outcome(msgs, (ClockWindow(), now), verifier=verifier, batched=False)
    records, dead, _ = batched
    assert len(records) >= 100 and {d.reason for d in dead} >= {STEP_JUMP, CLOCK_SKEW, OUT_OF_RANGE, OVERSIZED,
                                                               UNDECODABLE, SCHEMA_INVALID}
    assert (UNSIGNED in {d.reason for d in dead}) is signed


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
        pub.publish(EventDraft(ev.type, ev.run, ev.step, ev.data, rank=ev.rank, world=ev.world, ts=ev.ts, id=ev.id))
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
