"""Standard Webhooks signing and receiver-side verification."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest

from cliffguard.controller.alerts.webhook_signing import (
    WebhookVerificationError,
    secret_key,
    sign,
    signed_headers,
    verify,
)

# The Standard Webhooks specification's published test vector.
SPEC_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
SPEC_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
SPEC_TS = 1614265330
SPEC_BODY = b'{"test": 2432232314}'
SPEC_SIG = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def test_reproduces_the_specification_test_vector():
    assert sign(SPEC_SECRET, SPEC_ID, SPEC_TS, SPEC_BODY) == SPEC_SIG


def test_whsec_secret_is_base64_decoded_and_raw_strings_are_bytes():
    assert secret_key(SPEC_SECRET) == base64.b64decode("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
    assert secret_key("plain shared password") == b"plain shared password"
    raw_sig = sign("plain shared password", "msg_1", 10, b"{}")
    expected = hmac.new(b"plain shared password", b"msg_1.10.{}", hashlib.sha256).digest()
    assert raw_sig == "v1," + base64.b64encode(expected).decode()


def test_malformed_whsec_secret_is_refused():
    with pytest.raises(ValueError, match="^secret: "):
        secret_key("whsec_not base64!")


def test_receiver_accepts_what_the_sender_signed():
    headers = signed_headers(SPEC_SECRET, "msg_a", 1000, b'{"x":1}')
    assert verify(SPEC_SECRET, headers, b'{"x":1}', now=1010) == "msg_a"


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"body": b'{"x":2}'}, "no matching signature"),
        ({"secret": "whsec_c29tZS1vdGhlci1zZWNyZXQtdmFsdWUtMTIz"}, "no matching signature"),
        ({"now": 1000 + 301}, "outside the tolerance"),
        ({"now": 1000 - 301}, "outside the tolerance"),
        ({"headers": {"webhook-id": "msg_b"}}, "no matching signature"),
        ({"headers": {"webhook-timestamp": "1001"}}, "no matching signature"),
        ({"headers": {"webhook-timestamp": "soon"}}, "not an integer"),
        ({"drop": "webhook-signature"}, "missing header"),
    ],
)
def test_receiver_refuses_tampered_or_stale_messages(change, why):
    headers = signed_headers(SPEC_SECRET, "msg_a", 1000, b'{"x":1}')
    headers.update(change.get("headers", {}))
    headers.pop(change.get("drop", ""), None)
    with pytest.raises(WebhookVerificationError, match=why):
        verify(change.get("secret", SPEC_SECRET), headers, change.get("body", b'{"x":1}'), now=change.get("now", 1000))


def test_any_of_several_signatures_may_match_during_key_rotation():
    old = sign("old-secret-value-123", "msg_a", 1000, b"{}")
    new = sign(SPEC_SECRET, "msg_a", 1000, b"{}")
    headers = {"Webhook-Id": "msg_a", "Webhook-Timestamp": "1000", "Webhook-Signature": f"{old} {new}"}
    assert verify(SPEC_SECRET, headers, b"{}", now=1000) == "msg_a"
    assert verify("old-secret-value-123", headers, b"{}", now=1000) == "msg_a"
