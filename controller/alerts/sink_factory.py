"""Which sink an endpoint gets, by its configured format (config.py ``EndpointFormat``).

Every format today is HTTP (``HttpSink``, rendering that format). A new kind of sink is one
``EndpointFormat`` value (with its config validation) and one entry in ``SINK_BY_FORMAT``.
"""

from __future__ import annotations

from collections.abc import Callable

from cliffguard.controller.alerts.config import EndpointConfig, EndpointFormat
from cliffguard.controller.alerts.http import HttpPost, urllib_post
from cliffguard.controller.alerts.http_sink import HttpSink
from cliffguard.controller.alerts.sink import AlertSink

SinkFactory = Callable[[EndpointConfig], AlertSink]
"""What the deliverer is given: the sink for one configured endpoint."""

SINK_BY_FORMAT: dict[EndpointFormat, Callable[[EndpointConfig, HttpPost], AlertSink]] = {
    EndpointFormat.GENERIC: HttpSink,
    EndpointFormat.SLACK: HttpSink,
    EndpointFormat.PAGERDUTY: HttpSink,
}


def configured_sinks(http_post: HttpPost = urllib_post) -> SinkFactory:
    """Sinks as the endpoints' formats say, HTTP ones posting through ``http_post`` (a fake in tests)."""

    def sink_for(endpoint: EndpointConfig) -> AlertSink:
        return SINK_BY_FORMAT[EndpointFormat(endpoint.format)](endpoint, http_post)

    return sink_for
