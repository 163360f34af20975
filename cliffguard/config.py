"""The one config resolver every process uses: the deployment config, then each component's.

One TOML file (``--config``) < ``CLIFFGUARD_<SECTION>__<FIELD>`` env < flags, the same for every
process (``core/settings.py``). It resolves, once:

1. the deployment config (``core/deployment.py``): ``[kafka]``, ``[spike]``, ``[policy]`` and the
   keys (``[secrets]``: Ed25519 command keys, agent secret, or the HMAC ``command`` secret; never a flag);
2. each component's own section (``[store]``, ``[rules]``, ``[recovery]``, ``[agent]``, ...),
   into which the deployment's sections are handed (``core.settings.shared_field``), so the
   guard and the controller's rule get the same ``[spike]``, recovery and the trainer's fallback
   the same ``[policy]``. A component section that tries to set one of them (``[rules.spike]``,
   ``[agent.guard.spike]``, ``[recovery] lr_factor``) fails at start naming the section to use.

``cliffguard config`` validates a file the way each service would at start and prints the
resolved values (secrets masked).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cliffguard.core.deployment import DeploymentConfig, build_deployment
from cliffguard.core.settings import ENV_PREFIX, ConfigError, build_config, config_to_dict, load_toml

# section -> "module:Class". The trainer's sections ([train], [model], [data], [checkpoint],
# [agent]) nest inside TrainConfig; they are listed so one file can carry them all.
SECTIONS: dict[str, str] = {
    "kafka": "cliffguard.core.kafka_config:KafkaConfig",
    "spike": "cliffguard.core.spike:SpikeConfig",
    "policy": "cliffguard.core.deployment:PolicyConfig",
    "store": "cliffguard.controller.store.db:StoreConfig",
    "retention": "cliffguard.controller.store.retention:RetentionConfig",
    "controller": "cliffguard.controller.config:ControllerConfig",
    "recovery": "cliffguard.controller.recovery_types:RecoveryConfig",
    "rules": "cliffguard.controller.detect:RulesConfig",
    "alerts": "cliffguard.controller.alerts.config:AlertsConfig",
    "goodput": "cliffguard.controller.goodput.config:GoodputConfig",
    "dashboard": "cliffguard.dashboard.config:DashboardConfig",
    "train": "cliffguard.trainer.config:TrainConfig",
    "model": "cliffguard.trainer.model:GPTConfig",
    "data": "cliffguard.trainer.data:DataConfig",
    "checkpoint": "cliffguard.trainer.checkpoint:CheckpointConfig",
    "agent": "cliffguard.agent.config:AgentConfig",
}
DEPLOYMENT_SECTIONS = ("kafka", "spike", "policy")
"""Sections of the deployment config (with ``[secrets]``), resolved once for every process."""
# Parts of TrainConfig: built here only when the file or the environment sets them (their defaults
# depend on [train]).
TRAINER_PARTS = {"train", "model", "data", "checkpoint", "agent"}


def section_class(section: str) -> type:
    module, _, name = SECTIONS[section].partition(":")
    return getattr(importlib.import_module(module), name)


def read_toml(path: str | Path | None) -> dict[str, Any]:
    """The config file's tables; an unknown top-level section is a ConfigError."""
    toml = load_toml(path)
    unknown = set(toml) - set(SECTIONS) - {"secrets"}
    if unknown:
        raise ConfigError(sorted(unknown)[0], str(path or "config file"),
                          f"unknown section; known: {', '.join([*SECTIONS, 'secrets'])}")
    return toml


def load_deployment(
    path: str | Path | None = None,
    *,
    toml: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    flags: Mapping[str, Mapping[str, Any]] | None = None,
) -> DeploymentConfig:
    """The deployment config from ``path`` (or its already-read ``toml``) < env < flags."""
    toml = read_toml(path) if toml is None else toml
    return build_deployment(toml, env, flags, toml_source=str(path or "config file"))


def build_section(
    section: str,
    deployment: DeploymentConfig,
    *,
    toml: Mapping[str, Any],
    env: Mapping[str, str] | None = None,
    flags: Mapping[str, Any] | None = None,
    toml_source: str = "config file",
) -> Any:
    """One component's section, with the deployment's sections handed into its shared fields."""
    return build_config(section_class(section), section, toml=toml, env=env, flags=flags,
                        toml_source=toml_source, shared=deployment.shared())


@dataclass(frozen=True, slots=True)
class Resolved:
    """One resolution: the deployment config and the component sections built with it."""

    deployment: DeploymentConfig
    sections: dict[str, Any]

    def __getitem__(self, section: str) -> Any:
        return self.sections[section]

    def __contains__(self, section: str) -> bool:
        return section in self.sections


def load_all(
    path: str | Path | None = None,
    *,
    env: Mapping[str, str] | None = None,
    flags: Mapping[str, Mapping[str, Any]] | None = None,
    sections: list[str] | None = None,
) -> Resolved:
    """The deployment config and every (or the named) section's; raises ConfigError naming field and source."""
    toml = read_toml(path)
    env = os.environ if env is None else env
    source = str(path or "config file")
    deployment = build_deployment(toml, env, flags, toml_source=source)
    out: dict[str, Any] = {}
    for section in sections or list(SECTIONS):
        if section in DEPLOYMENT_SECTIONS:
            out[section] = deployment.shared()[section]
            continue
        if section in TRAINER_PARTS and section not in toml and not any(
                var.startswith(f"{ENV_PREFIX}{section.upper()}__") for var in env):
            continue
        sec_flags = dict((flags or {}).get(section) or {})
        if section == "agent":
            sec_flags.setdefault("run", (toml.get("train") or {}).get("run", "run"))
        if section == "checkpoint":
            sec_flags.setdefault("dir", "runs/<run>/checkpoints")
        out[section] = build_section(section, deployment, toml=toml, env=env, flags=sec_flags, toml_source=source)
    return Resolved(deployment, out)


def resolved(configs: Resolved) -> dict[str, dict[str, Any]]:
    """Plain data for printing: each section once (shared sections under their own name), the
    secret masked with where it came from."""
    out = {name: config_to_dict(cfg, with_shared=False) for name, cfg in configs.sections.items()}
    dep = configs.deployment
    out["secrets"] = {"command": None if dep.secret is None else "********", "command_from": dep.secret_source,
                      "command_private_key": None if dep.private_key is None else "********",
                      "command_public_key": dep.public_fingerprint,
                      "agent_secret": None if dep.agent_secret is None else "********"}
    return out
