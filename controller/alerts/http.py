"""The one HTTP edge: POST bytes, get a status. Injectable, so unit tests use a fake poster.

A poster returns ``HttpResponse`` for any HTTP status (urllib's HTTPError included) and raises
``OSError`` for transport failures (refused, reset, timeout, DNS); the deliverer retries those.
Redirects are not followed: a webhook receiver answering 3xx is misconfigured, and following
it would resend a signed body (and a credential-bearing URL's secrets) somewhere else.
"""

from __future__ import annotations

import email.utils
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class HttpResponse:
    status: int
    retry_after_s: float | None = None
    detail: str = ""
    """Start of the response body (for last_error); receivers do not echo our secrets."""


class HttpPost(Protocol):
    def __call__(self, url: str, body: bytes, headers: Mapping[str, str], timeout_s: float) -> HttpResponse: ...


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError):
        return None
    return max(0.0, when - (time.time() if now is None else now))


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: ANN001 - urllib's signature
        return None


_OPENER = urllib.request.build_opener(_NoRedirect)


def urllib_post(url: str, body: bytes, headers: Mapping[str, str], timeout_s: float) -> HttpResponse:
    request = urllib.request.Request(url, data=body, headers=dict(headers), method="POST")
    try:
        with _OPENER.open(request, timeout=timeout_s) as resp:
            return HttpResponse(resp.status, detail=resp.read(200).decode("utf-8", "replace"))
    except urllib.error.HTTPError as exc:
        try:
            detail = exc.read(200).decode("utf-8", "replace")
        except OSError:
            detail = ""
        return HttpResponse(exc.code, parse_retry_after(exc.headers.get("Retry-After")), detail)
    except urllib.error.URLError as exc:
        # URLError's str() can carry the URL on some paths; keep only the reason.
        raise ConnectionError(f"{type(exc.reason).__name__}: {exc.reason}") from None
