"""Checkpoints: an in-memory ring for fast rollback, and atomic, verified, asynchronous disk copies.

Kinds (``agent.events.CheckpointKind``):

- ``memory``: a CPU deep copy in a ring of the last ``memory_ring`` snapshots (every
  ``snapshot_every`` steps). Rollback from here costs a copy, no I/O.
- ``incremental`` (every ``ckpt_every`` steps) and ``full`` (every ``full_every`` steps): both
  hold the *complete* state the loop passes, so either one alone restores a step exactly. They
  differ in retention: incrementals are a short rolling window (newest ``keep_incremental``), full
  ones the longer-lived anchors (newest ``keep_full``). We chose not to write deltas: in dense
  training every parameter and optimizer moment changes every step, so a delta is as large as the
  state and adds a fragile dependency on its base.

Writing (``save``): on the training thread the state is copied to CPU (the only stall); a
background writer serialises the copy to ``<name>.pt.tmp`` while hashing it (sha256), fsyncs,
renames it to ``<name>.pt`` and fsyncs the directory (atomic: a reader sees the old set or the new
file, never half a file), then *verifies* it — re-reads the file, checks the sha256 and
``torch.load``s it — and only then writes the ``<name>.pt.json`` sidecar (itself temp + rename)
and reports ``verified=True``. A checkpoint without its sidecar does not exist; a writer killed at
any point leaves the previous checkpoints intact and, at worst, a ``.tmp`` file that the next
manager removes. Old checkpoints are pruned only after a newer one verified.

Reading: ``restore(step)`` uses the ring when it has the step, else disk, re-checking the sha256.
``restore_latest()`` walks back from the newest disk checkpoint past any that fail the check
(bit rot, truncation, a hand-edited file), reports each corrupt one as a ``checkpoint`` event with
``verified=False`` and says in its detail which step it fell back to. After a restore, states
newer than the restored step belong to the abandoned timeline: they are dropped from the ring and
from disk, so a later rollback cannot land on them.

Ranks: every rank writes its own files under ``<dir>/rank<r>/`` and restores from them alone, with
no collective. RNG states (and, with sharded optimizers, optimizer state) differ per rank, and a
shared rank-0 file would need a broadcast on every restore. For this replicated small model the
cost is ``world`` copies of the weights on disk; a sharded (FSDP) trainer would write one shard
each the same way. ``on_event`` is called from the writer thread for disk checkpoints (it must be
thread-safe, as the agent's publisher is). Files are written by this process and loaded with ``weights_only=False``
(they hold RNG states and plain objects): load only checkpoints you wrote.
"""

from __future__ import annotations

import copy
import hashlib
import io
import json
import logging
import os
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from agent.events import CheckpointKind

log = logging.getLogger(__name__)
_DISK_KINDS = (CheckpointKind.INCREMENTAL, CheckpointKind.FULL)


