"""The mark table: every event type either books time or says it does not; every row is reachable."""

from __future__ import annotations

from cliffguard.controller.goodput.marks import MARKS, NOT_MARKS, mark_key
from cliffguard.core.enums import AckStatus, CheckpointKind, CommandType, EventType
from testing.goodput_script import Script


def test_every_event_type_is_a_mark_or_declared_not_to_be_one():
    keys = {k.split(":")[0] for k in MARKS}
    for t in EventType:
        assert str(t) in keys or t in NOT_MARKS, f"{t}: add a row to goodput/marks.py MARKS or to NOT_MARKS"


def test_every_ack_resolves_to_a_row():
    s = Script()
    for ctype in CommandType:
        for status in AckStatus:
            ev = s.emit("command.ack", {"cmd": "c" * 32, "cmd_type": str(ctype), "status": str(status)})
            assert mark_key(ev) in MARKS
    rollback_failed = s.emit("command.ack", {"cmd": "c" * 32, "cmd_type": "rollback", "status": "failed"})
    assert mark_key(rollback_failed) == "command.ack:rollback"


def test_disk_checkpoints_are_no_mark_but_memory_snapshots_are():
    s = Script()
    for kind in CheckpointKind:
        ev = s.emit("checkpoint", {"kind": str(kind), "path": "", "bytes": 1, "sha256": "", "seconds": 1.0,
                                   "verified": True})
        assert (mark_key(ev) is not None) == (kind is CheckpointKind.MEMORY)


def test_a_hangs_evidence_is_keyed_by_its_reason_and_the_node_check_is_a_mark():
    from tests.core.test_events import PAYLOADS

    s = Script()
    for reason in ("stalled", "collective_error", "resolved"):
        ev = s.emit("hang.evidence", {**PAYLOADS["hang.evidence"], "reason": reason})
        assert mark_key(ev) == f"hang.evidence:{reason}" and mark_key(ev) in MARKS
    assert mark_key(s.emit("node.check", PAYLOADS["node.check"])) == "node.check"
