"""The deployment config: what every process of one cliffguard deployment must agree on.

The trainer, the controller and the CLI read one configuration, so they sign and verify with the
same key, talk on the same topics, give commands the same lifetime, cut the LR by the same factor
and judge losses by the same spike rule. Its sections:

- ``[kafka]`` (``core.kafka_config.KafkaConfig``): brokers and topic prefix;
- ``[spike]`` (``core.spike.SpikeConfig``): the spike rule, with the guard's budget a field of it;
- ``[policy]`` (``PolicyConfig``): the rollback's LR cut and the command lifetime;
- ``[secrets]``: the keys (never a flag: flags show in ``ps``; never a private key inline in TOML):

  ==========================  =====================================  ==============================
  what                        env (wins)                             TOML ``[secrets]``
  ==========================  =====================================  ==============================
  Ed25519 private key         ``CLIFFGUARD_COMMAND_PRIVATE_KEY``     ``command_private_key_file``
  (controller only)           (PEM or hex) or ``..._KEY_FILE``       (a 0600 file)
  Ed25519 public key          ``CLIFFGUARD_COMMAND_PUBLIC_KEY``      ``command_public_key_file``
  (trainers)                  or ``..._KEY_FILE``
  agent secret (controller,   ``CLIFFGUARD_AGENT_SECRET``            ``agent_secret_file`` (0600)
  launcher)                   or ``..._FILE``
  HMAC secret (fallback)      ``CLIFFGUARD_COMMAND_SECRET``          ``command``
  ==========================  =====================================  ==============================

  With Ed25519 keys configured commands are signed with the private key and a trainer given the
  public key refuses HMAC-signed ones. Without them the shared HMAC secret signs (the old
  behaviour) and ``signing_key()`` logs a warning: any host holding it can forge commands.
  A worker gets its run's event key (``CLIFFGUARD_EVENT_KEY``, hex), never the agent secret.

``build_deployment`` resolves them with one precedence (TOML < ``CLIFFGUARD_*`` env < flags) and
is the only reader of these settings; components that need one receive it through a
``core.settings.shared_field``. ``cliffguard/config.py`` is the entry point the processes use.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cliffguard.core.declared import bounded, check_declared
from cliffguard.core.kafka_config import KafkaConfig
from cliffguard.core.keys import (
    CommandPrivateKey,
    CommandPublicKey,
    EventSigner,
    EventVerifier,
    event_key,
    fingerprint,
    read_owner_only,
    read_private_file,
    read_public_file,
)
from cliffguard.core.policy import COMMAND_TTL_S, LR_FACTOR
from cliffguard.core.settings import ConfigError, build_config
from cliffguard.core.signing import Secret, SigningKey, VerifyingKey
from cliffguard.core.spike import SpikeConfig

log = logging.getLogger(__name__)

SECRET_ENV = "CLIFFGUARD_COMMAND_SECRET"
"""The environment variable that holds the command-signing secret (wins over ``[secrets] command``)."""
PRIVATE_KEY_ENV = "CLIFFGUARD_COMMAND_PRIVATE_KEY"
"""The Ed25519 command private key itself (PEM or hex); ``<this>_FILE``: a 0600 file holding it."""
PUBLIC_KEY_ENV = "CLIFFGUARD_COMMAND_PUBLIC_KEY"
"""The Ed25519 command public key (PEM or hex); ``<this>_FILE``: a file holding it."""
AGENT_SECRET_ENV = "CLIFFGUARD_AGENT_SECRET"
"""The agent secret every run's event key derives from; ``<this>_FILE``: a 0600 file holding it."""
EVENT_KEY_ENV = "CLIFFGUARD_EVENT_KEY"
"""One run's event-signing key (hex), what ``cliffguard train`` hands its workers."""
KEY_ENVS = (SECRET_ENV, PRIVATE_KEY_ENV, PRIVATE_KEY_ENV + "_FILE", PUBLIC_KEY_ENV, PUBLIC_KEY_ENV + "_FILE",
            AGENT_SECRET_ENV, AGENT_SECRET_ENV + "_FILE", EVENT_KEY_ENV)
