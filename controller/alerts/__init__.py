"""Alerts: levels, suppression, formats (generic Standard Webhooks / Slack / PagerDuty) and
outbox delivery with backoff. See config.py for configuration, enqueue.py for the write side,
deliver.py for the send side and sink.py for where it sends to."""

from cliffguard.controller.alerts.config import AlertsConfig, EndpointConfig, EndpointFormat, SecretStr
from cliffguard.controller.alerts.deliver import AlertDeliverer
from cliffguard.controller.alerts.enqueue import enqueue_alert, is_suppressed, set_endpoint_disabled
from cliffguard.controller.alerts.http import HttpPost, HttpResponse, urllib_post
from cliffguard.controller.alerts.http_sink import HttpSink
from cliffguard.controller.alerts.retry import Outcome
from cliffguard.controller.alerts.sink import AlertSink, Delivery, InMemorySink, NullSink, SinkResult
from cliffguard.controller.alerts.sink_factory import SinkFactory, configured_sinks
from cliffguard.controller.alerts.spec import AlertAction, AlertLevel, AlertMessage, AlertSpec
from cliffguard.controller.alerts.webhook_signing import WebhookVerificationError, sign, verify

__all__ = [
    "AlertAction",
    "AlertDeliverer",
    "AlertLevel",
    "AlertMessage",
    "AlertSink",
    "AlertSpec",
    "AlertsConfig",
    "Delivery",
    "EndpointConfig",
    "EndpointFormat",
    "HttpPost",
    "HttpResponse",
    "HttpSink",
    "InMemorySink",
    "NullSink",
    "Outcome",
    "SecretStr",
    "SinkFactory",
    "SinkResult",
    "WebhookVerificationError",
    "configured_sinks",
    "enqueue_alert",
    "is_suppressed",
    "set_endpoint_disabled",
    "sign",
    "urllib_post",
    "verify",
]
