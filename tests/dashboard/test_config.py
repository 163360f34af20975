"""DashboardConfig: env names, the project-wide token name, no signing settings, validation naming the field."""

from __future__ import annotations

import pytest

from cliffguard.core.settings import ConfigError
from cliffguard.dashboard.config import DashboardConfig, load_config


def test_env_and_project_wide_token_and_no_signing_settings():
    cfg = load_config({
        "CLIFFGUARD_DASHBOARD__DB_URL": "sqlite:///x.db",
        "CLIFFGUARD_DASHBOARD__REFRESH_S": "1.5",
        "CLIFFGUARD_OPERATOR_TOKEN": "tok",
        "CLIFFGUARD_COMMAND_SECRET": "s" * 20,  # set for other processes: the dashboard ignores it
    })
    assert cfg.db_url == "sqlite:///x.db" and cfg.refresh_s == 1.5
    assert cfg.operator_token == "tok"
    assert "tok" not in repr(cfg)  # secrets stay out of reprs
    names = set(DashboardConfig.__dataclass_fields__)
    assert not names & {"command_secret", "topic_prefix", "command_ttl_s", "spike"}  # the controller's business
    assert "s" * 20 not in repr(cfg)


def test_dashboard_section_wins_over_project_wide_token():
    cfg = load_config({"CLIFFGUARD_DASHBOARD__OPERATOR_TOKEN": "mine", "CLIFFGUARD_OPERATOR_TOKEN": "theirs"})
    assert cfg.operator_token == "mine"


def test_bad_value_names_field_and_source():
    with pytest.raises(ConfigError, match=r"dashboard.refresh_s .*CLIFFGUARD_DASHBOARD__REFRESH_S"):
        load_config({"CLIFFGUARD_DASHBOARD__REFRESH_S": "0"})
    with pytest.raises(ValueError, match="max_points"):
        DashboardConfig(max_points=1)
