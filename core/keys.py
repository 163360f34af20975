"""Asymmetric command keys (Ed25519) and per-run event keys.

Least privilege: the controller alone holds the command *private* key; trainers hold only its
*public* key, so a trainer host cannot forge a command for any run. Events go the other way:
each agent signs its event bytes with a per-run key, ``event_key(agent_secret, run)`` (HMAC-SHA256
of the run id under the agent secret, an HKDF-expand with one block). The controller holds the
agent secret and derives every run's key; ``cliffguard train`` hands its workers only their own
run's key (``CLIFFGUARD_EVENT_KEY``), so a trainer host can sign events for its run only.

Key material never appears in reprs or logs; a private key read from a file must be mode 0600
(no group/other bits). ``fingerprint`` names a public key for messages and config checks.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import stat
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

ED25519_PREFIX = "ed25519:"
"""A command ``sig`` made with the private key starts with this (an HMAC ``sig`` is bare hex)."""

EVENT_SIG_HEADER = "cliffguard.sig"
"""The Kafka header that carries an event's signature (hex HMAC-SHA256 of the record's value)."""

PRIVATE_FILE, PUBLIC_FILE, AGENT_SECRET_FILE = "command_ed25519.key", "command_ed25519.pub", "agent.secret"
"""File names ``generate_keys`` writes."""


def _decode_text(text: str | bytes) -> bytes:
    """PEM text as bytes, or the raw key from base64/hex text."""
    raw = text.encode() if isinstance(text, str) else bytes(text)
    return raw.strip()


def _load_private(data: bytes) -> Ed25519PrivateKey:
    if data.startswith(b"-----BEGIN"):
        key = serialization.load_pem_private_key(data, password=None)
        if not isinstance(key, Ed25519PrivateKey):
            raise ValueError("not an Ed25519 private key")
        return key
    return Ed25519PrivateKey.from_private_bytes(_raw32(data))


def _load_public(data: bytes) -> Ed25519PublicKey:
    if data.startswith(b"-----BEGIN"):
        key = serialization.load_pem_public_key(data)
        if not isinstance(key, Ed25519PublicKey):
            raise ValueError("not an Ed25519 public key")
        return key
    return Ed25519PublicKey.from_public_bytes(_raw32(data))


def _raw32(data: bytes) -> bytes:
    for decode in (bytes.fromhex, base64.b64decode):
        try:
            raw = decode(data.decode())  # type: ignore[operator]
        except ValueError:
            continue
        if len(raw) == 32:
            return raw
    raise ValueError("expected PEM, or 32 raw bytes as hex or base64")


def _public_raw(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def fingerprint(key: CommandPublicKey | CommandPrivateKey) -> str:
    """``SHA256:<first 16 hex digits>`` of the raw public key (the same for both halves)."""
    pub = key.public_key() if isinstance(key, CommandPrivateKey) else key
    return "SHA256:" + hashlib.sha256(pub.raw()).hexdigest()[:16]


class CommandPublicKey:
    """Verifies Ed25519 command signatures (what a trainer holds)."""

    __slots__ = ("_key",)

    def __init__(self, data: str | bytes | Ed25519PublicKey) -> None:
        self._key = data if isinstance(data, Ed25519PublicKey) else _load_public(_decode_text(data))

    def raw(self) -> bytes:
        return _public_raw(self._key)

    def verify(self, sig: str, message: bytes) -> bool:
        if not sig.startswith(ED25519_PREFIX):
            return False  # an HMAC signature: refused once keys are configured
        try:
            self._key.verify(bytes.fromhex(sig[len(ED25519_PREFIX):]), message)
        except (InvalidSignature, ValueError):
            return False
        return True

    def pem(self) -> bytes:
        return self._key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)

    def __repr__(self) -> str:
        return f"CommandPublicKey({fingerprint(self)})"


class CommandPrivateKey:
    """Signs commands (the controller's alone). Its bytes never appear in reprs."""

    __slots__ = ("_key",)

    def __init__(self, data: str | bytes | Ed25519PrivateKey) -> None:
        self._key = data if isinstance(data, Ed25519PrivateKey) else _load_private(_decode_text(data))

    @classmethod
    def generate(cls) -> CommandPrivateKey:
        return cls(Ed25519PrivateKey.generate())

    def public_key(self) -> CommandPublicKey:
        return CommandPublicKey(self._key.public_key())

    def sign(self, message: bytes) -> str:
        return ED25519_PREFIX + self._key.sign(message).hex()

    def pem(self) -> bytes:
        return self._key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption())

    def __repr__(self) -> str:
        return f"CommandPrivateKey({fingerprint(self)}, '********')"

    __str__ = __repr__


