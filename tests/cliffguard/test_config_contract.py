"""The deployment contract: every process resolves the same deployment config from the same inputs.

One TOML file and one environment go into each process's own config path (``cliffguard train``
and the worker it starts, ``cliffguard controller``, ``status``, ``alerts``, ``backtest``,
``broker``, ``config``); each must come out with the same command secret (compared by
fingerprint, never the key: the Ed25519 public key's when keys are configured), topics, command
lifetime, LR cut and spike rule. The environment's secret wins over the file's everywhere;
without it the file's is used everywhere.
"""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from cliffguard.cli import build_parser, main
from cliffguard.core.spike import SpikeConfig

FILE_SECRET = "file-secret-0123456789"
ENV_SECRET = "env-secret-0123456789"
TOML = f"""
[kafka]
topic_prefix = "prod"

[secrets]
command = "{FILE_SECRET}"

[spike]
k_crit = 6.0
guard_budget = 20.0

[policy]
command_ttl_s = 45.0
"""


def fingerprint(key) -> str | None:
    """A command key's fingerprint: the public key's for Ed25519 (either half), else the secret's hash."""
    from cliffguard.core.keys import CommandPrivateKey, CommandPublicKey
    from cliffguard.core.keys import fingerprint as public_fingerprint

    if isinstance(key, CommandPrivateKey | CommandPublicKey):
        return public_fingerprint(key)
    return None if key is None else hashlib.sha256(key.reveal()).hexdigest()


def view(secret, kafka, spike, policy) -> dict:
    """What every process must agree on."""
    return {"secret": fingerprint(secret), "topics": (kafka.metrics_topic, kafka.commands_topic, kafka.dlq_topic),
            "command_ttl_s": policy.command_ttl_s, "lr_factor": policy.lr_factor, "spike": spike}


@pytest.fixture
def setup(tmp_path, monkeypatch):
    for var in list(os.environ):
        if var.startswith("CLIFFGUARD_"):
            monkeypatch.delenv(var)
    path = tmp_path / "deploy.toml"
    path.write_text(TOML)
    return path


def parse(*argv: str):
    return build_parser().parse_args(list(argv))


def views_of_every_process(path, tmp_path) -> dict[str, dict]:
    from cliffguard.commands import backtest, broker, controller, train
    from cliffguard.trainer.run import worker_config

    out: dict[str, dict] = {}

    deployment, cfg = train.build_train_config(
        parse("train", "--config", str(path), "--out-dir", str(tmp_path / "runs"), "--run", "r1"),
        bootstrap="127.0.0.1:9092")
    out["train"] = view(deployment.verifying_key(), cfg.kafka, cfg.agent.guard.spike, cfg.agent.guard.policy)
    cfg.save(tmp_path / "config.json")
    worker, secret = worker_config(tmp_path / "config.json", train.worker_env(deployment, cfg))
    out["cliffguard.trainer.run"] = view(secret, worker.kafka, worker.agent.guard.spike, worker.agent.guard.policy)

    c = controller.build_sections(parse("controller", "--config", str(path)))
    out["controller"] = view(c.deployment.require_signing_key(), c["kafka"], c["rules"].spike, c["recovery"].policy)

    for cmd in ("status", "alerts"):
        r = controller.resolve_common(parse(cmd, "--config", str(path)), ["store"])
        out[cmd] = view(r.deployment.verifying_key(), r.deployment.kafka, r.deployment.spike, r.deployment.policy)

    b = backtest.resolve(parse("backtest", "x.csv", "--config", str(path)))
    out["backtest"] = view(b.deployment.verifying_key(), b.deployment.kafka, b["rules"].spike, b.deployment.policy)

    d = broker.resolve(parse("broker", "--config", str(path)))
    out["broker"] = view(d.verifying_key(), d.kafka, d.spike, d.policy)
    return out


@pytest.mark.parametrize("env_secret", [ENV_SECRET, None], ids=["env-overrides-file", "file-only"])
def test_every_process_resolves_the_same_deployment(setup, tmp_path, monkeypatch, env_secret):
    if env_secret is not None:
        monkeypatch.setenv("CLIFFGUARD_COMMAND_SECRET", env_secret)
    expected_secret = hashlib.sha256((env_secret or FILE_SECRET).encode()).hexdigest()
    views = views_of_every_process(setup, tmp_path)
    expected = {
        "secret": expected_secret,
        "topics": ("prod.metrics", "prod.commands", "prod.dlq"),
        "command_ttl_s": 45.0,
        "lr_factor": 0.5,
        "spike": SpikeConfig(k_crit=6.0, guard_budget=20.0),
    }
    for process, got in views.items():
        assert got == expected, process


