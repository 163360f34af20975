"""AlertsConfig / EndpointConfig: validation, secrets from the environment, secrets never printed."""

from __future__ import annotations

import logging

import pytest

from cliffguard.controller.alerts import AlertsConfig, EndpointConfig, EndpointFormat
from cliffguard.controller.alerts.config import PAGERDUTY_EVENTS_URL
from cliffguard.core.settings import ConfigError, build_config, config_to_dict

SECRET = "whsec_c2VjcmV0LXRoYXQtbXVzdC1uZXZlci1wcmludA=="
SLACK_URL = "https://hooks.slack.com/services/T000/B000/XXXXsecretpath"


def test_generic_endpoint_requires_a_signing_secret():
    with pytest.raises(ValueError, match=r"^secret: .*signing secret"):
        EndpointConfig(name="hooks", url="https://example.org/h", format="generic")


def test_pagerduty_defaults_to_the_events_v2_url_and_requires_a_routing_key():
    ep = EndpointConfig(name="pd", format="pagerduty", secret="R0UTINGKEY")
    assert ep.url_value == PAGERDUTY_EVENTS_URL
    with pytest.raises(ValueError, match=r"^secret: .*routing key"):
        EndpointConfig(name="pd", format="pagerduty")


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"name": ""}, "name"),
        ({"name": "x", "format": "teams"}, "format"),
        ({"name": "x", "format": "slack", "url": "ftp://host/x"}, "url"),
        ({"name": "x", "format": "slack"}, "url"),
        ({"name": "x", "format": "slack", "url": SLACK_URL, "min_level": "loud"}, "min_level"),
        ({"name": "x", "format": "slack", "url": SLACK_URL, "url_env": "X"}, "url"),
        ({"name": "x", "secret": "a", "secret_env": "B", "url": "https://e.org/"}, "secret"),
        ({"name": "x", "secret": "whsec_not base64!", "url": "https://e.org/"}, "secret"),
    ],
)
def test_bad_endpoint_fields_are_named(kwargs, field):
    with pytest.raises(ValueError, match=rf"^{field}: "):
        EndpointConfig(**kwargs)


def test_secret_and_url_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("CG_TEST_HOOK_SECRET", SECRET)
    monkeypatch.setenv("CG_TEST_SLACK_URL", SLACK_URL)
    hooks = EndpointConfig(name="hooks", url="https://example.org/h", secret_env="CG_TEST_HOOK_SECRET")
    slack = EndpointConfig(name="chat", format="slack", url_env="CG_TEST_SLACK_URL")
    assert hooks.secret_value == SECRET
    assert slack.url_value == SLACK_URL


def test_missing_environment_variable_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("CG_TEST_NOT_SET", raising=False)
    with pytest.raises(ValueError, match="secret_env: .*CG_TEST_NOT_SET is not set"):
        EndpointConfig(name="hooks", url="https://example.org/h", secret_env="CG_TEST_NOT_SET")


def test_reprs_logs_and_saved_config_never_show_secrets(caplog):
    cfg = AlertsConfig(
        endpoints=[
            EndpointConfig(name="hooks", url="https://example.org/h", secret=SECRET),
            EndpointConfig(name="chat", format="slack", url=SLACK_URL),
            EndpointConfig(name="pd", format="pagerduty", secret="R0UTINGKEY-SECRET"),
        ]
    )
    with caplog.at_level(logging.INFO):
        logging.getLogger("test").info("config %r %s", cfg, cfg.endpoints)
    shown = [repr(cfg), str(cfg.endpoints), caplog.text, repr(config_to_dict(cfg)), repr(cfg.to_public_dict())]
    for text in shown:
        for secret in (SECRET, "XXXXsecretpath", "R0UTINGKEY-SECRET", "/services/"):
            assert secret not in text
    assert "https://hooks.slack.com/***" in repr(cfg.endpoints[1])


def test_duplicate_endpoint_names_are_refused():
    ep = {"name": "a", "format": "slack", "url": SLACK_URL}
    with pytest.raises(ValueError, match="^endpoints: duplicate names a"):
        AlertsConfig(endpoints=[ep, dict(ep)])


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"suppress_s": -1}, "suppress_s"),
        ({"backoff_base_s": 0}, "backoff_base_s"),
        ({"backoff_base_s": 10, "backoff_max_s": 5}, "backoff_max_s"),
        ({"give_up_after_s": -5}, "give_up_after_s"),
        ({"request_timeout_s": 0}, "request_timeout_s"),
        ({"batch_size": 0}, "batch_size"),
    ],
)
def test_bad_policy_values_are_named(kwargs, field):
    with pytest.raises(ValueError, match=rf"^{field}: "):
        AlertsConfig(**kwargs)


def test_built_from_toml_tables_and_env(monkeypatch):
    monkeypatch.setenv("CG_TEST_PD_KEY", "R0UTINGKEY")
    toml = {
        "alerts": {
            "suppress_s": 60,
            "endpoints": [
                {"name": "oncall", "format": "pagerduty", "secret_env": "CG_TEST_PD_KEY", "min_level": "critical"},
                {"name": "chat", "format": "slack", "url": SLACK_URL},
            ],
        }
    }
    cfg = build_config(AlertsConfig, "alerts", toml=toml, env={"CLIFFGUARD_ALERTS__GIVE_UP_AFTER_S": "120"})
    assert [ep.name for ep in cfg.endpoints] == ["oncall", "chat"]
    assert cfg.endpoints[0].format == EndpointFormat.PAGERDUTY
    assert cfg.endpoints[0].secret_value == "R0UTINGKEY"
    assert cfg.suppress_s == 60.0 and cfg.give_up_after_s == 120.0


def test_bad_endpoint_in_toml_names_the_section_and_source():
    toml = {"alerts": {"endpoints": [{"name": "x", "format": "teams", "url": SLACK_URL}]}}
    with pytest.raises(ConfigError) as info:
        build_config(AlertsConfig, "alerts", toml=toml, env={})
    assert info.value.field == "alerts.endpoints"
    assert "format" in info.value.reason
