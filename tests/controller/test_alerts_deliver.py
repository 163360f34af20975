"""AlertDeliverer through the HTTP sinks with a fake HTTP poster over a real SQLite store: backoff,
give-up, 410, order (the same logic against InMemorySink: test_alerts_sink.py)."""

from __future__ import annotations

import json
import logging
import threading
import time

from sqlalchemy import select

from cliffguard.controller.alerts import (
    AlertDeliverer,
    AlertsConfig,
    AlertSpec,
    EndpointConfig,
    configured_sinks,
    enqueue_alert,
    verify,
)
from cliffguard.controller.store.db import session_scope
from cliffguard.controller.store.models import AlertEndpointStateRow, OutboxRow
from testing.alerts import GENERIC_SECRET, ConstRng, FakePoster, sqlite_engine

HOOKS = EndpointConfig(name="hooks", url="http://127.0.0.1:9/hook", secret=GENERIC_SECRET)


def config(*endpoints: EndpointConfig, **kw) -> AlertsConfig:
    kw.setdefault("backoff_base_s", 2.0)
    kw.setdefault("backoff_max_s", 16.0)
    return AlertsConfig(endpoints=list(endpoints or [HOOKS]), **kw)


def raise_alert(engine, cfg, now, level="critical", action="trigger", rule="loss_spike", incident="inc-1") -> str:
    with session_scope(engine) as s:
        spec = AlertSpec(rule=rule, level=level, title=f"{rule} {action}", run_id="run-1", incident_id=incident, action=action)
        return enqueue_alert(s, spec, cfg, now=now).id


def rows(engine, target: str | None = None) -> list[OutboxRow]:
    with session_scope(engine) as s:
        q = select(OutboxRow).order_by(OutboxRow.created_at, OutboxRow.id)
        if target:
            q = q.where(OutboxRow.target == target)
        return list(s.scalars(q))


def test_2xx_marks_the_row_delivered_with_a_verifiable_signature(tmp_path):
    engine, cfg, poster = sqlite_engine(tmp_path), config(), FakePoster()
    alert_id = raise_alert(engine, cfg, now=100.0)
    assert AlertDeliverer(engine, cfg, configured_sinks(poster)).deliver_due(now=100.5) == 1
    [row] = rows(engine)
    assert (row.status, row.attempts, row.delivered_at, row.last_error) == ("delivered", 1, 100.5, None)
    [call] = poster.calls
    assert verify(GENERIC_SECRET, call.headers, call.body, now=101.0) == row.id
    assert json.loads(call.body)["data"]["alert_id"] == alert_id
    assert AlertDeliverer(engine, cfg, configured_sinks(poster)).deliver_due(now=200.0) == 0 and len(poster.calls) == 1


def test_backoff_schedule_doubles_to_the_cap_and_keeps_the_webhook_id(tmp_path):
    engine, cfg = sqlite_engine(tmp_path), config()
    poster = FakePoster(script=[503, ConnectionRefusedError(111, "refused"), TimeoutError("timed out"), 500, 502, 200])
    raise_alert(engine, cfg, now=0.0)
    deliverer = AlertDeliverer(engine, cfg, configured_sinks(poster), rng=ConstRng(0.5))
    now, waits = 0.0, []
    while rows(engine)[0].status == "pending":
        assert deliverer.deliver_due(now=now) in (0, 1)
        row = rows(engine)[0]
        if row.status == "pending":
            waits.append(row.next_attempt_at - now)
            assert deliverer.deliver_due(now=row.next_attempt_at - 0.01) == 0  # not due yet: no attempt
            now = row.next_attempt_at
    # full jitter at 0.5 of the ceiling: ceilings 2, 4, 8, 16, 16 (cap) -> waits 1, 2, 4, 8, 8
    assert waits == [1.0, 2.0, 4.0, 8.0, 8.0]
    assert rows(engine)[0].status == "delivered" and rows(engine)[0].attempts == 6
    ids = {c.headers["webhook-id"] for c in poster.calls}
    stamps = [int(c.headers["webhook-timestamp"]) for c in poster.calls]
    assert ids == {rows(engine)[0].id} and len(poster.calls) == 6
    assert stamps == [0, 1, 3, 7, 15, 23]  # each attempt signed at its own time
    for call, stamp in zip(poster.calls, stamps, strict=True):
        verify(GENERIC_SECRET, call.headers, call.body, now=stamp)


