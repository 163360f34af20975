"""The deployment config: what every process of one cliffguard deployment must agree on.

The trainer, the controller and the CLI read one configuration, so they sign and verify with the
same key, talk on the same topics, give commands the same lifetime, cut the LR by the same factor
and judge losses by the same spike rule. Its sections:

- ``[kafka]`` (``core.kafka_config.KafkaConfig``): brokers and topic prefix;
- ``[spike]`` (``core.spike.SpikeConfig``): the spike rule, with the guard's patience a field of it;
- ``[policy]`` (``PolicyConfig``): the rollback's LR cut and the command lifetime;
- ``[secrets] command`` < env ``CLIFFGUARD_COMMAND_SECRET``: the command-signing key, never a flag
  (flags show in ``ps``).

``build_deployment`` resolves them with one precedence (TOML < ``CLIFFGUARD_*`` env < flags) and
is the only reader of these settings; components that need one receive it through a
``core.settings.shared_field``. ``cliffguard/config.py`` is the entry point the processes use.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from core.kafka_config import KafkaConfig
from core.policy import COMMAND_TTL_S, LR_FACTOR
from core.settings import ConfigError, build_config
from core.signing import Secret
from core.spike import SpikeConfig

SECRET_ENV = "CLIFFGUARD_COMMAND_SECRET"
"""The environment variable that holds the command-signing secret (wins over ``[secrets] command``)."""

SECRET_KEYS = ("command",)
"""Keys of the ``[secrets]`` table."""


@dataclass(kw_only=True, slots=True, frozen=True)
class PolicyConfig:
    """The rollback policy's settings (``[policy]``), shared by the controller's recovery and the
    trainer's local hold-timeout fallback (``core/policy.py`` holds the rule itself)."""

    lr_factor: float = LR_FACTOR
    """LR multiplier per rollback, cumulative (PaLM-style halving)."""
    command_ttl_s: float = COMMAND_TTL_S
    """Lifetime of a signed command: a trainer refuses it as expired afterwards."""

    def __post_init__(self) -> None:
        if not 0 < self.lr_factor <= 1:
            raise ValueError("lr_factor: must be in (0, 1]")
        if self.command_ttl_s <= 0:
            raise ValueError("command_ttl_s: must be > 0")


@dataclass(kw_only=True, slots=True)
class DeploymentConfig:
    kafka: KafkaConfig = field(default_factory=KafkaConfig)
    spike: SpikeConfig = field(default_factory=SpikeConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    secret: Secret | None = field(default=None, repr=False)
    """The command-signing key; None when neither the file nor the environment sets one."""
    secret_source: str = "unset"
    """Where the secret came from (``env CLIFFGUARD_COMMAND_SECRET`` or the file), for messages."""

    def shared(self) -> dict[str, Any]:
        """Section -> value, for ``build_config(..., shared=...)``."""
        return {"kafka": self.kafka, "spike": self.spike, "policy": self.policy}

    def require_secret(self) -> Secret:
        """The secret, or a clear error for a process that cannot work without one."""
        if self.secret is None:
            raise ValueError(f"command secret: set {SECRET_ENV} or [secrets] command "
                             "(at least 16 bytes, the same for trainers and controller)")
        return self.secret


def resolve_secret(
    toml: Mapping[str, Any], env: Mapping[str, str] | None = None, *, toml_source: str = "config file",
) -> tuple[Secret | None, str]:
    """``[secrets] command`` < ``CLIFFGUARD_COMMAND_SECRET``: (the secret or None, where it came from)."""
    env = os.environ if env is None else env
    table = toml.get("secrets") or {}
    if not isinstance(table, Mapping):
        raise ConfigError("secrets", toml_source, "expected a table")
    unknown = sorted(set(table) - set(SECRET_KEYS))
    if unknown:
        raise ConfigError(f"secrets.{unknown[0]}", f"{toml_source} [secrets]",
                          f"unknown key; known: {', '.join(SECRET_KEYS)}")
    raw, source = table.get("command"), f"{toml_source} [secrets]"
    if env.get(SECRET_ENV):
        raw, source = env[SECRET_ENV], f"env {SECRET_ENV}"
    if not raw:
        return None, "unset"
    if not isinstance(raw, str):
        raise ConfigError("secrets.command", source, "expected a string")
    try:
        return Secret(raw), source
    except ValueError as exc:
        raise ConfigError("secrets.command", source, str(exc).split(":", 1)[-1].strip()) from None


def build_deployment(
    toml: Mapping[str, Any],
    env: Mapping[str, str] | None = None,
    flags: Mapping[str, Mapping[str, Any]] | None = None,
    *,
    toml_source: str = "config file",
) -> DeploymentConfig:
    """The deployment config from TOML < env < flags (no flag for the secret); ConfigError names
    the field and its source."""
    env = os.environ if env is None else env
    flags = flags or {}
    if flags.get("secrets"):
        raise ConfigError("secrets.command", "flags", f"not taken from a flag (flags show in ps): set {SECRET_ENV}")

    def section(cls: type, name: str) -> Any:
        return build_config(cls, name, toml=toml, env=env, flags=flags.get(name), toml_source=toml_source)

    secret, source = resolve_secret(toml, env, toml_source=toml_source)
    return DeploymentConfig(kafka=section(KafkaConfig, "kafka"), spike=section(SpikeConfig, "spike"),
                            policy=section(PolicyConfig, "policy"), secret=secret, secret_source=source)
