"""Configuration: TOML < env < flags; a bad value names the field and where it came from."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import pytest

from cliffguard.agent.publisher import PublisherConfig
from cliffguard.core.kafka_config import KafkaConfig
from cliffguard.core.settings import ConfigError, build_config, config_to_dict, load_toml, shared_field
from cliffguard.core.spike import SpikeConfig


def test_defaults_when_no_source_sets_anything():
    cfg = build_config(KafkaConfig, "kafka", toml={}, env={}, flags={})
    assert cfg == KafkaConfig()


def test_precedence_toml_then_env_then_flags(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[kafka]\nbootstrap = "toml:1"\npartitions = 3\ntopic_prefix = "fromtoml"\n')
    toml = load_toml(path)
    env = {"CLIFFGUARD_KAFKA__BOOTSTRAP": "env:2", "CLIFFGUARD_KAFKA__PARTITIONS": "5"}
    flags = {"bootstrap": "flag:3", "partitions": None}  # None = flag not given
    cfg = build_config(KafkaConfig, "kafka", toml=toml, env=env, flags=flags)
    assert cfg.bootstrap == "flag:3"  # flag beats env beats toml
    assert cfg.partitions == 5  # env beats toml; the absent flag does not count
    assert cfg.topic_prefix == "fromtoml"  # only toml set it


def test_env_strings_are_coerced_to_field_types():
    env = {"CLIFFGUARD_PUBLISHER__SPILL_MAX_BYTES": "2048", "CLIFFGUARD_PUBLISHER__LINGER_S": "0.01",
           "CLIFFGUARD_PUBLISHER__CREATE_TOPIC": "off"}
    cfg = build_config(PublisherConfig, "publisher", env=env)
    assert cfg.spill_max_bytes == 2048 and cfg.linger_s == 0.01 and cfg.create_topic is False


def test_optional_field_from_env_none():
    cfg = build_config(KafkaConfig, "kafka", env={"CLIFFGUARD_KAFKA__SASL_MECHANISM": "none"})
    assert cfg.sasl_mechanism is None


@pytest.mark.parametrize(("kwargs", "field", "source"), [
    ({"toml": {"kafka": {"partitions": "many"}}}, "kafka.partitions", "config file [kafka]"),
    ({"env": {"CLIFFGUARD_KAFKA__PARTITIONS": "many"}}, "kafka.partitions", "env CLIFFGUARD_KAFKA__PARTITIONS"),
    ({"flags": {"partitions": "many"}}, "kafka.partitions", "flag --partitions"),
    ({"toml": {"kafka": {"request_timeout_ms": True}}}, "kafka.request_timeout_ms", "config file [kafka]"),
])
def test_type_error_names_field_and_source(kwargs, field, source):
    kwargs.setdefault("env", {})
    with pytest.raises(ConfigError) as err:
        build_config(KafkaConfig, "kafka", **kwargs)
    assert err.value.field == field and err.value.source == source
    assert field in str(err.value) and source in str(err.value)


@pytest.mark.parametrize(("kwargs", "source"), [
    ({"toml": {"kafka": {"partitions": 0}}}, "config file [kafka]"),
    ({"env": {"CLIFFGUARD_KAFKA__PARTITIONS": "0"}}, "env CLIFFGUARD_KAFKA__PARTITIONS"),
    ({"flags": {"partitions": 0}}, "flag --partitions"),
])
def test_post_init_error_names_field_and_the_source_that_won(kwargs, source):
    kwargs.setdefault("env", {})
    with pytest.raises(ConfigError) as err:
        build_config(KafkaConfig, "kafka", **kwargs)
    assert err.value.field == "kafka.partitions"
    assert err.value.source == source
    assert ">= 1" in err.value.reason


def test_invalid_value_overridden_by_a_higher_source_is_fine():
    cfg = build_config(KafkaConfig, "kafka", toml={"kafka": {"partitions": 0}}, env={},
                       flags={"partitions": 2})
    assert cfg.partitions == 2


def test_unknown_field_is_an_error_with_source():
    with pytest.raises(ConfigError) as err:
        build_config(KafkaConfig, "kafka", env={"CLIFFGUARD_KAFKA__BOOTSTRAPP": "x:1"})
    assert err.value.field == "kafka.bootstrapp" and "unknown field" in err.value.reason
    with pytest.raises(ConfigError) as err:
        build_config(KafkaConfig, "kafka", toml={"kafka": {"nope": 1}}, env={})
    assert err.value.source == "config file [kafka]"


def test_other_sections_env_is_ignored():
    cfg = build_config(KafkaConfig, "kafka", env={"CLIFFGUARD_PUBLISHER__QUEUE_MAX": "x"})
    assert cfg == KafkaConfig()


def test_missing_and_invalid_toml_files(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_toml(tmp_path / "nope.toml")
    assert "no such file" in err.value.reason
    bad = tmp_path / "bad.toml"
    bad.write_text("[kafka\n")
    with pytest.raises(ConfigError, match="invalid TOML"):
        load_toml(bad)


def test_config_to_dict_masks_secrets():
    cfg = KafkaConfig(sasl_plain_password="hunter2-hunter2")
    assert "hunter2" not in repr(cfg)
    saved = config_to_dict(cfg)
    assert saved["bootstrap"] == cfg.bootstrap
    assert "hunter2" not in repr(saved) and saved["sasl_plain_password"] == "********"
    assert config_to_dict(KafkaConfig())["sasl_plain_password"] is None


@dataclass(kw_only=True, slots=True)
class Part:
    spike: SpikeConfig = shared_field("spike", SpikeConfig)
    n: int = 1
    MOVED: ClassVar[dict[str, str]] = {"old": "[spike] k_crit"}


def test_shared_fields_take_the_resolved_section_and_refuse_their_own():
    resolved = SpikeConfig(k_crit=7.0)
    assert build_config(Part, "part", env={}, shared={"spike": resolved}).spike is resolved
    assert build_config(Part, "part", env={}).spike == SpikeConfig()  # in code: the section's default
    for kw, source in (({"toml": {"part": {"spike": {"k_crit": 6.0}}}}, "config file [part]"),
                       ({"env": {"CLIFFGUARD_PART__SPIKE__K_CRIT": "6"}}, "env CLIFFGUARD_PART__SPIKE__K_CRIT"),
                       ({"flags": {"spike": {"k_crit": 6.0}}}, "flag --spike")):
        with pytest.raises(ConfigError) as err:
            build_config(Part, "part", **{"env": {}, **kw})
        assert err.value.field == "part.spike" and err.value.source == source and "[spike]" in err.value.reason
    with pytest.raises(ConfigError, match=r"moved: set it as \[spike\] k_crit"):
        build_config(Part, "part", toml={"part": {"old": 1}}, env={})
    assert "spike" not in config_to_dict(Part(), with_shared=False)
    assert config_to_dict(Part())["spike"]["k_crit"] == SpikeConfig().k_crit
