"""The deployment config (core/deployment.py): one precedence for the shared sections and the secret."""

from __future__ import annotations

import pytest

from cliffguard.core.deployment import (
    SECRET_ENV,
    DeploymentConfig,
    PolicyConfig,
    build_deployment,
    resolve_secret,
)
from cliffguard.core.settings import ConfigError
from cliffguard.core.spike import SpikeConfig

FILE = "file-secret-0123456789"
ENV = "env-secret-0123456789"


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"lr_factor": 0}, "lr_factor"), ({"lr_factor": 1.5}, "lr_factor"), ({"command_ttl_s": 0}, "command_ttl_s"),
])
def test_policy_rejects_bad_values_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=f"^{field}:"):
        PolicyConfig(**kwargs)


def test_secret_env_beats_the_file_and_says_where_it_came_from():
    toml = {"secrets": {"command": FILE}}
    secret, source = resolve_secret(toml, {SECRET_ENV: ENV}, toml_source="d.toml")
    assert secret.reveal() == ENV.encode() and source == f"env {SECRET_ENV}"
    secret, source = resolve_secret(toml, {}, toml_source="d.toml")
    assert secret.reveal() == FILE.encode() and source == "d.toml [secrets]"
    assert resolve_secret({}, {}) == (None, "unset")


@pytest.mark.parametrize(("toml", "env", "source"), [
    ({"secrets": {"command": "short"}}, {}, "d.toml [secrets]"),
    ({}, {SECRET_ENV: "short"}, f"env {SECRET_ENV}"),
    ({"secrets": {"command": 12345678901234567}}, {}, "d.toml [secrets]"),
])
def test_a_bad_secret_fails_naming_its_source_never_its_value(toml, env, source):
    with pytest.raises(ConfigError) as info:
        resolve_secret(toml, env, toml_source="d.toml")
    assert info.value.field == "secrets.command" and info.value.source == source
    assert "short" not in str(info.value)


def test_sections_follow_toml_env_flags_and_the_secret_takes_no_flag():
    toml = {"kafka": {"topic_prefix": "prod"}, "spike": {"k_crit": 6.0}, "policy": {"command_ttl_s": 30.0}}
    env = {"CLIFFGUARD_SPIKE__K_CRIT": "7", "CLIFFGUARD_POLICY__LR_FACTOR": "0.25"}
    dep = build_deployment(toml, env, {"kafka": {"topic_prefix": "flag"}})
    assert dep.kafka.topic_prefix == "flag" and dep.spike.k_crit == 7.0
    assert dep.policy == PolicyConfig(lr_factor=0.25, command_ttl_s=30.0)
    assert dep.secret is None
    with pytest.raises(ConfigError, match="secrets"):
        build_deployment({}, {}, {"secrets": {"command": FILE}})  # flags show in ps: not a source
    assert dep.shared() == {"kafka": dep.kafka, "spike": dep.spike, "policy": dep.policy}


def test_require_secret_says_where_to_set_it():
    with pytest.raises(ValueError, match=f"{SECRET_ENV} or \\[secrets\\] command"):
        DeploymentConfig().require_secret()
    assert FILE not in repr(DeploymentConfig(secret=resolve_secret({"secrets": {"command": FILE}}, {})[0]))


def test_spike_defaults_are_the_controllers_budget_and_the_guards():
    # the guard skips an update, the controller pauses a run: the guard may act ten times as often
    assert (SpikeConfig().budget, SpikeConfig().guard_budget) == (1.0, 10.0)
