"""DashboardConfig: env names, the project-wide secret names, validation naming the field."""

from __future__ import annotations

import pytest

from core.settings import ConfigError
from dashboard.config import DashboardConfig, load_config


def test_env_and_project_wide_secrets():
    cfg = load_config({
        "CLIFFGUARD_DASHBOARD__DB_URL": "sqlite:///x.db",
        "CLIFFGUARD_DASHBOARD__REFRESH_S": "1.5",
        "CLIFFGUARD_DASHBOARD__SPIKE__K_WARN": "2.5",
        "CLIFFGUARD_OPERATOR_TOKEN": "tok",
        "CLIFFGUARD_COMMAND_SECRET": "s" * 20,
    })
    assert cfg.db_url == "sqlite:///x.db" and cfg.refresh_s == 1.5 and cfg.spike.k_warn == 2.5
    assert cfg.operator_token == "tok" and cfg.command_secret == "s" * 20
    assert "tok" not in repr(cfg)  # secrets stay out of reprs
    assert cfg.commands_topic == "cliffguard.commands"


def test_dashboard_section_wins_over_project_wide_token():
    cfg = load_config({"CLIFFGUARD_DASHBOARD__OPERATOR_TOKEN": "mine", "CLIFFGUARD_OPERATOR_TOKEN": "theirs"})
    assert cfg.operator_token == "mine"


def test_bad_value_names_field_and_source():
    with pytest.raises(ConfigError, match=r"dashboard.refresh_s .*CLIFFGUARD_DASHBOARD__REFRESH_S"):
        load_config({"CLIFFGUARD_DASHBOARD__REFRESH_S": "0"})
    with pytest.raises(ValueError, match="max_points"):
        DashboardConfig(max_points=1)
