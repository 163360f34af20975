"""Command signing: Ed25519 (the controller's private key) or, as a fallback, HMAC-SHA256.

The signed message is the canonical JSON of every command field except ``sig`` (sorted keys, no
whitespace, non-finite floats as strings). With Ed25519 keys (``core/keys.py``) ``sig`` is
``ed25519:<hex>`` and a trainer holds only the public key. Without them it is the hex HMAC-SHA256
under a shared secret (``CLIFFGUARD_COMMAND_SECRET``), which every trainer also holds and so
could forge commands with: the deployment warns about it (``core/deployment.py``). A verifier
given a public key refuses HMAC signatures. No key appears in logs: ``Secret`` and the key
classes hide their bytes in reprs.

A trainer obeys a command only if it is for its run, correctly signed, not expired and not seen
before. ``CommandVerifier.verify`` returns the reason for each rejection separately so the ack
can say which it was.

The same scheme signs the suspect-node list the controller publishes for launchers
(``core/admission.py``): ``sign_payload`` / ``payload_signature_ok`` over a payload's canonical JSON.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections import OrderedDict
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from cliffguard.core.events import Command
from cliffguard.core.floats import canonical_json
from cliffguard.core.keys import CommandPrivateKey, CommandPublicKey


class Secret:
    """A shared secret whose value never appears in logs, reprs or tracebacks."""

    __slots__ = ("_value",)

    def __init__(self, value: str | bytes) -> None:
        raw = value.encode() if isinstance(value, str) else bytes(value)
        if len(raw) < 16:
            raise ValueError("command secret: must be at least 16 bytes")
        self._value = raw

    def reveal(self) -> bytes:
        return self._value

    def __repr__(self) -> str:
        return "Secret('********')"

    __str__ = __repr__


SigningKey = Secret | CommandPrivateKey
"""What signs commands: the Ed25519 private key, or the shared HMAC secret (the fallback)."""
VerifyingKey = Secret | CommandPublicKey
"""What checks them: the Ed25519 public key, or the shared HMAC secret."""


def signature(cmd: Command, secret: SigningKey) -> str:
    message = canonical_json(cmd.unsigned_dict())
    if isinstance(secret, CommandPrivateKey):
        return secret.sign(message)
    return hmac.new(secret.reveal(), message, hashlib.sha256).hexdigest()


def signature_ok(cmd: Command, key: VerifyingKey) -> bool:
    if isinstance(key, CommandPublicKey):
        return key.verify(cmd.sig, canonical_json(cmd.unsigned_dict()))
    return hmac.compare_digest(cmd.sig, signature(cmd, key))


def sign_payload(payload: dict[str, Any], secret: SigningKey) -> str:
    """The signature of ``payload`` (a JSON object without its ``sig``), as a command's is made."""
    message = canonical_json(payload)
    if isinstance(secret, CommandPrivateKey):
        return secret.sign(message)
    return hmac.new(secret.reveal(), message, hashlib.sha256).hexdigest()


def payload_signature_ok(payload: dict[str, Any], sig: str, key: VerifyingKey) -> bool:
    """Whether ``sig`` signs ``payload`` under ``key`` (a public key refuses HMAC signatures)."""
    if not isinstance(sig, str) or not sig or not sig.isascii():
        return False
    if isinstance(key, CommandPublicKey):
        return key.verify(sig, canonical_json(payload))
    return hmac.compare_digest(sig, sign_payload(payload, key))


def sign_command(cmd: Command, secret: SigningKey) -> Command:
    return Command(
        type=cmd.type,
        run=cmd.run,
        args=cmd.args,
        issued_at=cmd.issued_at,
        expires_at=cmd.expires_at,
        id=cmd.id,
        sig=signature(cmd, secret),
        v=cmd.v,
    )


class Rejection(StrEnum):
    BAD_SIGNATURE = "bad_signature"
    OTHER_RUN = "other_run"
    EXPIRED = "expired"
    REPLAYED = "replayed"


@dataclass(frozen=True, slots=True)
class VerifyResult:
    ok: bool
    reason: Rejection | None = None
    detail: str = ""


class CommandVerifier:
    """Checks commands for one run; remembers the ids it accepted to refuse replays.

    The memory of seen ids is bounded (``max_seen``, oldest forgotten first); a command older
    than its expiry is refused anyway, so ids only need remembering for a command's lifetime.
    """

    def __init__(self, run: str, secret: VerifyingKey, *, max_seen: int = 10_000, clock=time.time) -> None:
        self.run = run
        self._secret = secret
        self._seen: OrderedDict[str, float] = OrderedDict()
        self._max_seen = max_seen
        self._clock = clock

    def verify(self, cmd: Command) -> VerifyResult:
        if not signature_ok(cmd, self._secret):
            return VerifyResult(False, Rejection.BAD_SIGNATURE, "signature does not match")
        if cmd.run != self.run:
            return VerifyResult(False, Rejection.OTHER_RUN, f"command is for run {cmd.run!r}, not {self.run!r}")
        now = self._clock()
        if now > cmd.expires_at:
            return VerifyResult(False, Rejection.EXPIRED, f"expired {now - cmd.expires_at:.1f}s ago")
        if cmd.id in self._seen:
            return VerifyResult(False, Rejection.REPLAYED, f"command {cmd.id} was already accepted")
        self._seen[cmd.id] = cmd.expires_at
        while len(self._seen) > self._max_seen:
            self._seen.popitem(last=False)
        return VerifyResult(True)

    def state_dict(self) -> dict[str, Any]:
        return {"seen": list(self._seen.items())}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._seen = OrderedDict((k, float(v)) for k, v in state["seen"])
