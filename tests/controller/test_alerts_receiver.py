"""Through real parts: a real HTTP receiver on 127.0.0.1 that is down, then up, and a real store.

Every alert must arrive exactly once after the receiver de-duplicates by ``webhook-id`` (the way
Standard Webhooks asks receivers to), with a valid signature on every request it got, including
the retry of a request whose response was lost.
"""

from __future__ import annotations

import json
import time
from collections import Counter

import pytest
from sqlalchemy import select

from cliffguard.controller.alerts import (
    AlertDeliverer,
    AlertsConfig,
    AlertSpec,
    EndpointConfig,
    enqueue_alert,
    verify,
)
from cliffguard.controller.broker import free_port
from cliffguard.controller.store.db import session_scope
from cliffguard.controller.store.models import OutboxRow
from testing.alerts import GENERIC_SECRET, Receiver, pg_engine, sqlite_engine


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def engine(request, tmp_path):
    if request.param == "sqlite":
        yield sqlite_engine(tmp_path)
        return
    with pg_engine(request.getfixturevalue("pg_url")) as pg:
        yield pg


def outbox(engine) -> list[OutboxRow]:
    with session_scope(engine) as s:
        return list(s.scalars(select(OutboxRow)))


def wait_for(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def enqueue(engine, cfg, rule: str, level: str = "critical", action: str = "trigger") -> str:
    with session_scope(engine) as s:
        spec = AlertSpec(rule=rule, level=level, title=f"{rule} fired", run_id="run-r", incident_id=f"inc-{rule}", action=action)
        return enqueue_alert(s, spec, cfg, now=time.time()).id


def test_receiver_down_then_up_gets_every_alert_exactly_once_signed(engine):
    port = free_port()
    cfg = AlertsConfig(
        endpoints=[EndpointConfig(name="hooks", url=f"http://127.0.0.1:{port}/hook", secret=GENERIC_SECRET)],
        backoff_base_s=0.05, backoff_max_s=0.2, poll_interval_s=0.05, request_timeout_s=2.0,
    )
    alert_ids = [enqueue(engine, cfg, f"rule{i}", level) for i, level in enumerate(["critical", "warn", "info", "critical"])]
    alert_ids.append(enqueue(engine, cfg, "rule0", "critical", action="resolve"))
    deliverer = AlertDeliverer(engine, cfg).start()
    try:
        # Down: nothing listens on the port; every head-of-queue attempt is refused and retried.
        wait_for(lambda: max(r.attempts for r in outbox(engine)) >= 3, 20, "retries while the receiver is down")
        down = outbox(engine)
        assert all(r.status == "pending" for r in down)
        assert any("ConnectionRefused" in (r.last_error or "") for r in down)
        # Up: the receiver records, but answers its very first request 503 (a lost response).
        with Receiver(port, fail_first=1) as receiver:
            alert_ids.append(enqueue(engine, cfg, "late", "warn"))
            deliverer.wake()
            wait_for(lambda: all(r.status == "delivered" for r in outbox(engine)), 30, "every row delivered")
            got = receiver.snapshot()
    finally:
        deliverer.close()

    rows = outbox(engine)
    assert len(rows) == len(alert_ids) == 6
    now = time.time()
    seen = Counter(verify(GENERIC_SECRET, r.headers, r.body, now=now) for r in got)  # raises if any is invalid
    assert set(seen) == {r.id for r in rows}, "a webhook-id is missing or unknown"
    assert sorted(seen.values()) == [1, 1, 1, 1, 1, 2]  # only the 503'd one came twice, same id
    first = got[0]
    assert seen[first.headers["webhook-id"]] == 2
    assert {json.loads(r.body)["data"]["alert_id"] for r in got} == set(alert_ids)
    by_id = {r.id: r for r in rows}
    assert by_id[first.headers["webhook-id"]].attempts >= 2
    # The endpoint's queue is FIFO: the receiver saw alerts in the order they were raised.
    distinct_order = list(dict.fromkeys(json.loads(r.body)["data"]["alert_id"] for r in got))
    assert distinct_order == alert_ids


def test_urllib_poster_against_a_real_server_statuses_timeouts_refusals_and_redirects():
    import socket
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from cliffguard.controller.alerts import urllib_post
    from cliffguard.controller.alerts.retry import Outcome, classify_status

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            self.rfile.read(int(self.headers.get("content-length", 0)))
            path = self.path.strip("/")
            if path == "slow":
                time.sleep(1.0)  # the client has given up by now: answer nothing
                self.close_connection = True
                return
            code = {"ok": 200, "gone": 410, "busy": 503, "moved": 302}[path]
            self.send_response(code)
            if path == "busy":
                self.send_header("Retry-After", "7")
            if path == "moved":
                self.send_header("Location", "http://127.0.0.1:9/elsewhere")
            self.send_header("content-length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        post = lambda path, timeout=5.0: urllib_post(f"{base}/{path}", b"{}", {"content-type": "application/json"}, timeout)  # noqa: E731
        ok = post("ok")
        assert ok.status == 200 and ok.detail == "ok" and classify_status(ok.status) == Outcome.DELIVERED
        assert classify_status(post("gone").status) == Outcome.GONE
        busy = post("busy")
        assert busy.status == 503 and busy.retry_after_s == 7.0
        assert post("moved").status == 302  # not followed
        with pytest.raises(OSError):
            post("slow", timeout=0.2)
        with socket.socket() as s:  # a port with nothing listening
            s.bind(("127.0.0.1", 0))
            closed = s.getsockname()[1]
        with pytest.raises(OSError, match="refused"):
            urllib_post(f"http://127.0.0.1:{closed}/x", b"{}", {}, 2.0)
    finally:
        server.shutdown()
        server.server_close()
