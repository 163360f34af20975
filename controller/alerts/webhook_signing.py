"""Standard Webhooks signatures (https://www.standardwebhooks.com/), sender and receiver side.

Headers::

    webhook-id:        msg_...            the same on every retry, so receivers can de-duplicate
    webhook-timestamp: 1700000000         integer seconds of *this attempt* (signed, so replays age out)
    webhook-signature: v1,<base64 HMAC-SHA256(key, "{id}.{timestamp}.{body}")>

The key: a secret written ``whsec_<base64>`` (the form the spec recommends and Svix issues) is
base64-decoded and the bytes are the key, as the spec's reference libraries do. Any other string is
used as its UTF-8 bytes, so an operator can use a plain shared password; both sides must agree.
``verify`` is what a receiver runs: several space-separated signatures are accepted (key rotation),
comparison is constant-time, and a timestamp more than ``tolerance_s`` away from now is refused.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Mapping

SECRET_PREFIX = "whsec_"
DEFAULT_TOLERANCE_S = 300.0


class WebhookVerificationError(ValueError):
    pass


def secret_key(secret: str | bytes) -> bytes:
    if isinstance(secret, bytes):
        return secret
    if secret.startswith(SECRET_PREFIX):
        try:
            return base64.b64decode(secret[len(SECRET_PREFIX):], validate=True)
        except (binascii.Error, ValueError):
            raise ValueError("secret: a whsec_ secret must be base64 after the prefix") from None
    return secret.encode()


def sign(secret: str | bytes, msg_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` header value for one attempt."""
    content = msg_id.encode() + b"." + str(int(timestamp)).encode() + b"." + body
    digest = hmac.new(secret_key(secret), content, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def signed_headers(secret: str | bytes, msg_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(timestamp)),
        "webhook-signature": sign(secret, msg_id, timestamp, body),
    }


def verify(
    secret: str | bytes,
    headers: Mapping[str, str],
    body: bytes,
    *,
    now: float,
    tolerance_s: float = DEFAULT_TOLERANCE_S,
) -> str:
    """Check a received webhook; return its ``webhook-id`` or raise ``WebhookVerificationError``."""
    lower = {k.lower(): v for k, v in headers.items()}
    try:
        msg_id = lower["webhook-id"]
        ts_text = lower["webhook-timestamp"]
        sig_header = lower["webhook-signature"]
    except KeyError as exc:
        raise WebhookVerificationError(f"missing header {exc.args[0]}") from None
    try:
        ts = int(ts_text)
    except ValueError:
        raise WebhookVerificationError("webhook-timestamp is not an integer") from None
    if abs(now - ts) > tolerance_s:
        raise WebhookVerificationError("webhook-timestamp outside the tolerance")
    expected = sign(secret, msg_id, ts, body).split(",", 1)[1]
    for candidate in sig_header.split():
        version, _, value = candidate.partition(",")
        if version == "v1" and hmac.compare_digest(value.encode(), expected.encode()):
            return msg_id
    raise WebhookVerificationError("no matching signature")