def test_gives_up_at_the_horizon_marks_failed_and_reports(tmp_path, caplog):
    engine, cfg = sqlite_engine(tmp_path), config(give_up_after_s=30.0)
    poster = FakePoster(default=503)
    raise_alert(engine, cfg, now=0.0)
    deliverer = AlertDeliverer(engine, cfg, configured_sinks(poster), rng=ConstRng(1.0))
    times = []
    with caplog.at_level(logging.WARNING, logger="cliffguard.controller.alerts"):
        while rows(engine)[0].status == "pending":
            now = rows(engine)[0].next_attempt_at
            times.append(now)
            deliverer.deliver_due(now=now)
    row = rows(engine)[0]
    assert times == [0.0, 2.0, 6.0, 14.0, 30.0]  # the last try is at the horizon itself
    assert row.status == "failed" and row.attempts == 5
    assert row.last_error.startswith("gave up after 5 attempts over 30s: HTTP 503")
    assert "gave up after 5 attempts" in caplog.text
    assert deliverer.stats()["failed"] == 1 and deliverer.stats()["retried"] == 4


def test_http_410_disables_the_endpoint_and_parks_its_queue(tmp_path):
    chat = EndpointConfig(name="chat", format="slack", url="http://127.0.0.1:9/slack")
    engine, cfg = sqlite_engine(tmp_path), config(HOOKS, chat)
    poster = FakePoster()
    gone = FakePoster(default=410)

    def route(url, body, headers, timeout_s):
        return (gone if url.endswith("/hook") else poster)(url, body, headers, timeout_s)

    for i in range(3):
        raise_alert(engine, cfg, now=float(i), rule=f"r{i}")
    deliverer = AlertDeliverer(engine, cfg, configured_sinks(route))
    assert deliverer.deliver_due(now=10.0) == 3  # chat got all three
    assert len(gone.calls) == 1  # one 410 is enough
    assert [r.status for r in rows(engine, "hooks")] == ["disabled"] * 3
    assert [r.status for r in rows(engine, "chat")] == ["delivered"] * 3
    with session_scope(engine) as s:
        state = s.get(AlertEndpointStateRow, "hooks")
        assert state.disabled and "410" in state.disabled_reason
    raise_alert(engine, cfg, now=20.0, rule="later")
    assert [r.target for r in rows(engine) if r.status == "pending"] == ["chat"]
    deliverer.deliver_due(now=21.0)
    assert len(gone.calls) == 1 and deliverer.stats()["disabled"] == 1


def test_a_rejected_request_fails_at_once_and_the_queue_moves_on(tmp_path, caplog):
    engine, cfg = sqlite_engine(tmp_path), config()
    poster = FakePoster(script=[400])
    raise_alert(engine, cfg, now=1.0, rule="a")
    raise_alert(engine, cfg, now=2.0, rule="b")
    with caplog.at_level(logging.ERROR, logger="cliffguard.controller.alerts"):
        assert AlertDeliverer(engine, cfg, configured_sinks(poster)).deliver_due(now=3.0) == 1
    assert [(r.status, r.attempts) for r in rows(engine)] == [("failed", 1), ("delivered", 1)]
    assert rows(engine)[0].last_error.startswith("rejected: HTTP 400")
    assert "rejected by the receiver" in caplog.text


def test_queue_is_fifo_per_endpoint_so_a_resolve_never_overtakes_its_trigger(tmp_path):
    pd = EndpointConfig(name="pd", format="pagerduty", url="http://127.0.0.1:9/pd", secret="RK")
    engine, cfg = sqlite_engine(tmp_path), config(pd)
    poster = FakePoster(script=[503])
    raise_alert(engine, cfg, now=0.0, action="trigger")
    raise_alert(engine, cfg, now=0.0, action="resolve")
    deliverer = AlertDeliverer(engine, cfg, configured_sinks(poster), rng=ConstRng(0.5))
    assert deliverer.deliver_due(now=0.0) == 0
    assert len(poster.calls) == 1  # the resolve waited behind the failed trigger
    assert deliverer.deliver_due(now=rows(engine)[0].next_attempt_at) == 2
    actions = [json.loads(c.body)["event_action"] for c in poster.calls]
    assert actions == ["trigger", "trigger", "resolve"]
    assert len({json.loads(c.body)["dedup_key"] for c in poster.calls}) == 1


def test_a_failing_poster_is_retried_not_lost(tmp_path):
    engine, cfg = sqlite_engine(tmp_path), config()
    poster = FakePoster(script=[ValueError("bug in a poster")])
    raise_alert(engine, cfg, now=0.0)
    deliverer = AlertDeliverer(engine, cfg, configured_sinks(poster), rng=ConstRng(0.5))
    assert deliverer.deliver_due(now=0.0) == 0
    row = rows(engine)[0]
    assert row.status == "pending" and row.last_error == "ValueError: bug in a poster"
    assert deliverer.deliver_due(now=row.next_attempt_at) == 1


