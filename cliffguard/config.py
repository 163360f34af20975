"""The one place that knows every component's config section.

Each component owns its validated dataclass; this module maps TOML sections to them and builds
the whole tree from ``--config FILE.toml`` < ``CLIFFGUARD_<SECTION>__<FIELD>`` env < flags (see
``core/settings.py``), so one file configures the broker address, the store, the rules, the
recovery policy, the alerts, the dashboard and the trainer alike. ``cliffguard config --check``
validates a file the way each service would at start and prints the resolved values.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from core.settings import build_config, config_to_dict, load_toml

# section -> "module:Class". The trainer's sections ([train], [model], [data], [checkpoint],
# [agent]) nest inside TrainConfig; they are listed so one file can carry them all.
SECTIONS: dict[str, str] = {
    "kafka": "core.kafka_config:KafkaConfig",
    "store": "controller.store.db:StoreConfig",
    "retention": "controller.store.retention:RetentionConfig",
    "controller": "controller.config:ControllerConfig",
    "recovery": "controller.recovery_types:RecoveryConfig",
    "rules": "controller.detect:RulesConfig",
    "alerts": "controller.alerts.config:AlertsConfig",
    "dashboard": "dashboard.config:DashboardConfig",
    "train": "trainer.config:TrainConfig",
    "model": "trainer.model:GPTConfig",
    "data": "trainer.data:DataConfig",
    "checkpoint": "trainer.checkpoint:CheckpointConfig",
    "agent": "agent.hooks:AgentConfig",
}
NOT_CONFIG = {"secrets"}  # [secrets] holds values read by the components themselves
# Parts of TrainConfig: built here only when the file has them (their defaults depend on [train]).
TRAINER_PARTS = {"train", "model", "data", "checkpoint", "agent"}


def section_class(section: str) -> type:
    module, _, name = SECTIONS[section].partition(":")
    return getattr(importlib.import_module(module), name)


def load_all(
    path: str | None = None,
    *,
    env: Mapping[str, str] | None = None,
    flags: Mapping[str, Mapping[str, Any]] | None = None,
    sections: list[str] | None = None,
) -> dict[str, Any]:
    """Build every (or the named) section's config; raises ConfigError naming field and source."""
    toml = load_toml(path)
    unknown = set(toml) - set(SECTIONS) - NOT_CONFIG
    if unknown:
        from core.settings import ConfigError

        raise ConfigError(sorted(unknown)[0], path or "config file", f"unknown section; known: {', '.join(SECTIONS)}")
    out: dict[str, Any] = {}
    for section in sections or list(SECTIONS):
        if section in TRAINER_PARTS and section not in toml:
            continue
        sec_flags = dict((flags or {}).get(section) or {})
        if section == "agent":
            sec_flags.setdefault("run", (toml.get("train") or {}).get("run", "run"))
        if section == "checkpoint":
            sec_flags.setdefault("dir", "runs/<run>/checkpoints")
        out[section] = build_config(
            section_class(section), section, toml=toml, env=env, flags=sec_flags, toml_source=path or "config file"
        )
    return out


def resolved(configs: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Plain data for printing or saving; secret fields are masked by their reprs."""
    return {name: config_to_dict(cfg) for name, cfg in configs.items()}
