"""The suspect-node list's pure part (core/admission.py): a launcher admits or refuses its node from
the entries it read; only entries the controller's key signed count, the newest per node."""

from __future__ import annotations

import json

import pytest

from cliffguard.core.admission import (
    REFUSED_EXIT,
    AdmissionConfig,
    cleared_entry,
    decide,
    device_entry,
    devices_line,
    encode_entry,
    read_board,
    refusal_line,
    suspect_entry,
)
from cliffguard.core.keys import CommandPrivateKey
from cliffguard.core.signing import Secret

PRIVATE = CommandPrivateKey.generate()
PUBLIC = PRIVATE.public_key()
T0 = 1_700_000_000.0


def sus(node: str, at: float = T0, **kw) -> dict:
    return suspect_entry(node, cause=kw.get("cause", "bad_rank"), reason=kw.get("reason", "rank 3 bad"),
                         since=kw.get("since", T0 - 60), run="run-a", incident="i1", record=7, at=at)


def rec(entry: dict, key=PRIVATE) -> tuple[bytes, bytes]:
    return entry["node"].encode(), encode_entry(entry, key)


def test_a_suspect_node_is_refused_and_the_line_names_node_cause_reason_and_the_clear_command():
    board = read_board([rec(sus("node-b")), rec(cleared_entry("node-c", at=T0))], PUBLIC)
    v = decide(board, "node-b")
    assert not v.admitted and v.entry is not None and v.entry["record"] == 7
    line = refusal_line(v)
    for part in ("node node-b", "bad_rank", "rank 3 bad", "cliffguard nodes clear node-b --reason",
                 f"exit {REFUSED_EXIT}", "run run-a", "incident i1"):
        assert part in line
    assert decide(board, "node-c").admitted  # cleared (or on probation)
    assert decide(board, "node-z").admitted and decide(board, "node-z").entry is None  # never on the list
    assert board.ignored == 0 and board.records == 2


def test_the_newest_entry_per_node_decides_and_a_replayed_old_clear_loses():
    clear_old = rec(cleared_entry("node-b", at=T0 - 100))
    refuse = rec(sus("node-b", at=T0))
    assert not decide(read_board([refuse, clear_old], PUBLIC), "node-b").admitted  # replayed after: older loses
    assert decide(read_board([refuse, rec(cleared_entry("node-b", at=T0 + 5))], PUBLIC), "node-b").admitted
    same = [rec(sus("node-b", at=T0)), rec(cleared_entry("node-b", at=T0))]
    assert decide(read_board(same, PUBLIC), "node-b").admitted  # a tie: the later record


def test_unsigned_forged_and_malformed_entries_are_ignored_and_named():
    other = CommandPrivateKey.generate()
    unsigned = (b"node-b", json.dumps(cleared_entry("node-b", at=T0 + 9)).encode())
    forged = rec(cleared_entry("node-b", at=T0 + 9), key=other)
    tampered_doc = json.loads(encode_entry(sus("node-b", at=T0 + 9), PRIVATE))
    tampered_doc["state"] = "cleared"
    tampered = (b"node-b", json.dumps(tampered_doc).encode())
    hmac_signed = rec(cleared_entry("node-b", at=T0 + 9), key=Secret("a-shared-secret-of-length"))
    wrong_key = (b"node-x", encode_entry(cleared_entry("node-b", at=T0 + 9), PRIVATE))  # moved to another key
    records = [rec(sus("node-b")), unsigned, forged, tampered, hmac_signed, wrong_key, (b"node-b", None),
               (b"node-b", b"\xff not json"), (b"node-b", b"[1]")]
    board = read_board(records, PUBLIC)
    assert not decide(board, "node-b").admitted  # only the one good entry counts
    assert decide(board, "node-x").admitted
    assert board.ignored == 8 and board.records == 9
    text = " | ".join(board.problems)
    for why in ("unsigned entry", "bad signature", "tombstone", "not JSON", "not a JSON object",
                "does not match the signed node"):
        assert why in text


def test_the_hmac_fallback_signs_and_verifies_too():
    secret = Secret("a-shared-secret-of-length")
    board = read_board([rec(sus("node-b"), key=secret)], secret)
    assert not decide(board, "node-b").admitted and board.ignored == 0
    assert read_board([rec(sus("node-b"), key=Secret("another-secret-of-length"))], secret).ignored == 1


def test_the_config_declares_its_bounds():
    assert AdmissionConfig().enabled and AdmissionConfig().timeout_s == 5.0
    with pytest.raises(ValueError, match="timeout_s"):
        AdmissionConfig(timeout_s=0)


def _dev(slot, **kw) -> dict:
    return device_entry(slot, cause=kw.get("cause", "sdc_again_device"), reason=kw.get("reason", "checksum differs"),
                        since=T0 - 30, run="run-a", incident="i2", record=9)


def test_an_admitted_nodes_suspect_device_slots_are_read_by_slot_and_named_in_its_line():
    board = read_board([rec(cleared_entry("node-a", at=T0, devices=[_dev(3), _dev(1)]))], PUBLIC)
    v = decide(board, "node-a")
    assert v.admitted and [d["slot"] for d in v.devices_out] == [1, 3]
    line = devices_line(v, kept=(0, 2))
    for part in ("WARNING", "node node-a admitted without device slot(s) 1 (sdc_again_device, run run-a: checksum "
                 "differs), 3", "starting 2 process(es) on slot(s) 0, 2", "cliffguard nodes clear node-a"):
        assert part in line, line
    refused = devices_line(v, kept=())
    assert f"exit {REFUSED_EXIT}" in refused and "every device slot of node node-a" in refused
    assert "devices" not in cleared_entry("node-a", at=T0)  # no devices: the entry reads as before


def test_device_items_that_are_not_whole_slots_are_left_aside_and_a_refused_node_has_none():
    junk = [_dev(0), {"slot": -1}, {"slot": True}, {"slot": "2"}, {"slot": 1.0}, "3", {"cause": "x"}]
    v = decide(read_board([rec(cleared_entry("node-a", at=T0, devices=junk))], PUBLIC), "node-a")
    assert [d["slot"] for d in v.devices_out] == [0]
    not_a_list = decide(read_board([rec({**cleared_entry("node-a", at=T0), "devices": {"slot": 1}})], PUBLIC), "node-a")
    assert not_a_list.devices_out == ()
    assert decide(read_board([rec({**sus("node-b"), "devices": [_dev(1)]})], PUBLIC), "node-b").devices_out == ()
