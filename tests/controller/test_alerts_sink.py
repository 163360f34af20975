"""Alert sinks (controller/alerts/sink.py, http_sink.py, sink_factory.py) and the deliverer's
queue, backoff and give-up logic driven through InMemorySink, without HTTP."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from cliffguard.controller.alerts import (
    AlertDeliverer,
    AlertsConfig,
    AlertSpec,
    Delivery,
    EndpointConfig,
    HttpResponse,
    HttpSink,
    InMemorySink,
    NullSink,
    Outcome,
    SinkResult,
    configured_sinks,
    enqueue_alert,
)
from cliffguard.controller.alerts.config import EndpointFormat
from cliffguard.controller.alerts.sink_factory import SINK_BY_FORMAT
from cliffguard.controller.alerts.spec import AlertAction, AlertLevel, AlertMessage
from cliffguard.controller.store.db import session_scope
from cliffguard.controller.store.models import AlertEndpointStateRow, OutboxRow
from testing.alerts import GENERIC_SECRET, ConstRng, FakePoster, sqlite_engine

HOOKS = EndpointConfig(name="hooks", url="http://127.0.0.1:9/hook", secret=GENERIC_SECRET)
CHAT = EndpointConfig(name="chat", format="slack", url="http://127.0.0.1:9/slack")
RETRY, GONE, REJECTED = (SinkResult(Outcome.RETRY, "down"), SinkResult(Outcome.GONE, "gone for good"),
                         SinkResult(Outcome.REJECTED, "bad request"))


def config(*endpoints: EndpointConfig, **kw) -> AlertsConfig:
    kw.setdefault("backoff_base_s", 2.0)
    kw.setdefault("backoff_max_s", 16.0)
    return AlertsConfig(endpoints=list(endpoints or [HOOKS]), **kw)


def deliverer(engine, cfg, sinks: dict[str, object], rng: float = 0.5) -> AlertDeliverer:
    return AlertDeliverer(engine, cfg, lambda ep: sinks[ep.name], rng=ConstRng(rng))


def raise_alert(engine, cfg, now, rule="loss_spike", action="trigger") -> str:
    with session_scope(engine) as s:
        spec = AlertSpec(rule=rule, level="critical", title=f"{rule} {action}", run_id="run-1",
                         incident_id="inc-1", action=action)
        return enqueue_alert(s, spec, cfg, now=now).id


def rows(engine, target: str | None = None) -> list[OutboxRow]:
    with session_scope(engine) as s:
        q = select(OutboxRow).order_by(OutboxRow.created_at, OutboxRow.id)
        return list(s.scalars(q if target is None else q.where(OutboxRow.target == target)))


def message(action: AlertAction = AlertAction.TRIGGER) -> AlertMessage:
    return AlertMessage(id="alert-1", ts=100.0, rule="loss_spike", level=AlertLevel.CRITICAL, title="spike",
                        body="", run_id="run-1", incident_id="inc-1", action=action, evidence={"x": float("nan")})


# -- the sinks ------------------------------------------------------------------------------------


def test_in_memory_sink_answers_its_script_then_its_default_and_records_everything():
    sink = InMemorySink().fail_next(2)
    d = Delivery(message(), "msg-1", 1.0, 10.0)
    assert [sink.send(d).outcome for _ in range(3)] == [Outcome.RETRY, Outcome.RETRY, Outcome.DELIVERED]
    assert sink.received == [d, d, d] and sink.delivered == [d]
    assert NullSink().send(d).ok


@pytest.mark.parametrize("answer, outcome, detail", [
    (200, Outcome.DELIVERED, ""),
    (410, Outcome.GONE, "HTTP 410: "),
    (400, Outcome.REJECTED, "HTTP 400: "),
    (HttpResponse(503, retry_after_s=7.0, detail="busy"), Outcome.RETRY, "HTTP 503: busy"),
    (ConnectionRefusedError(111, "refused"), Outcome.RETRY, "ConnectionRefusedError: [Errno 111] refused"),
])
def test_http_sink_reads_the_status_as_the_retry_outcome(answer, outcome, detail):
    poster = FakePoster(script=[answer])
    result = HttpSink(HOOKS, poster).send(Delivery(message(), "msg-1", 123.0, 4.0))
    assert (result.outcome, result.detail) == (outcome, detail)
    assert result.retry_after_s == (7.0 if isinstance(answer, HttpResponse) else None)
    [call] = poster.calls
    assert call.headers["webhook-id"] == "msg-1" and call.headers["webhook-timestamp"] == "123"


def test_http_sink_lets_a_poster_bug_through_for_the_deliverer_to_count():
    with pytest.raises(ValueError):
        HttpSink(HOOKS, FakePoster(script=[ValueError("bug")])).send(Delivery(message(), "m", 0.0, 1.0))


def test_every_endpoint_format_has_a_sink_and_its_repr_hides_the_secret():
    assert set(SINK_BY_FORMAT) == set(EndpointFormat)
    pd = EndpointConfig(name="pd", format="pagerduty", secret="PDROUTINGKEYSECRET")
    for ep in (HOOKS, CHAT, pd):
        sink = configured_sinks(FakePoster())(ep)
        assert isinstance(sink, HttpSink) and "SECRET" not in repr(sink) and "/slack" not in repr(sink)


# -- the deliverer over InMemorySink --------------------------------------------------------------


def test_retries_back_off_with_full_jitter_and_hand_the_sink_the_same_message_each_time(tmp_path):
    engine, cfg = sqlite_engine(tmp_path), config(request_timeout_s=3.0)
    sink = InMemorySink().fail_next(5)
    raise_alert(engine, cfg, now=0.0)
    d = deliverer(engine, cfg, {"hooks": sink})
    now = 0.0
    while rows(engine)[0].status == "pending":
        assert d.deliver_due(now=now - 0.01) == 0  # not due yet: the sink is not called
        d.deliver_due(now=now)
        now = rows(engine)[0].next_attempt_at
    # ceilings 2, 4, 8, 16, 16 (cap) at jitter 0.5 -> waits 1, 2, 4, 8, 8
    assert [x.now for x in sink.received] == [0.0, 1.0, 3.0, 7.0, 15.0, 23.0]
    assert [x.attempt for x in sink.received] == [1, 2, 3, 4, 5, 6]
    assert {x.msg_id for x in sink.received} == {rows(engine)[0].id}
    assert {x.timeout_s for x in sink.received} == {3.0}
    assert sink.received[0].message.title == "loss_spike trigger"
    assert (rows(engine)[0].status, rows(engine)[0].attempts) == ("delivered", 6)
    assert d.stats()["retried"] == 5 and d.stats()["delivered"] == 1


def test_a_receivers_retry_after_raises_the_wait_up_to_the_cap(tmp_path):
    engine, cfg = sqlite_engine(tmp_path), config()
    sink = InMemorySink(script=[SinkResult(Outcome.RETRY, "busy", retry_after_s=12.0),
                                SinkResult(Outcome.RETRY, "busy", retry_after_s=999.0)])
    raise_alert(engine, cfg, now=0.0)
    d = deliverer(engine, cfg, {"hooks": sink})
    d.deliver_due(now=0.0)
    assert rows(engine)[0].next_attempt_at == 12.0 and rows(engine)[0].last_error == "busy"
    d.deliver_due(now=12.0)
    assert rows(engine)[0].next_attempt_at == 12.0 + 16.0


def test_gives_up_at_the_horizon(tmp_path):
    engine, cfg = sqlite_engine(tmp_path), config(give_up_after_s=30.0)
    sink = InMemorySink(default=RETRY)
    raise_alert(engine, cfg, now=0.0)
    d = deliverer(engine, cfg, {"hooks": sink}, rng=1.0)
    while rows(engine)[0].status == "pending":
        d.deliver_due(now=rows(engine)[0].next_attempt_at)
    assert [x.now for x in sink.received] == [0.0, 2.0, 6.0, 14.0, 30.0]
    assert rows(engine)[0].last_error == "gave up after 5 attempts over 30s: down"


def test_gone_disables_only_that_endpoint_and_parks_its_queue(tmp_path):
    engine, cfg = sqlite_engine(tmp_path), config(HOOKS, CHAT)
    hooks, chat = InMemorySink(script=[GONE]), InMemorySink()
    for i in range(3):
        raise_alert(engine, cfg, now=float(i), rule=f"r{i}")
    d = deliverer(engine, cfg, {"hooks": hooks, "chat": chat})
    assert d.deliver_due(now=5.0) == 3
    assert len(hooks.received) == 1 and len(chat.delivered) == 3
    assert [r.status for r in rows(engine, "hooks")] == ["disabled"] * 3
    with session_scope(engine) as s:
        assert "gone for good" in s.get(AlertEndpointStateRow, "hooks").disabled_reason


def test_rejected_fails_at_once_and_the_queue_moves_on(tmp_path):
    engine, cfg = sqlite_engine(tmp_path), config()
    sink = InMemorySink(script=[REJECTED])
    raise_alert(engine, cfg, now=1.0, rule="a")
    raise_alert(engine, cfg, now=2.0, rule="b")
    assert deliverer(engine, cfg, {"hooks": sink}).deliver_due(now=3.0) == 1
    assert [(r.status, r.last_error) for r in rows(engine)] == [("failed", "rejected: bad request"), ("delivered", None)]


def test_a_failing_row_holds_back_the_rest_of_its_endpoints_queue(tmp_path):
    engine, cfg = sqlite_engine(tmp_path), config()
    sink = InMemorySink().fail_next(1)
    raise_alert(engine, cfg, now=0.0, action="trigger")
    raise_alert(engine, cfg, now=0.0, action="resolve")
    d = deliverer(engine, cfg, {"hooks": sink})
    assert d.deliver_due(now=0.0) == 0 and len(sink.received) == 1
    assert d.deliver_due(now=rows(engine)[0].next_attempt_at) == 2
    actions = [str(x.message.action) for x in sink.delivered]
    assert actions == ["trigger", "resolve"]


def test_a_raising_sink_is_retried_not_lost(tmp_path):
    class Broken:
        def send(self, delivery):
            raise KeyError("bug")

    engine, cfg = sqlite_engine(tmp_path), config()
    raise_alert(engine, cfg, now=0.0)
    d = deliverer(engine, cfg, {"hooks": Broken()})
    assert d.deliver_due(now=0.0) == 0
    assert (rows(engine)[0].status, rows(engine)[0].last_error) == ("pending", "KeyError: 'bug'")


def test_the_sink_for_an_endpoint_is_made_once_and_a_null_sink_takes_everything(tmp_path):
    engine, cfg = sqlite_engine(tmp_path), config()
    made = []

    def factory(ep):
        made.append(ep.name)
        return NullSink()

    for i in range(3):
        raise_alert(engine, cfg, now=float(i), rule=f"r{i}")
    d = AlertDeliverer(engine, cfg, factory)
    assert d.deliver_due(now=5.0) == 3 and d.deliver_due(now=6.0) == 0
    raise_alert(engine, cfg, now=7.0, rule="r3")
    assert d.deliver_due(now=8.0) == 1 and made == ["hooks"]
