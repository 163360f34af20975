"""Alerts: levels, suppression, formats (generic Standard Webhooks / Slack / PagerDuty) and
outbox delivery with backoff. See config.py for configuration, enqueue.py for the write side and
deliver.py for the send side."""

from controller.alerts.config import AlertsConfig, EndpointConfig, EndpointFormat, SecretStr
from controller.alerts.deliver import AlertDeliverer
from controller.alerts.enqueue import enqueue_alert, is_suppressed, set_endpoint_disabled
from controller.alerts.http import HttpPost, HttpResponse, urllib_post
from controller.alerts.spec import AlertAction, AlertLevel, AlertMessage, AlertSpec
from controller.alerts.webhook_signing import WebhookVerificationError, sign, verify

__all__ = [
    "AlertAction",
    "AlertDeliverer",
    "AlertLevel",
    "AlertMessage",
    "AlertSpec",
    "AlertsConfig",
    "EndpointConfig",
    "EndpointFormat",
    "HttpPost",
    "HttpResponse",
    "SecretStr",
    "WebhookVerificationError",
    "enqueue_alert",
    "is_suppressed",
    "set_endpoint_disabled",
    "sign",
    "urllib_post",
    "verify",
]
