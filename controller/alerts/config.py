"""Alert endpoints and delivery policy, validated at start so a bad value fails then, not at 3 a.m.

In TOML::

    [alerts]
    suppress_s = 300

    [[alerts.endpoints]]
    name = "oncall"
    format = "pagerduty"                 # generic | slack | pagerduty
    secret_env = "PD_ROUTING_KEY"        # the routing key, read from the environment at start

    [[alerts.endpoints]]
    name = "hooks"
    url = "https://example.org/cliffguard"
    format = "generic"
    secret_env = "HOOK_SECRET"           # "whsec_<base64>" or any raw string (see signing.py)

    [[alerts.endpoints]]
    name = "team-chat"
    format = "slack"
    url_env = "SLACK_WEBHOOK_URL"        # a Slack webhook URL is itself the credential

Secrets and URLs are held in ``SecretStr``: reprs, logs and ``config_to_dict`` show only
``'***'`` (a URL shows its scheme and host), never the value.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any
from urllib.parse import urlsplit

from cliffguard.controller.alerts.spec import AlertLevel
from cliffguard.controller.alerts.webhook_signing import secret_key
from cliffguard.core.declared import bounded, check_declared

PAGERDUTY_EVENTS_URL = "https://events.pagerduty.com/v2/enqueue"


class EndpointFormat(StrEnum):
    GENERIC = "generic"
    """JSON signed per Standard Webhooks (webhook-id / webhook-timestamp / webhook-signature)."""
    SLACK = "slack"
    """Slack incoming webhook: ``text`` (notification fallback) + Block Kit ``blocks``."""
    PAGERDUTY = "pagerduty"
    """PagerDuty Events API v2: trigger, then resolve with dedup_key = incident id."""


class SecretStr:
    """A credential (signing secret, routing key, or a URL that embeds one) that never prints."""

    __slots__ = ("_value", "_hint")

    def __init__(self, value: str, hint: str = "") -> None:
        self._value = value
        self._hint = hint

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return f"SecretStr('{self._hint}***')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SecretStr) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


def _url_hint(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}/" if parts.scheme and parts.netloc else ""


def _from_env(var: str, what: str) -> str:
    value = os.environ.get(var)
    if not value:
        raise ValueError(f"{what}: environment variable {var} is not set")
    return value


@dataclass(kw_only=True, slots=True, repr=False)
class EndpointConfig:
    name: str
    """Unique name; the outbox row's target and the key of its disabled state."""
    format: EndpointFormat | str = EndpointFormat.GENERIC
    """generic | slack | pagerduty."""
    url: str | SecretStr | None = None
    """Where to POST. PagerDuty defaults to the Events v2 enqueue URL; the others need one."""
    url_env: str | None = None
    """Environment variable holding the URL instead (Slack webhook URLs are credentials)."""
    secret: str | SecretStr | None = None
    """generic: the signing secret (required); pagerduty: the routing key (required); slack: unused."""
    secret_env: str | None = None
    """Environment variable holding the secret instead of writing it in the config file."""
    min_level: AlertLevel | str = AlertLevel.INFO
    """Lowest level sent to this endpoint (resolves always go, so a trigger is never left open)."""
    enabled: bool = True
    """Off in config: no outbox rows are written for this endpoint."""

    def __post_init__(self) -> None:
        where = f"endpoint {self.name!r}"
        if not self.name or len(self.name) > 128:
            raise ValueError("name: must be 1..128 characters")
        try:
            self.format = EndpointFormat(self.format)
        except ValueError:
            raise ValueError(f"format: {where}: must be generic, slack or pagerduty, got {self.format!r}") from None
        try:
            self.min_level = AlertLevel(self.min_level)
        except ValueError:
            raise ValueError(f"min_level: {where}: must be info, warn or critical, got {self.min_level!r}") from None
        if self.url is not None and self.url_env is not None:
            raise ValueError(f"url: {where}: give url or url_env, not both")
        if self.secret is not None and self.secret_env is not None:
            raise ValueError(f"secret: {where}: give secret or secret_env, not both")
        url = self.url.reveal() if isinstance(self.url, SecretStr) else self.url
        if self.url_env is not None:
            url = _from_env(self.url_env, f"url_env: {where}")
        if url is None and self.format == EndpointFormat.PAGERDUTY:
            url = PAGERDUTY_EVENTS_URL
        if not url:
            raise ValueError(f"url: {where}: required for format {self.format}")
        if urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).netloc:
            raise ValueError(f"url: {where}: must be an http(s) URL")
        self.url = SecretStr(url, _url_hint(url))
        secret = self.secret.reveal() if isinstance(self.secret, SecretStr) else self.secret
        if self.secret_env is not None:
            secret = _from_env(self.secret_env, f"secret_env: {where}")
        if self.format == EndpointFormat.GENERIC and not secret:
            raise ValueError(f"secret: {where}: a generic endpoint needs a signing secret (secret or secret_env)")
        if self.format == EndpointFormat.PAGERDUTY and not secret:
            raise ValueError(f"secret: {where}: a pagerduty endpoint needs its routing key (secret or secret_env)")
        if self.format == EndpointFormat.GENERIC:
            try:
                secret_key(secret)
            except ValueError:
                raise ValueError(f"secret: {where}: a whsec_ secret must be base64 after the prefix") from None
        self.secret = SecretStr(secret) if secret else None

    def __repr__(self) -> str:
        return (
            f"EndpointConfig(name={self.name!r}, format={str(self.format)!r}, url={self.url!r}, "
            f"secret={self.secret!r}, min_level={str(self.min_level)!r}, enabled={self.enabled})"
        )

    @property
    def url_value(self) -> str:
        assert isinstance(self.url, SecretStr)  # normalised in __post_init__
        return self.url.reveal()

    @property
    def secret_value(self) -> str | None:
        return self.secret.reveal() if isinstance(self.secret, SecretStr) else None

    def accepts(self, level: AlertLevel, is_resolve: bool) -> bool:
        return self.enabled and (is_resolve or level.rank >= AlertLevel(self.min_level).rank)