def read_owner_only(path: str | Path) -> bytes:
    """A secret file's bytes, refused unless only its owner may read it (mode 0600 or stricter)."""
    p = Path(path)
    mode = p.stat().st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ValueError(f"{p} is readable by group or others (mode {stat.S_IMODE(mode):o}); chmod 600 it")
    return p.read_bytes()


def read_private_file(path: str | Path) -> CommandPrivateKey:
    return CommandPrivateKey(read_owner_only(path))


def read_public_file(path: str | Path) -> CommandPublicKey:
    return CommandPublicKey(Path(path).read_bytes())


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def generate_keys(out: str | Path) -> dict[str, Path]:
    """A fresh Ed25519 command key pair and agent secret in ``out`` (created 0700 if missing);
    private files 0600, never overwritten (FileExistsError)."""
    d = Path(out)
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    paths = {"private": d / PRIVATE_FILE, "public": d / PUBLIC_FILE, "agent_secret": d / AGENT_SECRET_FILE}
    for p in paths.values():
        if p.exists():
            raise FileExistsError(f"{p} exists; not overwriting a key")
    key = CommandPrivateKey.generate()
    _write_private(paths["private"], key.pem())
    _write_private(paths["agent_secret"], os.urandom(32).hex().encode() + b"\n")
    paths["public"].write_bytes(key.public_key().pem())
    return paths


# -- events ------------------------------------------------------------------------------------

def event_key(agent_secret: bytes, run: str) -> bytes:
    """The run's event-signing key: HMAC-SHA256(agent secret, ``cliffguard-events/<run>``)."""
    return hmac.new(agent_secret, b"cliffguard-events/" + run.encode(), hashlib.sha256).digest()


class EventSigner:
    """Signs a record's value bytes with one run's key; one HMAC per record (about a microsecond
    for a step event), done on the publisher thread when the record is sent."""

    __slots__ = ("_key",)

    def __init__(self, key: bytes) -> None:
        if len(key) < 16:
            raise ValueError("event key: must be at least 16 bytes")
        self._key = bytes(key)

    def sign(self, value: bytes) -> bytes:
        return hmac.digest(self._key, value, "sha256").hex().encode()  # the one-shot C path

    def headers(self, value: bytes) -> list[tuple[str, bytes]]:
        return [(EVENT_SIG_HEADER, self.sign(value))]

    def __repr__(self) -> str:
        return "EventSigner('********')"


class EventVerifier:
    """The controller's side: derives (and caches) each run's key from the agent secret."""

    def __init__(self, agent_secret: bytes, *, max_cached: int = 10_000) -> None:
        if len(agent_secret) < 16:
            raise ValueError("agent secret: must be at least 16 bytes")
        self._secret = bytes(agent_secret)
        self._keys: dict[str, bytes] = {}
        self._max_cached = max_cached

    def check(self, run: str, value: bytes, sig: bytes | None) -> str | None:
        """None if ``sig`` is the run's signature of ``value``; else ``unsigned`` or ``bad_signature``."""
        if not sig:
            return "unsigned"
        key = self._keys.get(run)
        if key is None:
            if len(self._keys) >= self._max_cached:
                self._keys.clear()
            key = self._keys[run] = event_key(self._secret, run)
        want = hmac.digest(key, value, "sha256").hex().encode()
        return None if hmac.compare_digest(want, bytes(sig)) else "bad_signature"

    def __repr__(self) -> str:
        return "EventVerifier('********')"
