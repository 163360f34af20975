"""What a test does when a service it needs (the broker, PostgreSQL, Chromium) is missing.

In CI (``CI=true``) a missing service is a failure, not a skip: ``.ci/run`` installs and starts
every service the tiers need, so a skip there would hide a broken install step.
"""

from __future__ import annotations

import os

import pytest

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def missing(what: str) -> None:
    """Fail in CI, skip elsewhere; never returns."""
    if IN_CI:
        pytest.fail(f"{what} is required in CI (CI=true) but is not available")
    pytest.skip(f"{what} not available")
