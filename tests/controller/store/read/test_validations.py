"""Validation results and flagged data samples (a non-finite score comes back as a float)."""

from __future__ import annotations

import math

from cliffguard.controller.store import read
from cliffguard.controller.store.db import session_scope


def test_flags_and_validations(decisions):
    with session_scope(decisions) as s:
        flags = read.data_flags(s, "r")
        assert [fl["rule"] for fl in flags] == ["garbled", "url_pile"] and flags[0]["score"] == math.inf
        assert [fl["rule"] for fl in read.data_flags(s, "r", limit=None)] == ["garbled", "url_pile"]
        assert [v["val_loss"] for v in read.validations(s, "r")] == [3.9]
        assert read.validations(s, "other") == []