def test_the_guard_and_the_controller_build_their_detectors_from_the_one_rule(setup, tmp_path):
    from cliffguard.agent.guard import Guard
    from cliffguard.commands import controller, train
    from cliffguard.controller.detect import RunDetector

    _, cfg = train.build_train_config(
        parse("train", "--config", str(setup), "--out-dir", str(tmp_path / "runs"), "--run", "r1"), bootstrap=None)
    guard = Guard(cfg.agent.guard).detector.config
    rule = RunDetector(controller.build_sections(parse("controller", "--config", str(setup)))["rules"]).loss.spike.config
    assert guard.k_crit == rule.k_crit == 6.0
    assert (guard.budget, rule.budget) == (20.0, 1.0)  # guard_budget and budget of the same [spike]


def test_the_config_command_reports_the_same_deployment(setup, capsys, monkeypatch):
    monkeypatch.setenv("CLIFFGUARD_COMMAND_SECRET", ENV_SECRET)
    assert main(["config", "--config", str(setup)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["kafka"]["topic_prefix"] == "prod"
    assert out["spike"]["k_crit"] == 6.0 and out["policy"]["command_ttl_s"] == 45.0
    assert out["secrets"] == {"command": "********", "command_from": "env CLIFFGUARD_COMMAND_SECRET",
                              "command_private_key": None, "command_public_key": None, "agent_secret": None}
    assert FILE_SECRET not in json.dumps(out) and ENV_SECRET not in json.dumps(out)


def test_the_worker_environment_carries_the_resolved_secret_not_a_stale_one(setup, tmp_path, monkeypatch):
    from cliffguard.commands import train

    deployment, cfg = train.build_train_config(
        parse("train", "--config", str(setup), "--out-dir", str(tmp_path / "runs"), "--run", "r1"), bootstrap=None)
    # the file's secret is resolved (no env): the workers get it, and the launcher's argv never does
    env = train.worker_env(deployment, cfg)
    assert env["CLIFFGUARD_COMMAND_SECRET"] == FILE_SECRET
    assert FILE_SECRET not in " ".join(train.torchrun_command(2, tmp_path / "config.json"))
    assert FILE_SECRET not in (cfg.save(tmp_path / "config.json") or (tmp_path / "config.json").read_text())


def test_with_ed25519_keys_every_process_resolves_the_same_public_key(setup, tmp_path, monkeypatch):
    """Keys from `cliffguard keys generate`: the controller signs with the private key, every
    other process (the worker included) holds the same public key and no private material."""
    from cliffguard.commands import train
    from cliffguard.core.keys import event_key, generate_keys, read_public_file
    from cliffguard.core.keys import fingerprint as public_fingerprint

    paths = generate_keys(tmp_path / "keys")
    setup.write_text(TOML.replace("[secrets]\n", "[secrets]\n"
                                  f'command_private_key_file = "{paths["private"]}"\n'
                                  f'command_public_key_file = "{paths["public"]}"\n'
                                  f'agent_secret_file = "{paths["agent_secret"]}"\n'))
    views = views_of_every_process(setup, tmp_path)
    expected = public_fingerprint(read_public_file(paths["public"]))
    assert {process: got["secret"] for process, got in views.items()} == dict.fromkeys(views, expected)

    deployment, cfg = train.build_train_config(
        parse("train", "--config", str(setup), "--out-dir", str(tmp_path / "runs"), "--run", "r1"), bootstrap=None)
    env = train.worker_env(deployment, cfg)
    private = paths["private"].read_text()
    agent_secret = paths["agent_secret"].read_bytes().strip()
    assert not any(private in v or agent_secret.decode() in v for v in env.values())
    assert "CLIFFGUARD_COMMAND_SECRET" not in env  # the public key replaces the shared secret
    assert env["CLIFFGUARD_EVENT_KEY"] == event_key(agent_secret, "r1").hex()  # only this run's key