def test_secrets_and_urls_never_reach_logs_or_the_outbox(tmp_path, caplog):
    slack_url = "http://127.0.0.1:9/services/T0/B0/SLACKSECRETPATH"
    chat = EndpointConfig(name="chat", format="slack", url=slack_url)
    pd = EndpointConfig(name="pd", format="pagerduty", url="http://127.0.0.1:9/pd", secret="PDROUTINGKEYSECRET")
    engine, cfg = sqlite_engine(tmp_path), config(HOOKS, chat, pd, give_up_after_s=3.0)
    poster = FakePoster(script=[500, ConnectionRefusedError(111, "Connection refused"), 401, 410], default=503)
    raise_alert(engine, cfg, now=0.0)
    deliverer = AlertDeliverer(engine, cfg, configured_sinks(poster), rng=ConstRng(1.0))
    with caplog.at_level(logging.DEBUG):
        for now in (0.0, 2.0, 3.0, 10.0):
            deliverer.deliver_due(now=now)
    stored = " ".join(f"{r.last_error} {r.target} {r.key}" for r in rows(engine))
    for secret in ("SLACKSECRETPATH", "PDROUTINGKEYSECRET", GENERIC_SECRET, "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"):
        assert secret not in caplog.text and secret not in stored
    assert "hooks" in caplog.text  # failures are reported, by endpoint name


def test_two_deliverers_never_send_the_same_row_twice(tmp_path):
    engine, cfg = sqlite_engine(tmp_path), config()
    for i in range(8):
        raise_alert(engine, cfg, now=float(i), rule=f"r{i}")
    lock = threading.Lock()
    sent: list[str] = []

    def slow_ok(url, body, headers, timeout_s):
        time.sleep(0.01)
        with lock:
            sent.append(headers["webhook-id"])
        return FakePoster()(url, body, headers, timeout_s)

    deliverers = [AlertDeliverer(engine, cfg, configured_sinks(slow_ok)) for _ in range(2)]
    for _ in range(5):
        threads = [threading.Thread(target=d.deliver_due, args=(100.0,)) for d in deliverers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert sorted(sent) == sorted(r.id for r in rows(engine)) and len(sent) == 8
    assert {r.status for r in rows(engine)} == {"delivered"}


def test_rows_for_an_unconfigured_endpoint_wait_then_fail_at_the_horizon(tmp_path):
    engine = sqlite_engine(tmp_path)
    old = config(EndpointConfig(name="retired", format="slack", url="http://127.0.0.1:9/x"))
    raise_alert(engine, old, now=0.0)
    current = config(give_up_after_s=100.0)
    deliverer = AlertDeliverer(engine, current, configured_sinks(FakePoster()))
    deliverer.deliver_due(now=50.0)
    assert rows(engine)[0].status == "pending"  # another instance may know it
    deliverer.deliver_due(now=100.0)
    assert rows(engine)[0].status == "failed" and "not configured" in rows(engine)[0].last_error


def test_background_thread_delivers_on_wake_and_close_stops_it(tmp_path):
    engine, cfg = sqlite_engine(tmp_path), config(poll_interval_s=30.0)
    poster = FakePoster()
    deliverer = AlertDeliverer(engine, cfg, configured_sinks(poster)).start()
    try:
        raise_alert(engine, cfg, now=time.time())
        deliverer.wake()
        deadline = time.time() + 10
        while rows(engine)[0].status != "delivered" and time.time() < deadline:
            time.sleep(0.05)
        assert rows(engine)[0].status == "delivered"
    finally:
        deliverer.close()
    assert not any(t.name == "cliffguard-alert-deliverer" for t in threading.enumerate())


def test_background_thread_survives_a_failing_pass_and_keeps_going(tmp_path, caplog):
    from cliffguard.controller.store.db import init_db, make_engine

    engine = make_engine(f"sqlite:///{tmp_path / 'late.db'}")  # no schema yet: every pass fails
    cfg = config(poll_interval_s=0.05)
    poster = FakePoster()
    deliverer = AlertDeliverer(engine, cfg, configured_sinks(poster)).start()
    try:
        with caplog.at_level(logging.ERROR, logger="cliffguard.controller.alerts"):
            deadline = time.time() + 10
            while deliverer.stats()["pass_errors"] < 2 and time.time() < deadline:
                time.sleep(0.02)
        assert deliverer.stats()["pass_errors"] >= 2
        assert "alert delivery to hooks failed this pass" in caplog.text and "alert delivery pass failed" in caplog.text
        init_db(engine)
        raise_alert(engine, cfg, now=time.time())
        deadline = time.time() + 10
        while rows(engine)[0].status != "delivered" and time.time() < deadline:
            time.sleep(0.05)
        assert rows(engine)[0].status == "delivered" and len(poster.calls) == 1
    finally:
        deliverer.close()
