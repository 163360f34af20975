"""Checkpoints: newest step first, by kind, verified only."""

from __future__ import annotations

from cliffguard.controller.store import read
from cliffguard.controller.store.db import session_scope


def test_checkpoints(decisions):
    with session_scope(decisions) as s:
        assert [(c["step"], c["kind"]) for c in read.checkpoints(s, "r")] == [(50, "memory"), (40, "full")]
        assert [c["step"] for c in read.checkpoints(s, "r", verified_only=True)] == [40]
        assert [c["step"] for c in read.checkpoints(s, "r", kind="memory")] == [50]
