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

Atomic appends: a batch is written with unbuffered writes and indexed only once all of it is on
the file; a failed write (a full disk: ``OSError``) truncates the file back to its size before the
append, so no partial or phantom record is left and the next append after the disk recovers starts
on a record boundary. The failed records are reported as not written (the caller counts them).

CRC on replay: ``peek`` checks every record's CRC; a record failing it is skipped, counted in
``corrupt_records`` and never delivered, and reading goes on with the next record. A record whose
on-disk length no longer matches the index (the framing itself is damaged) ends the readable part:
the file is cut there, the rest is counted as corrupt and the loss is logged.

Crash recovery: a spill file left by an earlier process is read on open and its records are
replayed first (duplicates of events already delivered are possible; consumers deduplicate by
event id). A torn record at the tail (crash mid-write) ends the readable part; the file is
truncated there and the loss is logged.

Naming (``spill_path``): one file per process and start, ``cliffguard-spill-<run>-r<rank>-<instance>.bin``
in the per-user directory ``<tmp>/cliffguard-spill-<euid>`` (``default_spill_dir``) unless the
run names one. ``instance`` is a fresh id per ``Agent`` (per start of a process), so a new start
never opens an earlier start's file: a stale file of an earlier run that reused the run id is
never replayed into the new run as if its events were new. Decision: earlier instances' files are
not replayed at all (their events would arrive mixed into the new instance's stream with nothing
to tell them apart); ``stale_spills`` finds them and the agent names them in one warning at start,
so an operator can inspect them (each is a plain spill file: ``SpillFile(path, ...).peek``).

Private file: the spill's directory is created with mode 0700 and refused when it is a symlink or
owned by another user; the file is opened with ``O_NOFOLLOW`` (mode 0600), so a link planted at
the spill path is refused instead of its target being truncated.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import struct
import time
import zlib
from collections import deque
from pathlib import Path

log = logging.getLogger(__name__)

_HEADER = struct.Struct(">II")


def default_spill_dir() -> str:
    """The per-user spill directory; ``_private_dir`` refuses it if another user owns it."""
    import tempfile

    return os.path.join(tempfile.gettempdir(), f"cliffguard-spill-{os.geteuid()}")


def spill_path(directory: str | Path, run: str, rank: int, instance: str) -> Path:
    """The spill file of one process start (see the module docstring's naming)."""
    return Path(directory) / f"cliffguard-spill-{run}-r{rank}-{instance}.bin"


def stale_spills(directory: str | Path, run: str, rank: int, instance: str) -> list[Path]:
    """Non-empty spill files an earlier start of ``run`` on ``rank`` left in ``directory`` (never
    replayed into this instance), plus the pre-instance name ``cliffguard-spill-<run>-r<rank>.bin``."""
    d = Path(directory)
    if not d.is_dir():
        return []
    mine = spill_path(d, run, rank, instance).name
    found = sorted(d.glob(f"cliffguard-spill-{run}-r{rank}-*.bin")) + [d / f"cliffguard-spill-{run}-r{rank}.bin"]
    out = []
    for f in found:
        try:
            if f.name != mine and f.is_file() and not f.is_symlink() and f.stat().st_size > 0:
                out.append(f)
        except OSError:
            continue
    return out


def _write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to ``fd`` (os.write may write less than asked)."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _private_dir(path: Path) -> None:
    """Create ``path`` with mode 0700, or refuse an existing one a planted link or user controls."""
    try:
        path.mkdir(mode=0o700, parents=True)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise ValueError(f"spill_path: directory {path} is a symlink; refusing it")
    if not stat.S_ISDIR(st.st_mode):
        raise ValueError(f"spill_path: {path} is not a directory")
    if st.st_uid != os.geteuid():
        raise ValueError(f"spill_path: directory {path} is owned by uid {st.st_uid}, not by this user")


def _open_private(path: Path, flags: int) -> int:
    """Open ``path`` (mode 0600) without following a link at it; refuse anything but a regular file."""
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ValueError(f"spill_path: {path} is a symlink; refusing to follow it") from exc
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        os.close(fd)
        raise ValueError(f"spill_path: {path} is not a regular file owned by this user")
    return fd