@dataclass(kw_only=True, slots=True)
class CheckpointConfig:
    dir: str = "checkpoints"
    """Root directory; each rank writes under <dir>/rank<r>/."""
    memory_ring: int = 8
    """In-memory snapshots kept (the newest K)."""
    snapshot_every: int = 10
    """Steps between in-memory snapshots (0 = none)."""
    ckpt_every: int = 100
    """Steps between incremental disk checkpoints (0 = none)."""
    full_every: int = 300
    """Steps between full disk checkpoints (0 = none); wins over incremental on the same step."""
    keep_full: int = 2
    """Full checkpoints kept on disk (newest)."""
    keep_incremental: int = 2
    """Incremental checkpoints kept on disk (newest)."""
    emit_memory_events: bool = True
    """Report every in-memory snapshot as a checkpoint event (the controller learns rollback targets)."""

    def __post_init__(self) -> None:
        if not self.dir:
            raise ValueError("dir: must not be empty")
        if self.memory_ring < 1:
            raise ValueError("memory_ring: must be >= 1")
        for name in ("snapshot_every", "ckpt_every", "full_every"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: must be >= 0")
        if self.keep_full < 1:
            raise ValueError("keep_full: must be >= 1")
        if self.keep_incremental < 1:
            raise ValueError("keep_incremental: must be >= 1")


def cpu_copy(obj: Any) -> Any:
    """A deep copy with every tensor detached and copied to CPU (the snapshot the writer owns)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        out = {k: cpu_copy(v) for k, v in obj.items()}
        return out if type(obj) is dict else type(obj)(out)  # keeps OrderedDict state_dicts
    if isinstance(obj, list):
        return [cpu_copy(v) for v in obj]
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(cpu_copy(v) for v in obj)
    return copy.deepcopy(obj)


def cpu_copy_into(obj: Any, spare: Any) -> Any:
    """Like ``cpu_copy`` but reusing the tensors of ``spare`` (an old snapshot of the same shape)
    where shapes and dtypes match: a ``copy_`` into warm memory instead of fresh pages, which
    costs page faults and zeroing on every snapshot."""
    if isinstance(obj, torch.Tensor):
        if (isinstance(spare, torch.Tensor) and spare.shape == obj.shape and spare.dtype == obj.dtype
                and spare.device.type == "cpu" and spare.is_contiguous()):
            return spare.copy_(obj.detach())
        return cpu_copy(obj)
    if isinstance(obj, dict) and isinstance(spare, dict):
        out = {k: cpu_copy_into(v, spare.get(k)) for k, v in obj.items()}
        return out if type(obj) is dict else type(obj)(out)
    if isinstance(obj, list) and isinstance(spare, list) and len(obj) == len(spare):
        return [cpu_copy_into(v, w) for v, w in zip(obj, spare, strict=True)]
    return cpu_copy(obj)


def state_bytes(obj: Any) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(state_bytes(v) for v in obj.values())
    if isinstance(obj, list | tuple):
        return sum(state_bytes(v) for v in obj)
    return 0


class _HashingWriter:
    """File-like wrapper: torch.save streams through it, so the sha256 costs no second read."""

    def __init__(self, fh: io.BufferedWriter) -> None:
        self.fh = fh
        self.sha = hashlib.sha256()
        self.n = 0

    def write(self, data: bytes) -> int:
        self.sha.update(data)
        self.n += len(data)
        return self.fh.write(data)

    def flush(self) -> None:
        self.fh.flush()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def file_sha256(path: Path) -> str:
    sha = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            sha.update(chunk)
    return sha.hexdigest()


class CorruptCheckpoint(Exception):
    pass


class CheckpointManager:
    def __init__(
        self,
        cfg: CheckpointConfig,
        rank: int = 0,
        world: int = 1,
        on_event: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.cfg = cfg
        self.rank = rank
        self.world = world
        self.on_event = on_event or (lambda payload: None)
        self.root = Path(cfg.dir) / f"rank{rank}"
        self.root.mkdir(parents=True, exist_ok=True)
        for stale in self.root.glob("*.tmp"):  # left by a writer that died mid-write
            log.warning("removing unfinished checkpoint file %s", stale)
            stale.unlink(missing_ok=True)
        self.ring: OrderedDict[int, Any] = OrderedDict()
        # Snapshots neither in the ring nor queued for the writer, recycled as copy targets.
        self._spare: list[Any] = []
        self._in_flight: dict[int, int] = {}  # id(snapshot) -> queued writes
        self.last_detail = ""
        # Guards the ring, the spare pool and the sidecar set between the training and writer threads.
        self._lock = threading.RLock()
        self._jobs: queue.Queue[tuple[int, CheckpointKind, Any] | None] = queue.Queue()
        self._writer = threading.Thread(target=self._write_loop, name=f"ckpt-writer-{rank}", daemon=True)
        self._writer.start()
        self._closed = False

    # -- schedule ------------------------------------------------------------------------
    def kinds_due(self, step: int) -> list[CheckpointKind]:
        c = self.cfg
        due = []
        if c.snapshot_every and step % c.snapshot_every == 0:
            due.append(CheckpointKind.MEMORY)
        if c.full_every and step % c.full_every == 0:
            due.append(CheckpointKind.FULL)
        elif c.ckpt_every and step % c.ckpt_every == 0:
            due.append(CheckpointKind.INCREMENTAL)
        return due

    def on_step(self, step: int, state_fn: Callable[[], dict[str, Any]]) -> list[CheckpointKind]:
        """Take whatever is due at this step; ``state_fn`` is called (and copied) at most once."""
        due = self.kinds_due(step)
        if not due:
            return due
        snap = self.snapshot(step, state_fn(), in_ring=CheckpointKind.MEMORY in due)
        for kind in due:
            if kind in _DISK_KINDS:
                self._enqueue(step, kind, snap)
        return due

    def _enqueue(self, step: int, kind: CheckpointKind, snap: Any) -> None:
        with self._lock:
            self._in_flight[id(snap)] = self._in_flight.get(id(snap), 0) + 1
        self._jobs.put((step, kind, snap))

    def _release(self, snap: Any) -> None:
        """Offer a snapshot for reuse once nothing (ring, writer) refers to it any more."""
        with self._lock:
            if self._in_flight.get(id(snap), 0) > 0:
                return
            if any(v is snap for v in self.ring.values()):
                return
            self._spare = [snap, *self._spare][:2]

    # -- writing -------------------------------------------------------------------------
    def snapshot(self, step: int, state: dict[str, Any], in_ring: bool = True) -> Any:
        """Copy the state to CPU (on the calling thread) and keep it in the ring."""
        t0 = time.perf_counter()
        with self._lock:
            spare = self._spare.pop() if self._spare else None
        snap = cpu_copy(state) if spare is None else cpu_copy_into(state, spare)
        if in_ring:
            with self._lock:
                old = self.ring.pop(step, None)
                self.ring[step] = snap
                evicted = [old] if old is not None else []
                while len(self.ring) > self.cfg.memory_ring:
                    evicted.append(self.ring.popitem(last=False)[1])
                for e in evicted:
                    self._release(e)
            if self.cfg.emit_memory_events:
                steps = list(self.ring)
                self._emit(
                    kind=CheckpointKind.MEMORY, step=step, path="", nbytes=state_bytes(snap), sha="",
                    seconds=time.perf_counter() - t0, verified=True,
                    detail=f"memory ring holds steps {steps[0]}..{steps[-1]} ({len(steps)})",
                )
        return snap

    def save(self, step: int, state: dict[str, Any], kind: CheckpointKind | str = CheckpointKind.FULL) -> None:
        """Copy now, write in the background (the on_event payload follows when verified)."""
        kind = CheckpointKind(kind)
        if kind == CheckpointKind.MEMORY:
            self.snapshot(step, state)
            return
        self._enqueue(step, kind, self.snapshot(step, state, in_ring=False))

    def _write_loop(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                if job is None:
                    return
                self._write(*job)
            except Exception as exc:  # noqa: BLE001 - the writer logs and goes on; training must not die
                log.exception("checkpoint write failed")
                step, kind, _ = job  # type: ignore[misc]
                self._emit(kind=kind, step=step, path="", nbytes=0, sha="", seconds=0.0, verified=False,
                           detail=f"write failed: {exc!r}")
            finally:
                if job is not None:
                    snap = job[2]
                    with self._lock:
                        self._in_flight[id(snap)] -= 1
                        if not self._in_flight[id(snap)]:
                            del self._in_flight[id(snap)]
                    self._release(snap)
                self._jobs.task_done()

    def _path(self, step: int, kind: CheckpointKind) -> Path:
        return self.root / f"{kind.value}-{step:09d}.pt"

    def _write(self, step: int, kind: CheckpointKind, snap: Any) -> None:
        t0 = time.perf_counter()
        final = self._path(step, kind)
        tmp = final.with_name(final.name + ".tmp")
        with tmp.open("wb") as fh:
            writer = _HashingWriter(fh)
            torch.save({"step": step, "kind": kind.value, "rank": self.rank, "world": self.world,
                        "state": snap}, writer)
            fh.flush()
            os.fsync(fh.fileno())
        sha = writer.sha.hexdigest()
        os.replace(tmp, final)
        _fsync_dir(self.root)
        try:
            self._load_checked(final, sha)
        except CorruptCheckpoint as exc:
            final.unlink(missing_ok=True)
            self._emit(kind=kind, step=step, path=str(final), nbytes=writer.n, sha=sha,
                       seconds=time.perf_counter() - t0, verified=False, detail=f"verification failed: {exc}")
            return
        meta = {"step": step, "kind": kind.value, "sha256": sha, "bytes": writer.n, "rank": self.rank,
                "world": self.world, "written_at": time.time()}
        side = final.with_name(final.name + ".json")
        side_tmp = side.with_name(side.name + ".tmp")
        with side_tmp.open("w") as fh:
            json.dump(meta, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(side_tmp, side)
        _fsync_dir(self.root)
        self._emit(kind=kind, step=step, path=str(final), nbytes=writer.n, sha=sha,
                   seconds=time.perf_counter() - t0, verified=True, detail="")
        self._prune(kind)

    def _prune(self, kind: CheckpointKind) -> None:
        keep = self.cfg.keep_full if kind == CheckpointKind.FULL else self.cfg.keep_incremental
        with self._lock:
            entries = [m for m in self._disk_entries() if m["kind"] == kind.value]
            for meta in entries[:-keep]:
                self._delete(meta)

    def _delete(self, meta: dict[str, Any]) -> None:
        path = self._path(meta["step"], CheckpointKind(meta["kind"]))
        path.with_name(path.name + ".json").unlink(missing_ok=True)  # sidecar first: it is the commit
        path.unlink(missing_ok=True)

    # -- reading -------------------------------------------------------------------------
    def _disk_entries(self) -> list[dict[str, Any]]:
        """Sidecars on disk, oldest first (by step, full after incremental on the same step)."""
        out = []
        for side in self.root.glob("*.pt.json"):
            try:
                out.append(json.loads(side.read_text()))
            except (OSError, ValueError):
                log.warning("unreadable checkpoint sidecar %s ignored", side)
        return sorted(out, key=lambda m: (m["step"], m["kind"] == CheckpointKind.FULL.value))

    def _load_checked(self, path: Path, sha: str) -> dict[str, Any]:
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise CorruptCheckpoint(f"{path.name}: unreadable ({exc})") from exc
        actual = hashlib.sha256(data).hexdigest()
        if actual != sha:
            raise CorruptCheckpoint(f"{path.name}: sha256 mismatch (expected {sha[:12]}…, got {actual[:12]}…)")
        try:
            return torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)
        except Exception as exc:  # noqa: BLE001 - any unpickling failure means the file is bad
            raise CorruptCheckpoint(f"{path.name}: does not load ({exc!r})") from exc

    def disk_steps(self) -> list[int]:
        return sorted({m["step"] for m in self._disk_entries()})

    def available_steps(self) -> list[int]:
        """Steps a rollback can reach: the ring and committed disk checkpoints, ascending."""
        return sorted(set(self.ring) | set(self.disk_steps()))

    def restore(self, step: int, discard_newer: bool = True) -> tuple[dict[str, Any], str]:
        """(state, "memory"|"disk") for exactly this step; KeyError if absent or corrupt."""
        self.wait()
        if step in self.ring:
            state, source = cpu_copy(self.ring[step]), "memory"
        else:
            metas = [m for m in self._disk_entries() if m["step"] == step]
            if not metas:
                raise KeyError(f"step {step}: no checkpoint (available: {self.available_steps()})")
            state, source = None, "disk"
            errors = []
            for meta in reversed(metas):  # full before incremental
                try:
                    state = self._load_meta(meta)["state"]
                    break
                except CorruptCheckpoint as exc:
                    errors.append(str(exc))
            if state is None:
                raise KeyError(f"step {step}: checkpoint corrupt ({'; '.join(errors)})")
        if discard_newer:
            self.discard_after(step)
        self.last_detail = f"restored step {step} from {source}"
        return state, source

    def _load_meta(self, meta: dict[str, Any]) -> dict[str, Any]:
        path = self._path(meta["step"], CheckpointKind(meta["kind"]))
        try:
            return self._load_checked(path, meta["sha256"])
        except CorruptCheckpoint as exc:
            self._emit(kind=CheckpointKind(meta["kind"]), step=meta["step"], path=str(path),
                       nbytes=meta["bytes"], sha=meta["sha256"], seconds=0.0, verified=False,
                       detail=f"corrupt: {exc}")
            raise

    def latest_verified(self) -> int | None:
        """The newest disk step whose file passes the sha256 check now (corrupt ones reported)."""
        self.wait()
        for meta in reversed(self._disk_entries()):
            path = self._path(meta["step"], CheckpointKind(meta["kind"]))
            try:
                if file_sha256(path) == meta["sha256"]:
                    return meta["step"]
            except OSError:
                pass
            self._emit(kind=CheckpointKind(meta["kind"]), step=meta["step"], path=str(path),
                       nbytes=meta["bytes"], sha=meta["sha256"], seconds=0.0, verified=False,
                       detail="corrupt: sha256 mismatch or unreadable")
        return None

    def restore_latest(self) -> tuple[int, dict[str, Any], str, str]:
        """(step, state, source, detail) from the newest disk checkpoint that loads; corrupt newer
        ones are skipped and named in detail. KeyError when none is usable."""
        self.wait()
        skipped: list[str] = []
        for meta in reversed(self._disk_entries()):
            try:
                state = self._load_meta(meta)["state"]
            except CorruptCheckpoint as exc:
                skipped.append(f"step {meta['step']} ({meta['kind']}): {exc}")
                continue
            detail = f"restored step {meta['step']} from disk"
            if skipped:
                detail += "; fell back past corrupt newer checkpoint(s): " + "; ".join(skipped)
            self.last_detail = detail
            return meta["step"], state, "disk", detail
        raise KeyError("no usable checkpoint on disk" + (": " + "; ".join(skipped) if skipped else ""))

    def discard_after(self, step: int) -> None:
        """Forget states newer than ``step`` (the abandoned timeline after a rollback)."""
        with self._lock:
            for s in [s for s in self.ring if s > step]:
                self._release(self.ring.pop(s))
            for meta in self._disk_entries():
                if meta["step"] > step:
                    self._delete(meta)

    # -- lifecycle -----------------------------------------------------------------------
    def wait(self) -> None:
        """Block until every queued disk write finished (verified or reported failed)."""
        self._jobs.join()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._jobs.put(None)
        self._writer.join()

    def _emit(self, *, kind: CheckpointKind, step: int, path: str, nbytes: int, sha: str, seconds: float,
              verified: bool, detail: str) -> None:
        payload = {"kind": kind.value, "step": step, "path": path, "bytes": int(nbytes), "sha256": sha,
                   "seconds": round(seconds, 6), "verified": verified, "detail": detail}
        try:
            self.on_event(payload)
        except Exception:  # noqa: BLE001 - a failing observer must not stop checkpointing
            log.exception("checkpoint on_event callback failed")
