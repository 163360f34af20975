"""Spill file faults: a full disk, corrupt records, a planted symlink (agent/spill.py)."""

from __future__ import annotations

import errno
import os

import pytest

from cliffguard.agent import spill as spill_mod
from cliffguard.agent.spill import SpillFile


def _drain(spill: SpillFile) -> list[bytes]:
    out: list[bytes] = []
    while len(spill):
        batch = spill.peek(3)
        out += batch
        spill.consume(len(batch))
    return out


def test_a_failed_write_is_rolled_back_and_replay_after_the_disk_recovers_is_exact(tmp_path, monkeypatch):
    path = tmp_path / "s.bin"
    spill = SpillFile(path, max_bytes=10_000)
    assert spill.append_many([b"ok0", b"ok1"]) == 2
    real_write = os.write
    fail = {"left": 1}

    def half_then_enospc(fd, data):  # a disk filling up mid-batch: part lands, then ENOSPC
        if fail["left"]:
            fail["left"] -= 1
            real_write(fd, bytes(data[: len(data) // 2]))
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(spill_mod.os, "write", half_then_enospc)
    assert spill.append_many([b"lost0", b"lost1", b"lost2"]) == 0
    assert spill.write_errors == 1 and len(spill) == 2
    assert path.stat().st_size == spill.pending_bytes  # no torn tail left behind
    # the disk recovered
    assert spill.append(b"ok2") and spill.append_many([b"ok3", b"ok4"]) == 2
    assert _drain(spill) == [b"ok0", b"ok1", b"ok2", b"ok3", b"ok4"]
    assert spill.corrupt_records == 0
    spill.close()


def test_a_record_with_a_flipped_byte_is_skipped_and_counted(tmp_path):
    path = tmp_path / "s.bin"
    spill = SpillFile(path, max_bytes=10_000)
    for i in range(5):
        spill.append(f"rec{i}".encode())
    data = bytearray(path.read_bytes())
    data[2 * 12 + 8 + 1] ^= 0xFF  # a payload byte of rec2 (12 bytes a record)
    path.write_bytes(bytes(data))
    assert _drain(spill) == [b"rec0", b"rec1", b"rec3", b"rec4"]
    assert spill.corrupt_records == 1
    spill.close()


def test_a_corrupt_record_left_by_an_earlier_process_is_skipped_on_replay(tmp_path):
    path = tmp_path / "s.bin"
    spill = SpillFile(path, max_bytes=10_000)
    for i in range(4):
        spill.append(f"rec{i}".encode())
    spill.close()
    data = bytearray(path.read_bytes())
    data[12 + 8] ^= 0x01  # rec1's payload
    path.write_bytes(bytes(data))
    again = SpillFile(path, max_bytes=10_000)
    assert _drain(again) == [b"rec0", b"rec2", b"rec3"] and again.corrupt_records == 1
    again.close()


def test_damaged_framing_stops_replay_there_and_reports_it(tmp_path):
    path = tmp_path / "s.bin"
    spill = SpillFile(path, max_bytes=10_000)
    for i in range(4):
        spill.append(f"rec{i}".encode())
    data = bytearray(path.read_bytes())
    data[2 * 12 + 3] ^= 0x40  # rec2's length field: nothing after it can be framed
    path.write_bytes(bytes(data))
    assert _drain(spill) == [b"rec0", b"rec1"]
    assert spill.corrupt_records == 2 and path.stat().st_size == 0
    assert spill.append(b"new") and _drain(spill) == [b"new"]
    spill.close()


def test_a_symlink_planted_at_the_spill_path_is_refused_and_its_target_untouched(tmp_path):
    target = tmp_path / "precious.txt"
    target.write_bytes(b"keep me")
    d = tmp_path / "spill"
    d.mkdir(mode=0o700)
    (d / "s.bin").symlink_to(target)
    with pytest.raises(ValueError, match="spill_path: .*symlink"):
        SpillFile(d / "s.bin", max_bytes=10_000)
    assert target.read_bytes() == b"keep me"


def test_the_spill_directory_is_private_and_a_linked_one_is_refused(tmp_path):
    SpillFile(tmp_path / "new" / "s.bin", max_bytes=10_000).close()
    assert (tmp_path / "new").stat().st_mode & 0o777 == 0o700
    assert (tmp_path / "new" / "s.bin").stat().st_mode & 0o777 == 0o600
    (tmp_path / "link").symlink_to(tmp_path / "new")
    with pytest.raises(ValueError, match="spill_path: directory .* is a symlink"):
        SpillFile(tmp_path / "link" / "s.bin", max_bytes=10_000)
