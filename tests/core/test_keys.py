"""Key files, the deployment's [secrets] keys and per-run event signatures."""

from __future__ import annotations

import os
import stat

import pytest

from cliffguard.core.deployment import agent_event_signer, agent_verifying_key, build_deployment, scrub_keys
from cliffguard.core.keys import (
    CommandPrivateKey,
    CommandPublicKey,
    EventSigner,
    EventVerifier,
    event_key,
    fingerprint,
    generate_keys,
    read_private_file,
    read_public_file,
)
from cliffguard.core.settings import ConfigError
from cliffguard.core.signing import Secret

AGENT_SECRET = b"agent-secret-0123456789abcdef"


def test_generate_writes_private_files_0600_and_never_overwrites(tmp_path):
    paths = generate_keys(tmp_path / "k")
    assert stat.S_IMODE(os.stat(paths["private"]).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(paths["agent_secret"]).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "k").st_mode) == 0o700
    priv, pub = read_private_file(paths["private"]), read_public_file(paths["public"])
    assert fingerprint(priv) == fingerprint(pub)
    with pytest.raises(FileExistsError):
        generate_keys(tmp_path / "k")


def test_a_private_key_file_readable_by_others_is_refused(tmp_path):
    paths = generate_keys(tmp_path / "k")
    os.chmod(paths["private"], 0o644)
    with pytest.raises(ValueError, match="chmod 600"):
        read_private_file(paths["private"])
    with pytest.raises(ConfigError, match="secrets.command_private_key_file"):
        build_deployment({"secrets": {"command_private_key_file": str(paths["private"])}}, env={})


def test_keys_load_from_pem_or_hex_and_env_beats_the_file(tmp_path):
    paths = generate_keys(tmp_path / "k")
    other = CommandPrivateKey.generate()
    dep = build_deployment({"secrets": {"command_private_key_file": str(paths["private"])}},
                           env={"CLIFFGUARD_COMMAND_PRIVATE_KEY": other.pem().decode()})
    assert fingerprint(dep.private_key) == fingerprint(other) == dep.public_fingerprint
    raw = other.public_key().raw().hex()
    assert fingerprint(CommandPublicKey(raw)) == fingerprint(other)


def test_a_public_key_that_does_not_match_the_private_key_is_refused(tmp_path):
    a, b = generate_keys(tmp_path / "a"), generate_keys(tmp_path / "b")
    with pytest.raises(ConfigError, match="does not match"):
        build_deployment({"secrets": {"command_private_key_file": str(a["private"]),
                                      "command_public_key_file": str(b["public"])}}, env={})


def test_signing_falls_back_to_hmac_with_a_warning(caplog):
    dep = build_deployment({}, env={"CLIFFGUARD_COMMAND_SECRET": "hmac-secret-0123456789"})
    assert isinstance(dep.signing_key(), Secret)
    assert "forge" in caplog.text and "hmac-secret" not in caplog.text
    assert dep.verifying_key() is dep.secret


def test_an_agent_with_a_public_key_verifies_with_it_not_the_hmac_secret():
    pub = CommandPrivateKey.generate().public_key()
    key = agent_verifying_key({"CLIFFGUARD_COMMAND_PUBLIC_KEY": pub.pem().decode(),
                               "CLIFFGUARD_COMMAND_SECRET": "hmac-secret-0123456789"})
    assert isinstance(key, CommandPublicKey) and fingerprint(key) == fingerprint(pub)


def test_event_signatures_are_per_run():
    verifier = EventVerifier(AGENT_SECRET)
    value = b'{"type":"step"}'
    sig = EventSigner(event_key(AGENT_SECRET, "run-a")).sign(value)
    assert verifier.check("run-a", value, sig) is None
    assert verifier.check("run-b", value, sig) == "bad_signature"  # run a's key signs nothing for run b
    assert verifier.check("run-a", value + b" ", sig) == "bad_signature"
    assert verifier.check("run-a", value, None) == "unsigned"
    assert verifier.check("run-a", value, b"") == "unsigned"


def test_an_agent_signs_with_the_event_key_it_was_given_or_derives_one():
    run_key = event_key(AGENT_SECRET, "run-a")
    given = agent_event_signer("run-a", {"CLIFFGUARD_EVENT_KEY": run_key.hex()})
    derived = agent_event_signer("run-a", {"CLIFFGUARD_AGENT_SECRET": AGENT_SECRET.decode()})
    assert given.sign(b"x") == derived.sign(b"x") == EventSigner(run_key).sign(b"x")
    assert agent_event_signer("run-a", {}) is None


def test_scrub_keys_removes_every_key_variable():
    env = {"PATH": "/bin", "CLIFFGUARD_COMMAND_SECRET": "s", "CLIFFGUARD_AGENT_SECRET_FILE": "/k",
           "CLIFFGUARD_COMMAND_PRIVATE_KEY": "p", "CLIFFGUARD_EVENT_KEY": "e", "CLIFFGUARD_LOG_LEVEL": "INFO"}
    assert scrub_keys(env) == {"PATH": "/bin", "CLIFFGUARD_LOG_LEVEL": "INFO"}
