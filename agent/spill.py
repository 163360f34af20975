"""A bounded, append-only spill file: where events wait while the broker is unreachable.

Record format (length-prefixed, so any payload bytes are allowed)::

    [4 bytes big-endian payload length][4 bytes big-endian CRC-32 of payload][payload]

Records are read back strictly in the order they were written (``peek``/``consume``), which is
what lets the publisher replay an outage in order before anything newer.

Bound: ``max_bytes`` limits the bytes *waiting* in the file (header included). ``append`` refuses
a record that would cross it and returns False; the caller counts it as dropped. Once everything
has been read back the file is truncated to zero, and when the consumed prefix alone grows past
``max_bytes`` the unread tail is copied to a fresh file (temp + rename), so the disk used stays
within about twice the bound.

Durability (fsync policy): every ``append`` writes through to the OS (a crash of this process loses
nothing already appended); the file is fsync'ed at most every ``fsync_interval_s`` seconds and on
``close`` (a power loss may lose up to that interval of spilled events). ``fsync_interval_s=0``
fsyncs every append (slow; for people who want it).

Crash recovery: a spill file left by an earlier process is read on open and its records are
replayed first (duplicates of events already delivered are possible; consumers deduplicate by
event id). A torn record at the tail (crash mid-write) or one failing its CRC ends the readable
part; the file is truncated there and the loss is logged.
"""

from __future__ import annotations

import logging
import os
import struct
import time
import zlib
from collections import deque
from pathlib import Path

log = logging.getLogger(__name__)

_HEADER = struct.Struct(">II")


class SpillFile:
    """Append-only record file with a read cursor. Not thread-safe: one owner thread."""

    def __init__(self, path: str | Path, max_bytes: int, *, fsync_interval_s: float = 1.0) -> None:
        if max_bytes < _HEADER.size + 1:
            raise ValueError("spill_max_bytes: too small to hold a record")
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.fsync_interval_s = fsync_interval_s
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(self.path, "a+b")  # noqa: SIM115 - owned for the object's lifetime
        self._read_pos = 0  # byte offset of the next unread record
        self._sizes: deque[int] = deque()  # on-disk size of each unread record, in order
        self._last_fsync = time.monotonic()
        self._dirty = False
        self._recover()

    # -- state ---------------------------------------------------------------------------------

    @property
    def pending_records(self) -> int:
        return len(self._sizes)

    @property
    def pending_bytes(self) -> int:
        return self._end - self._read_pos

    def __len__(self) -> int:
        return len(self._sizes)

    # -- writing -------------------------------------------------------------------------------

    def append(self, payload: bytes) -> bool:
        """Append one record; False (and nothing written) if it would cross ``max_bytes``."""
        size = _HEADER.size + len(payload)
        if self.pending_bytes + size > self.max_bytes:
            return False
        self._fh.seek(0, os.SEEK_END)
        self._fh.write(_HEADER.pack(len(payload), zlib.crc32(payload)) + payload)
        self._fh.flush()
        self._end += size
        self._sizes.append(size)
        self._dirty = True
        self._maybe_fsync()
        return True

    def append_many(self, payloads: list[bytes]) -> int:
        """Append records in order with one write; stops at the first that would cross the bound.

        Returns how many were written (a prefix of ``payloads``); the caller counts the rest.
        """
        parts: list[bytes] = []
        pending = self.pending_bytes
        for payload in payloads:
            size = _HEADER.size + len(payload)
            if pending + size > self.max_bytes:
                break
            parts.append(_HEADER.pack(len(payload), zlib.crc32(payload)))
            parts.append(payload)
            self._sizes.append(size)
            pending += size
        if not parts:
            return 0
        blob = b"".join(parts)
        self._fh.seek(0, os.SEEK_END)
        self._fh.write(blob)
        self._fh.flush()
        self._end += len(blob)
        self._dirty = True
        self._maybe_fsync()
        return len(parts) // 2

    def _maybe_fsync(self, force: bool = False) -> None:
        if not self._dirty:
            return
        now = time.monotonic()
        if force or now - self._last_fsync >= self.fsync_interval_s:
            os.fsync(self._fh.fileno())
            self._last_fsync = now
            self._dirty = False

    # -- reading -------------------------------------------------------------------------------

    def peek(self, max_records: int) -> list[bytes]:
        """Up to ``max_records`` of the oldest unread payloads, without consuming them."""
        n = min(max_records, len(self._sizes))
        if n == 0:
            return []
        self._fh.seek(self._read_pos)
        total = sum(self._sizes[i] for i in range(n))
        blob = self._fh.read(total)
        out = []
        pos = 0
        for _ in range(n):
            length, _crc = _HEADER.unpack_from(blob, pos)
            out.append(blob[pos + _HEADER.size : pos + _HEADER.size + length])
            pos += _HEADER.size + length
        return out

    def consume(self, n: int) -> None:
        """Mark the ``n`` oldest unread records as delivered."""
        for _ in range(n):
            self._read_pos += self._sizes.popleft()
        if not self._sizes:
            self._reset()
        elif self._read_pos > self.max_bytes:
            self._compact()

    # -- housekeeping --------------------------------------------------------------------------

    def _reset(self) -> None:
        self._fh.truncate(0)
        self._fh.flush()
        self._read_pos = 0
        self._end = 0

    def _compact(self) -> None:
        """Copy the unread tail to a fresh file so the delivered prefix stops using disk."""
        self._fh.seek(self._read_pos)
        tail = self._fh.read(self._end - self._read_pos)
        tmp = self.path.with_name(self.path.name + ".compact")
        with open(tmp, "wb") as out:
            out.write(tail)
            out.flush()
            os.fsync(out.fileno())
        self._fh.close()
        os.replace(tmp, self.path)
        self._fh = open(self.path, "a+b")  # noqa: SIM115
        self._read_pos = 0
        self._end = len(tail)

    def _recover(self) -> None:
        """Index the records an earlier process left behind; cut a torn or corrupt tail."""
        self._fh.seek(0)
        data = self._fh.read()
        pos = 0
        while pos + _HEADER.size <= len(data):
            length, crc = _HEADER.unpack_from(data, pos)
            end = pos + _HEADER.size + length
            if end > len(data) or zlib.crc32(data[pos + _HEADER.size : end]) != crc:
                break
            self._sizes.append(end - pos)
            pos = end
        if pos != len(data):
            log.warning("spill %s: cut %d unreadable bytes at offset %d (torn write or corruption)",
                        self.path, len(data) - pos, pos)
            self._fh.truncate(pos)
            self._fh.flush()
        self._end = pos
        if self._sizes:
            log.warning("spill %s: %d events from an earlier process will be replayed", self.path, len(self._sizes))

    def close(self) -> None:
        if self._fh.closed:
            return
        try:
            self._maybe_fsync(force=True)
        finally:
            self._fh.close()
