"""The HTTP sink: render an alert in its endpoint's format (formats.py), POST it (http.py), and
read the status as the retry policy's outcome (retry.py).

Transport failures (refused, reset, timeout, DNS: ``OSError`` from the poster) are ``RETRY``; the
detail names the error class and the HTTP status, never the URL or a header.
"""

from __future__ import annotations

from cliffguard.controller.alerts.config import EndpointConfig
from cliffguard.controller.alerts.formats import render
from cliffguard.controller.alerts.http import HttpPost, urllib_post
from cliffguard.controller.alerts.retry import Outcome, classify_status
from cliffguard.controller.alerts.sink import Delivery, SinkResult

DETAIL_MAX = 200


class HttpSink:
    def __init__(self, endpoint: EndpointConfig, post: HttpPost = urllib_post) -> None:
        self.endpoint = endpoint
        self._post = post

    def send(self, delivery: Delivery) -> SinkResult:
        request = render(delivery.message, self.endpoint, msg_id=delivery.msg_id, now=delivery.now)
        try:
            response = self._post(request.url, request.body, request.headers, delivery.timeout_s)
        except OSError as exc:
            return SinkResult(Outcome.RETRY, f"{type(exc).__name__}: {exc}")
        outcome = classify_status(response.status)
        if outcome == Outcome.DELIVERED:
            return SinkResult(outcome)
        return SinkResult(outcome, f"HTTP {response.status}: {response.detail[:DETAIL_MAX]}", response.retry_after_s)

    def __repr__(self) -> str:  # the endpoint's repr masks its URL and secret
        return f"HttpSink({self.endpoint!r})"