@dataclass(kw_only=True, slots=True)
class AlertsConfig:
    endpoints: list[EndpointConfig] = field(default_factory=list)
    """Where alerts go (TOML: ``[[alerts.endpoints]]`` tables)."""
    suppress_s: float = bounded(300.0, ge=0)
    """A non-critical trigger for the same (run, rule) within this many seconds of the last one
    sent is stored but not sent (W&B's ``wait_duration``). Five minutes: a flapping rule pages
    once, while a new problem an hour later is news. Critical alerts and resolves always go."""
    backoff_base_s: float = bounded(2.0, gt=0)
    """First retry waits up to this long; each retry doubles the ceiling (full jitter)."""
    backoff_max_s: float = bounded(600.0, ge=0)
    """Ceiling of one retry's wait: a receiver back from an outage hears from us within 10 min."""
    give_up_after_s: float = bounded(86_400.0, ge=0)
    """Stop retrying this long after the alert was queued (status ``failed``, logged as an error).
    One day outlasts an overnight receiver outage, like Svix's ~27 h schedule; older alerts are
    history, which the dashboard shows anyway."""
    request_timeout_s: float = bounded(10.0, gt=0)
    """Connect + read timeout of one POST; a timeout counts as a failed attempt and is retried."""
    poll_interval_s: float = bounded(1.0, gt=0)
    """How often the background deliverer looks for due rows."""
    batch_size: int = bounded(100, ge=1)
    """Rows looked at per endpoint per pass."""

    def __post_init__(self) -> None:
        check_declared(self)
        endpoints: list[EndpointConfig] = []
        for i, ep in enumerate(self.endpoints):
            if isinstance(ep, Mapping):
                try:
                    ep = EndpointConfig(**dict(ep))
                except TypeError as exc:
                    raise ValueError(f"endpoints: [{i}] {exc}") from None
                except ValueError as exc:
                    raise ValueError(f"endpoints: [{i}] {exc}") from None
            if not isinstance(ep, EndpointConfig):
                raise ValueError(f"endpoints: [{i}] expected an endpoint table, got {type(ep).__name__}")
            endpoints.append(ep)
        names = [ep.name for ep in endpoints]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"endpoints: duplicate names {', '.join(dupes)}")
        self.endpoints = endpoints
        if self.backoff_max_s < self.backoff_base_s:
            raise ValueError("backoff_max_s: must be >= backoff_base_s")

    def endpoint(self, name: str) -> EndpointConfig | None:
        for ep in self.endpoints:
            if ep.name == name:
                return ep
        return None

    def to_public_dict(self) -> dict[str, Any]:
        """Plain data for saving with the run; credentials masked."""
        return {
            "endpoints": [repr(ep) for ep in self.endpoints],
            **{k: getattr(self, k) for k in (
                "suppress_s", "backoff_base_s", "backoff_max_s", "give_up_after_s",
                "request_timeout_s", "poll_interval_s", "batch_size")},
        }
