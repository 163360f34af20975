"""The one entry point that builds every component's config from TOML < env < flags."""

from __future__ import annotations

import json

import pytest

from cliffguard.cli import main
from cliffguard.config import SECTIONS, load_all
from cliffguard.core.settings import ConfigError


def test_every_service_section_builds_from_defaults():
    configs = load_all(None, env={})
    for name in ("kafka", "spike", "policy", "store", "controller", "recovery", "rules", "alerts", "dashboard"):
        assert type(configs[name]).__name__ == SECTIONS[name].split(":")[1]


def test_precedence_file_then_env_then_flags(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[kafka]\nbootstrap = "a:1"\ntopic_prefix = "fromfile"\npartitions = 3\n[spike]\nwindow = 60\n')
    env = {"CLIFFGUARD_KAFKA__TOPIC_PREFIX": "fromenv", "CLIFFGUARD_SPIKE__K_CRIT": "6"}
    cfg = load_all(str(path), env=env, flags={"kafka": {"partitions": 7}}, sections=["kafka", "rules"])
    assert cfg["kafka"].bootstrap == "a:1"
    assert cfg["kafka"].topic_prefix == "fromenv"
    assert cfg["kafka"].partitions == 7
    assert cfg["rules"].spike.window == 60
    assert cfg["rules"].spike.k_crit == 6.0
    assert cfg["rules"].spike is cfg.deployment.spike


@pytest.mark.parametrize(
    ("toml", "env", "field", "source"),
    [
        ('[kafka]\nbootstrap = "nope"\n', {}, "kafka.bootstrap", "[kafka]"),
        ("", {"CLIFFGUARD_SPIKE__WINDOW": "x"}, "spike.window", "env CLIFFGUARD_SPIKE__WINDOW"),
        ("[secrets]\ncommand = \"short\"\n", {}, "secrets.command", "[secrets]"),
        ("[secrets]\nother = \"0123456789abcdef\"\n", {}, "secrets.other", "[secrets]"),
        ("[store]\nurl = 5\n", {}, "store.url", "[store]"),
        ("[kafka]\nbogus = 1\n", {}, "kafka.bogus", "[kafka]"),
    ],
)
def test_bad_value_names_field_and_source(tmp_path, toml, env, field, source):
    path = tmp_path / "bad.toml"
    path.write_text(toml)
    with pytest.raises(ConfigError) as info:
        load_all(str(path), env=env, sections=["kafka", "store", "rules"])
    assert info.value.field == field
    assert source in info.value.source


def test_unknown_section_is_rejected(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("[kafak]\nbootstrap = 'a:1'\n")
    with pytest.raises(ConfigError, match="unknown section"):
        load_all(str(path), env={})


def test_config_command_reports_bad_file_and_exits_2(tmp_path, capsys):
    path = tmp_path / "bad.toml"
    path.write_text('[spike]\nk_crit = "high"\n')
    assert main(["config", "--config", str(path)]) == 2
    out = capsys.readouterr().out
    assert "spike.k_crit" in out and str(path) in out


@pytest.mark.parametrize(
    ("toml", "env", "field", "to"),
    [
        ("[rules.spike]\nk_crit = 6.0\n", {}, "rules.spike", "[spike]"),
        ("[agent.guard.spike]\nwindow = 32\n", {}, "agent.guard.spike", "[spike]"),
        ("", {"CLIFFGUARD_RULES__SPIKE__K_CRIT": "6"}, "rules.spike", "[spike]"),
        ("", {"CLIFFGUARD_AGENT__GUARD__SPIKE__WINDOW": "32"}, "agent.guard.spike", "[spike]"),
        ("[recovery]\nlr_factor = 0.3\n", {}, "recovery.lr_factor", "[policy] lr_factor"),
        ("[recovery]\ncommand_ttl_s = 30.0\n", {}, "recovery.command_ttl_s", "[policy] command_ttl_s"),
        ("[agent.guard]\ntimeout_lr_factor = 0.3\n", {}, "agent.guard.timeout_lr_factor", "[policy] lr_factor"),
    ],
)
def test_a_shared_setting_in_a_component_section_fails_naming_the_one_section(tmp_path, toml, env, field, to):
    path = tmp_path / "old.toml"
    path.write_text("[train]\nsteps = 10\n" + toml)
    with pytest.raises(ConfigError) as info:
        load_all(str(path), env=env)
    assert info.value.field == field
    assert to in info.value.reason


def test_config_command_prints_shared_sections_once_and_masks_the_secret(tmp_path, capsys, monkeypatch):
    path = tmp_path / "c.toml"
    path.write_text('[spike]\nk_crit = 6.0\n[secrets]\ncommand = "file-secret-0123456789"\n')
    monkeypatch.setenv("CLIFFGUARD_COMMAND_SECRET", "env-secret-0123456789")
    assert main(["config", "--config", str(path)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["spike"]["k_crit"] == 6.0 and out["spike"]["guard_budget"] == 10.0
    assert "spike" not in out["rules"]  # printed once, as its own section
    assert out["secrets"] == {"command": "********", "command_from": "env CLIFFGUARD_COMMAND_SECRET",
                              "command_private_key": None, "command_public_key": None, "agent_secret": None}
