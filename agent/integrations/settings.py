"""The same settings every cliffguard process reads, for integrations that have no CLI of their own.

``CLIFFGUARD_CONFIG`` (or an explicit path) names the TOML file; the environment overrides it
(``CLIFFGUARD_KAFKA__BOOTSTRAP``, ``CLIFFGUARD_COMMAND_SECRET``, ``CLIFFGUARD_AGENT__...``), by the
one rule of core/settings.py and core/deployment.py: ``[kafka]``, ``[spike]``, ``[policy]``, the
command secret and the ``[agent]`` section (with ``[agent.guard]`` and ``[agent.recovery]``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cliffguard.agent.config import AgentConfig
from cliffguard.core.deployment import (
    EVENT_KEY_ENV,
    PUBLIC_KEY_ENV,
    SECRET_ENV,
    DeploymentConfig,
    build_deployment,
)
from cliffguard.core.keys import EventSigner
from cliffguard.core.settings import build_config, load_toml

log = logging.getLogger(__name__)

CONFIG_ENV = "CLIFFGUARD_CONFIG"
BOOTSTRAP_ENV = "CLIFFGUARD_KAFKA__BOOTSTRAP"


@dataclass(frozen=True, slots=True)
class IntegrationSettings:
    deployment: DeploymentConfig
    agent: AgentConfig
    kafka_configured: bool
    """False when the broker address is only the built-in default (nothing set it)."""
    source: str
    """Where the file came from, for messages."""


def resolve_settings(run: str, config_path: str | None = None, env: Mapping[str, str] | None = None,
                     agent_flags: Mapping[str, Any] | None = None) -> IntegrationSettings:
    """The deployment and the ``[agent]`` section for ``run`` (TOML < env < ``agent_flags``)."""
    env = os.environ if env is None else env
    path = config_path or env.get(CONFIG_ENV) or None
    toml = load_toml(path) if path else {}
    source = str(path or "config file")
    deployment = build_deployment(toml, env, toml_source=source)
    agent = build_config(AgentConfig, "agent", toml=toml, env=env, flags={**(agent_flags or {}), "run": run},
                         toml_source=source, shared=deployment.shared())
    configured = bool(env.get(BOOTSTRAP_ENV)) or "bootstrap" in (toml.get("kafka") or {})
    return IntegrationSettings(deployment, agent, configured, source)


def agent_wiring(run: str, config: AgentConfig | None = None, config_path: str | None = None, *, sink: Any = None,
                 kafka: Any = None, secret: Any = None,
                 command_source: Any = None) -> tuple[AgentConfig, dict[str, Any]]:
    """An integration's ``AgentConfig`` and the ``Agent``'s ``sink``/``kafka``/``secret``/
    ``command_source``/``event_signer`` arguments: what the caller gave wins, the settings give the
    rest, with a loud warning when nothing would reach a controller or no command could be
    verified (and one from the agent when its events cannot be signed, agent/build.py)."""
    settings = resolve_settings(run, config_path)
    kwargs: dict[str, Any] = {"sink": sink, "kafka": kafka, "secret": secret, "command_source": command_source}
    run_key = settings.deployment.event_key_for(run)
    if sink is None and run_key is not None and not os.environ.get(EVENT_KEY_ENV):
        # the agent secret of the file or the environment (CLIFFGUARD_EVENT_KEY, a worker's, wins)
        kwargs["event_signer"] = EventSigner(run_key)
    if sink is None and kafka is None:
        kwargs["kafka"] = settings.deployment.kafka
        if not settings.kafka_configured:
            log.warning("cliffguard: no broker configured (%s or [kafka] bootstrap in %s); sending to the "
                        "default %s — nothing reaches a controller unless one listens there",
                        BOOTSTRAP_ENV, CONFIG_ENV, settings.deployment.kafka.bootstrap)
    if secret is None and command_source is None:
        # the Ed25519 public key when configured (HMAC-signed commands then refused), else the HMAC secret
        kwargs["secret"] = settings.deployment.verifying_key()
        if kwargs["secret"] is None and kwargs["kafka"] is not None:
            log.warning("cliffguard: no command key (%s[_FILE] or %s): no command can be verified, so this run "
                        "is report-only (the guard still skips bad updates)", PUBLIC_KEY_ENV, SECRET_ENV)
    return config or settings.agent, kwargs