class SpillFile:
    """Append-only record file with a read cursor. Not thread-safe: one owner thread."""

    def __init__(self, path: str | Path, max_bytes: int, *, fsync_interval_s: float = 1.0) -> None:
        if max_bytes < _HEADER.size + 1:
            raise ValueError("spill_max_bytes: too small to hold a record")
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.fsync_interval_s = fsync_interval_s
        _private_dir(self.path.parent)
        self._fd = _open_private(self.path, os.O_RDWR | os.O_APPEND)
        self.corrupt_records = 0  # skipped on replay: failed their CRC or lost to bad framing
        self.write_errors = 0  # appends that failed (disk full) and were rolled back
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
        """Append one record; False (and nothing written) if it would cross ``max_bytes`` or fails."""
        return self.append_many([payload]) == 1

    def append_many(self, payloads: list[bytes]) -> int:
        """Append records in order with one write; stops at the first that would cross the bound.

        Returns how many were written (a prefix of ``payloads``); the caller counts the rest. A
        failed write (``OSError``, e.g. a full disk) writes none of them and returns 0.
        """
        parts: list[bytes] = []
        sizes: list[int] = []
        pending = self.pending_bytes
        for payload in payloads:
            size = _HEADER.size + len(payload)
            if pending + size > self.max_bytes:
                break
            parts.append(_HEADER.pack(len(payload), zlib.crc32(payload)))
            parts.append(payload)
            sizes.append(size)
            pending += size
        if not parts:
            return 0
        blob = b"".join(parts)
        try:
            _write_all(self._fd, blob)  # O_APPEND: lands at the end of the file
        except OSError as exc:
            self._roll_back_append(exc, len(sizes))
            return 0
        self._end += len(blob)
        self._sizes.extend(sizes)
        self._dirty = True
        self._maybe_fsync()
        return len(sizes)

    def _roll_back_append(self, exc: OSError, n: int) -> None:
        """Cut a partly written batch so the file ends on the last whole, indexed record."""
        self.write_errors += 1
        try:
            os.ftruncate(self._fd, self._end)
        except OSError as cut_exc:  # the index stays right; recovery on open cuts the torn tail
            log.error("spill %s: could not cut a failed append back to %d bytes: %s", self.path, self._end, cut_exc)
        if self.write_errors == 1 or self.write_errors % 1000 == 0:
            log.warning("spill %s: append of %d events failed (%s); not spilled (%d failed appends so far)",
                        self.path, n, exc, self.write_errors)

    def _maybe_fsync(self, force: bool = False) -> None:
        if not self._dirty:
            return
        now = time.monotonic()
        if force or now - self._last_fsync >= self.fsync_interval_s:
            os.fsync(self._fd)
            self._last_fsync = now
            self._dirty = False

    # -- reading -------------------------------------------------------------------------------

    def peek(self, max_records: int) -> list[bytes]:
        """Up to ``max_records`` of the oldest unread payloads, without consuming them.

        A corrupt record at the head is consumed and counted here (never returned); one behind
        good records ends the batch, so ``consume(len(result))`` still names exactly the good ones.
        """
        out: list[bytes] = []
        while len(out) < min(max_records, len(self._sizes)):
            n = min(max_records, len(self._sizes)) - len(out)
            offset = self._read_pos + sum(self._sizes[i] for i in range(len(out)))
            blob = os.pread(self._fd, sum(self._sizes[len(out) + i] for i in range(n)), offset)
            pos = 0
            for i in range(len(out), len(out) + n):
                size = self._sizes[i]
                if len(blob) < pos + size or _HEADER.unpack_from(blob, pos)[0] != size - _HEADER.size:
                    self._cut_at(offset + pos, i)
                    return out
                length, crc = _HEADER.unpack_from(blob, pos)
                payload = blob[pos + _HEADER.size : pos + size]
                if zlib.crc32(payload) != crc:
                    if out:
                        return out  # the bad record becomes the head of the next peek
                    self.corrupt_records += 1
                    log.error("spill %s: record at offset %d fails its CRC; skipped (%d so far)",
                              self.path, offset + pos, self.corrupt_records)
                    self.consume(1)
                    break
                out.append(payload)
                pos += size
        return out

    def _cut_at(self, offset: int, index: int) -> None:
        """Damaged framing at record ``index`` (file ``offset``): nothing from there on is readable."""
        lost = len(self._sizes) - index
        self.corrupt_records += lost
        log.error("spill %s: damaged record framing at offset %d; %d records lost", self.path, offset, lost)
        for _ in range(lost):
            self._sizes.pop()
        os.ftruncate(self._fd, offset)
        self._end = offset
        if not self._sizes:
            self._reset()

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
        os.ftruncate(self._fd, 0)
        self._read_pos = 0
        self._end = 0

    def _compact(self) -> None:
        """Copy the unread tail to a fresh file so the delivered prefix stops using disk."""
        tail = os.pread(self._fd, self._end - self._read_pos, self._read_pos)
        tmp = self.path.with_name(self.path.name + ".compact")
        out = _open_private(tmp, os.O_WRONLY | os.O_TRUNC)
        try:
            _write_all(out, tail)
            os.fsync(out)
        finally:
            os.close(out)
        os.replace(tmp, self.path)
        os.close(self._fd)
        self._fd = _open_private(self.path, os.O_RDWR | os.O_APPEND)
        self._read_pos = 0
        self._end = len(tail)

    def _recover(self) -> None:
        """Index the records an earlier process left behind; cut a torn tail.

        CRCs are checked when the records are read back (``peek``), where a bad one is skipped."""
        data = os.pread(self._fd, os.fstat(self._fd).st_size, 0)
        pos = 0
        while pos + _HEADER.size <= len(data):
            length, _crc = _HEADER.unpack_from(data, pos)
            end = pos + _HEADER.size + length
            if end > len(data):
                break
            self._sizes.append(end - pos)
            pos = end
        if pos != len(data):
            log.warning("spill %s: cut %d unreadable bytes at offset %d (torn write or corruption)",
                        self.path, len(data) - pos, pos)
            os.ftruncate(self._fd, pos)
        self._end = pos
        if self._sizes:
            log.warning("spill %s: %d events from an earlier process will be replayed", self.path, len(self._sizes))

    def close(self) -> None:
        if self._fd < 0:
            return
        try:
            self._maybe_fsync(force=True)
        finally:
            os.close(self._fd)
            self._fd = -1