"""Every environment variable that carries key material (scrubbed from processes that need none)."""

SECRET_KEYS = ("command", "command_private_key_file", "command_public_key_file", "agent_secret_file")
"""Keys of the ``[secrets]`` table."""


def scrub_keys(env: Mapping[str, str], keep: tuple[str, ...] = ()) -> dict[str, str]:
    """``env`` without the key-carrying variables (``KEY_ENVS``) except those in ``keep``."""
    return {k: v for k, v in env.items() if k not in KEY_ENVS or k in keep}


@dataclass(kw_only=True, slots=True, frozen=True)
class PolicyConfig:
    """The rollback policy's settings (``[policy]``), shared by the controller's recovery and the
    trainer's local hold-timeout fallback (``core/policy.py`` holds the rule itself)."""

    lr_factor: float = bounded(LR_FACTOR, gt=0, le=1)
    """LR multiplier per rollback, cumulative (PaLM-style halving)."""
    command_ttl_s: float = bounded(COMMAND_TTL_S, gt=0)
    """Lifetime of a signed command: a trainer refuses it as expired afterwards."""

    def __post_init__(self) -> None:
        check_declared(self)


@dataclass(kw_only=True, slots=True)
class DeploymentConfig:
    kafka: KafkaConfig = field(default_factory=KafkaConfig)
    spike: SpikeConfig = field(default_factory=SpikeConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    secret: Secret | None = field(default=None, repr=False)
    """The command-signing key; None when neither the file nor the environment sets one."""
    secret_source: str = "unset"
    """Where the secret came from (``env CLIFFGUARD_COMMAND_SECRET`` or the file), for messages."""
    private_key: CommandPrivateKey | None = field(default=None, repr=False)
    """The Ed25519 command-signing key (the controller's); None when not configured."""
    public_key: CommandPublicKey | None = None
    """The Ed25519 key trainers verify with; derived from ``private_key`` when only that is set."""
    agent_secret: Secret | None = field(default=None, repr=False)
    """The secret per-run event keys derive from; None: events are not signed or checked."""

    def __post_init__(self) -> None:
        if self.public_key is None and self.private_key is not None:
            self.public_key = self.private_key.public_key()
        if (self.private_key is not None and self.public_key is not None
                and self.public_key.raw() != self.private_key.public_key().raw()):
            raise ValueError("secrets.command_public_key_file: does not match the private key")

    @property
    def public_fingerprint(self) -> str | None:
        """The command public key's fingerprint (what every process must agree on), or None."""
        return None if self.public_key is None else fingerprint(self.public_key)

    def signing_key(self) -> SigningKey | None:
        """What the controller signs with: the private key, else the HMAC secret (with a warning)."""
        if self.private_key is not None:
            return self.private_key
        if self.secret is not None:
            log.warning("commands are signed with the shared HMAC secret (%s): any host holding it can forge "
                        "commands; generate Ed25519 keys with `cliffguard keys generate`", self.secret_source)
        return self.secret

    def require_signing_key(self) -> SigningKey:
        key = self.signing_key()
        if key is None:
            raise ValueError(f"command key: set {PRIVATE_KEY_ENV}_FILE (or [secrets] command_private_key_file), "
                             f"or the HMAC fallback {SECRET_ENV}")
        return key

    def verifying_key(self) -> VerifyingKey | None:
        """What a trainer verifies with: the public key when configured (HMAC then refused), else the secret."""
        return self.public_key if self.public_key is not None else self.secret

    def event_verifier(self) -> EventVerifier | None:
        return None if self.agent_secret is None else EventVerifier(self.agent_secret.reveal())

    def event_key_for(self, run: str) -> bytes | None:
        """The run's event key (what ``cliffguard train`` hands its workers), or None."""
        return None if self.agent_secret is None else event_key(self.agent_secret.reveal(), run)

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
    if raw is not None and not isinstance(raw, str):
        raise ConfigError("secrets.command", source, "expected a string")
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


def _key_source(table: Mapping[str, Any], env: Mapping[str, str], env_name: str, toml_key: str | None,
                toml_source: str) -> tuple[str, str | None, str | None]:
    """(source, inline value, file path) by env value > env ``_FILE`` > TOML file key."""
    if env.get(env_name):
        return f"env {env_name}", env[env_name], None
    if env.get(env_name + "_FILE"):
        return f"env {env_name}_FILE", None, env[env_name + "_FILE"]
    if toml_key and table.get(toml_key):
        if not isinstance(table[toml_key], str):
            raise ConfigError(f"secrets.{toml_key}", f"{toml_source} [secrets]", "expected a path string")
        return f"{toml_source} [secrets] {toml_key}", None, table[toml_key]
    return "unset", None, None


def resolve_keys(
    toml: Mapping[str, Any], env: Mapping[str, str] | None = None, *, toml_source: str = "config file",
    names: tuple[str, ...] = ("private_key", "public_key", "agent_secret"),
) -> dict[str, Any]:
    """The Ed25519 command keys and the agent secret: ``private_key``, ``public_key``,
    ``agent_secret`` (each None when unset; only ``names`` are read); ConfigError names the key
    and its source."""
    env = os.environ if env is None else env
    table = toml.get("secrets") or {}
    if not isinstance(table, Mapping):
        raise ConfigError("secrets", toml_source, "expected a table")
    out: dict[str, Any] = {}
    readers = (
        ("private_key", PRIVATE_KEY_ENV, "command_private_key_file", CommandPrivateKey, read_private_file),
        ("public_key", PUBLIC_KEY_ENV, "command_public_key_file", CommandPublicKey, read_public_file),
        ("agent_secret", AGENT_SECRET_ENV, "agent_secret_file", Secret, lambda p: Secret(read_owner_only(p).strip())),
    )
    for name, env_name, toml_key, inline, from_file in readers:
        if name not in names:
            continue
        source, value, path = _key_source(table, env, env_name, toml_key, toml_source)
        try:
            out[name] = inline(value) if value else from_file(path) if path else None
        except (OSError, ValueError) as exc:
            raise ConfigError(f"secrets.{toml_key}", source, str(exc)) from None
    return out


def agent_verifying_key(env: Mapping[str, str] | None = None, *, secret: str | None = None) -> VerifyingKey | None:
    """What a trainer verifies commands with: the Ed25519 public key when one is configured
    (HMAC-signed commands are then refused), else the HMAC secret (``secret``: a config file's
    value, below ``CLIFFGUARD_COMMAND_SECRET``); None when neither is set."""
    public = resolve_keys({}, env, names=("public_key",))["public_key"]  # a trainer reads no private key
    if public is not None:
        return public
    return resolve_secret({"secrets": {"command": secret}} if secret else {}, env)[0]


def agent_event_signer(run: str, env: Mapping[str, str] | None = None) -> EventSigner | None:
    """A trainer's event signer for ``run``: ``CLIFFGUARD_EVENT_KEY`` (hex, the run's key) or,
    failing that, one derived from the agent secret; None when neither is set."""
    env = os.environ if env is None else env
    if env.get(EVENT_KEY_ENV):
        try:
            return EventSigner(bytes.fromhex(env[EVENT_KEY_ENV]))
        except ValueError as exc:
            raise ConfigError("event_key", f"env {EVENT_KEY_ENV}", str(exc)) from None
    agent_secret = resolve_keys({}, env, names=("agent_secret",))["agent_secret"]
    return None if agent_secret is None else EventSigner(event_key(agent_secret.reveal(), run))


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
    keys = resolve_keys(toml, env, toml_source=toml_source)
    sections = {"kafka": section(KafkaConfig, "kafka"), "spike": section(SpikeConfig, "spike"),
                "policy": section(PolicyConfig, "policy")}
    try:
        return DeploymentConfig(**sections, secret=secret, secret_source=source, **keys)
    except ValueError as exc:
        raise ConfigError("secrets.command_public_key_file", toml_source, str(exc).split(": ", 1)[-1]) from None
