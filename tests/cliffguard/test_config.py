"""The one entry point that builds every component's config from TOML < env < flags."""

from __future__ import annotations

import pytest

from cliffguard.cli import main
from cliffguard.config import SECTIONS, load_all
from core.settings import ConfigError


def test_every_service_section_builds_from_defaults():
    configs = load_all(None, env={})
    for name in ("kafka", "store", "controller", "recovery", "rules", "alerts", "dashboard"):
        assert type(configs[name]).__name__ == SECTIONS[name].split(":")[1]


def test_precedence_file_then_env_then_flags(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[kafka]\nbootstrap = "a:1"\ntopic_prefix = "fromfile"\npartitions = 3\n[rules.spike]\nwindow = 60\n')
    env = {"CLIFFGUARD_KAFKA__TOPIC_PREFIX": "fromenv", "CLIFFGUARD_RULES__SPIKE__K_CRIT": "6"}
    cfg = load_all(str(path), env=env, flags={"kafka": {"partitions": 7}}, sections=["kafka", "rules"])
    assert cfg["kafka"].bootstrap == "a:1"
    assert cfg["kafka"].topic_prefix == "fromenv"
    assert cfg["kafka"].partitions == 7
    assert cfg["rules"].spike.window == 60
    assert cfg["rules"].spike.k_crit == 6.0


@pytest.mark.parametrize(
    ("toml", "env", "field", "source"),
    [
        ('[kafka]\nbootstrap = "nope"\n', {}, "kafka.bootstrap", "[kafka]"),
        ("", {"CLIFFGUARD_RULES__SPIKE__WINDOW": "x"}, "rules.spike.window", "env CLIFFGUARD_RULES__SPIKE__WINDOW"),
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
    path.write_text('[rules.spike]\nk_crit = "high"\n')
    assert main(["config", "--config", str(path)]) == 2
    out = capsys.readouterr().out
    assert "rules.spike.k_crit" in out and str(path) in out
