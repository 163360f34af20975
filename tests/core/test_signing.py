"""Command signing: a valid command passes once; each kind of refusal has its own reason."""

from __future__ import annotations

import dataclasses
import logging

import pytest

from cliffguard.core.events import decode_command, encode_command, make_command
from cliffguard.core.keys import CommandPrivateKey
from cliffguard.core.signing import CommandVerifier, Rejection, Secret, sign_command

SECRET = Secret("s3cret-s3cret-s3cret")


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _signed(run="run-1", ctype="rollback", args=None, now=1000.0, ttl=60.0, secret=SECRET):
    args = {"to_step": 10, "lr_scale": 0.5} if args is None and ctype == "rollback" else (args or {})
    return sign_command(make_command(ctype, run, args, ttl_s=ttl, now=now), secret)


def test_valid_command_is_accepted_after_a_wire_round_trip():
    v = CommandVerifier("run-1", SECRET, clock=Clock(1010.0))
    cmd = decode_command(encode_command(_signed()))
    assert v.verify(cmd).ok


def test_bad_signature_tampered_args():
    v = CommandVerifier("run-1", SECRET, clock=Clock(1010.0))
    cmd = _signed()
    tampered = dataclasses.replace(cmd, args={**cmd.args, "lr_scale": 50.0})
    res = v.verify(tampered)
    assert not res.ok and res.reason is Rejection.BAD_SIGNATURE


def test_bad_signature_other_secret_and_unsigned():
    v = CommandVerifier("run-1", SECRET, clock=Clock(1010.0))
    assert v.verify(_signed(secret=Secret("another-secret-of-16"))).reason is Rejection.BAD_SIGNATURE
    assert v.verify(make_command("pause", "run-1", now=1000.0)).reason is Rejection.BAD_SIGNATURE


def test_extending_the_expiry_breaks_the_signature():
    v = CommandVerifier("run-1", SECRET, clock=Clock(2000.0))
    cmd = _signed()
    res = v.verify(dataclasses.replace(cmd, expires_at=9999.0))
    assert res.reason is Rejection.BAD_SIGNATURE


def test_other_run():
    v = CommandVerifier("run-1", SECRET, clock=Clock(1010.0))
    res = v.verify(_signed(run="run-2"))
    assert not res.ok and res.reason is Rejection.OTHER_RUN and "run-2" in res.detail


def test_expired():
    v = CommandVerifier("run-1", SECRET, clock=Clock(1061.0))
    res = v.verify(_signed(ttl=60))
    assert not res.ok and res.reason is Rejection.EXPIRED and "expired" in res.detail


def test_replayed_id_is_refused_the_second_time():
    v = CommandVerifier("run-1", SECRET, clock=Clock(1010.0))
    cmd = _signed()
    assert v.verify(cmd).ok
    res = v.verify(cmd)
    assert not res.ok and res.reason is Rejection.REPLAYED and cmd.id in res.detail


def test_refused_commands_are_not_remembered_as_seen():
    clock = Clock(2000.0)
    v = CommandVerifier("run-1", SECRET, clock=clock)
    cmd = _signed(ttl=60)
    assert v.verify(cmd).reason is Rejection.EXPIRED
    clock.now = 1010.0
    assert v.verify(cmd).ok  # the expired attempt did not burn the id


def test_replay_memory_survives_state_dict():
    v = CommandVerifier("run-1", SECRET, clock=Clock(1010.0))
    cmd = _signed()
    assert v.verify(cmd).ok
    restored = CommandVerifier("run-1", SECRET, clock=Clock(1010.0))
    restored.load_state_dict(v.state_dict())
    assert restored.verify(cmd).reason is Rejection.REPLAYED


def test_signature_is_stable_across_key_order():
    cmd = _signed(args={"to_step": 10, "lr_scale": 0.5})
    again = dataclasses.replace(cmd, args={"lr_scale": 0.5, "to_step": 10})
    assert CommandVerifier("run-1", SECRET, clock=Clock(1010.0)).verify(again).ok


def test_secret_never_appears_in_repr_str_or_logs(caplog):
    raw = "super-secret-value-123"
    s = Secret(raw)
    assert raw not in repr(s) and raw not in str(s) and raw not in f"{s}"
    v = CommandVerifier("run-1", s)
    assert raw not in repr(v.__dict__)
    with caplog.at_level(logging.DEBUG):
        logging.getLogger("t").info("secret is %s / %r", s, s)
    assert raw not in caplog.text


def test_short_secret_is_refused():
    with pytest.raises(ValueError, match="16 bytes"):
        Secret("short")


# -- Ed25519: the controller holds the private key, trainers only the public key -------------

PRIVATE = CommandPrivateKey.generate()
PUBLIC = PRIVATE.public_key()


def test_ed25519_signed_command_verifies_with_the_public_key_after_a_wire_round_trip():
    cmd = decode_command(encode_command(_signed(secret=PRIVATE)))
    assert cmd.sig.startswith("ed25519:")
    assert CommandVerifier("run-1", PUBLIC, clock=Clock(1010.0)).verify(cmd).ok


@pytest.mark.parametrize("tamper", [
    {"args": {"to_step": 0, "lr_scale": 0.5}}, {"run": "run-2"}, {"expires_at": 99_999.0}, {"type": "pause"},
])
def test_ed25519_tampered_command_is_refused(tamper):
    cmd = dataclasses.replace(_signed(secret=PRIVATE), **tamper)
    r = CommandVerifier(cmd.run, PUBLIC, clock=Clock(1010.0)).verify(cmd)
    assert (r.ok, r.reason) == (False, Rejection.BAD_SIGNATURE)


def test_ed25519_wrong_key_and_garbage_signatures_are_refused():
    v = CommandVerifier("run-1", PUBLIC, clock=Clock(1010.0))
    other = _signed(secret=CommandPrivateKey.generate())
    assert v.verify(other).reason == Rejection.BAD_SIGNATURE
    for sig in ("ed25519:", "ed25519:zz", "ed25519:" + "00" * 64, ""):
        assert v.verify(dataclasses.replace(_signed(secret=PRIVATE), sig=sig)).reason == Rejection.BAD_SIGNATURE


def test_with_a_public_key_an_hmac_signed_command_is_refused_even_with_the_right_secret():
    """The transition: once trainers hold the public key, the shared HMAC secret signs nothing."""
    hmac_signed = _signed(secret=SECRET)
    assert CommandVerifier("run-1", SECRET, clock=Clock(1010.0)).verify(hmac_signed).ok  # HMAC-only still works
    r = CommandVerifier("run-1", PUBLIC, clock=Clock(1010.0)).verify(hmac_signed)
    assert (r.ok, r.reason) == (False, Rejection.BAD_SIGNATURE)
    # and an HMAC verifier does not take an Ed25519 signature
    assert CommandVerifier("run-1", SECRET, clock=Clock(1010.0)).verify(_signed(secret=PRIVATE)).reason == \
        Rejection.BAD_SIGNATURE


def test_private_key_never_appears_in_repr_or_str():
    pem = PRIVATE.pem().decode()
    body = "".join(pem.splitlines()[1:-1])
    for text in (repr(PRIVATE), str(PRIVATE), repr(PUBLIC)):
        assert body not in text and "SHA256:" in text
