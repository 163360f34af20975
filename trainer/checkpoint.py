"""Checkpoints: an in-memory ring for fast rollback, and atomic, verified, asynchronous disk copies.

Kinds (``core.events.CheckpointKind``):

- ``memory``: a CPU deep copy in a ring of the last ``memory_ring`` snapshots (agent/recovery/ring.py's
  ``MemoryRing``, the ring every loop uses; every
  ``snapshot_every`` steps). Rollback from here costs a copy, no I/O.
- ``incremental`` (every ``ckpt_every`` steps) and ``full`` (every ``full_every`` steps): both
  hold the *complete* state the loop passes, so either one alone restores a step exactly. They
  differ in retention: incrementals are a short rolling window (newest ``keep_incremental``), full
  ones the longer-lived anchors (newest ``keep_full``). We chose not to write deltas: in dense
  training every parameter and optimizer moment changes every step, so a delta is as large as the
  state and adds a fragile dependency on its base.

Writing (``save``): the state is copied into a flat CPU buffer (evicted buffers are recycled, so
it is a copy into warm, preallocated memory — the staging step of an asynchronous DCP save, see
``trainer/checkpoint_io.py``). By default (``overlap_copy``, once ``fence_before(optimizer)`` is
called) the training thread only walks the state and lays out the buffer; the copy runs on a
copier thread while the next forward/backward runs (they only read the parameters), and the
optimizer's next ``step`` — the first change to the saved tensors — waits for it (``fence``; so do
restore, discard and the next snapshot). Without a fenced optimizer the copy is on the training
thread (the whole stall). A background thread
then saves it with ``torch.distributed.checkpoint`` into ``<name>.tmp/``: with a process group,
collectively on the manager's own gloo group (so its collectives never interleave with the
training loop's), each rank writing its share. One ordered writer thread, rather than
``dcp.async_save``'s executor per call, keeps successive saves' collectives in order and never
makes the training thread wait for the previous write. The coordinator (rank 0) then hashes every
file (sha256; the re-read is the verification), checks that the metadata loads and that no item
lies past its file's end, renames the directory to ``<name>/``, fsyncs, and only then writes the
``<name>.json`` sidecar (temp + rename) and reports ``verified=True``. A checkpoint without its
sidecar does not exist; a writer killed at any point leaves the previous checkpoints intact and,
at worst, a ``.tmp`` directory that the run's next manager removes; a failed write is reported
(``verified=False``) and never reaches the training thread. Old checkpoints are pruned only after
a newer one verified.

Reading: ``restore(step)`` uses the ring when it has the step, else disk, re-checking the sha256.
``restore_latest()`` walks back from the newest disk checkpoint past any that fail the check
(bit rot, truncation, a hand-edited file), reports each corrupt one as a ``checkpoint`` event with
``verified=False`` and says in its detail which step it fell back to. After a restore, states
newer than the restored step belong to the abandoned timeline: they are dropped from the ring and
from disk, so a later rollback cannot land on them.

Runs: sidecars carry the manager's ``run_id`` (and a per-start ``instance``); a manager lists,
restores, discards and prunes only its own run's checkpoints, so a reused directory's older run
neither prunes the new run's files nor is pruned by it (``run_id=None`` reads every run's: the
explicit way to start from another run's checkpoint; it still prunes only untagged ones). Sidecars are untrusted input: a malformed
one is skipped, logged once, kept in ``malformed_sidecars`` and reported as ``verified=False``.

Ranks and world sizes: the directory is shared by every rank (one filesystem, as DCP expects).
Replicated values are written once; the per-rank part (RNG states, ``PER_RANK_KEYS``) under the
rank's own key. Restoring needs no collective: each rank rebuilds the full state from the
metadata (``load_full``), so a checkpoint saved at world 4 restores at world 2 or 3 (a rank new
to the run gets no RNG state; the trainer seeds it). DTensor (sharded) states are resharded by
``checkpoint_io.load_resharded``. ``on_event`` is called from the writer thread for disk
checkpoints (it must be thread-safe, as the agent's publisher is). Objects in checkpoints are
unpickled (they hold RNG states and plain objects): load only checkpoints you wrote.
"""

from __future__ import annotations

import logging
import os
import queue
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch.distributed.checkpoint.api import CheckpointException

from cliffguard.agent.recovery.ring import MemoryRing, cpu_copy
from cliffguard.core.declared import bounded, check_declared, non_empty, one_of
from cliffguard.core.enums import CheckpointKind
from cliffguard.trainer.checkpoint_io import (
    CorruptCheckpoint,
    FlatSnapshot,
    clone_tensors,
    delete_entry,
    entry_path,
    fill,
    flatten,
    load_checked,
    remove_unfinished,
    scan_sidecars,
    sidecar_name_fields,
    verify_files,
    write_checkpoint,
)

log = logging.getLogger(__name__)
_DISK_KINDS = (CheckpointKind.INCREMENTAL, CheckpointKind.FULL)
__all__ = ["CheckpointConfig", "CheckpointManager", "CorruptCheckpoint", "cpu_copy"]


@dataclass(kw_only=True, slots=True)
class CheckpointConfig:
    dir: str = non_empty("checkpoints")
    """Root directory, shared by every rank (DCP checkpoints: one directory per checkpoint)."""
    memory_ring: int = bounded(8, ge=1)
    """In-memory snapshots kept (the newest K)."""
    snapshot_every: int = bounded(10, ge=0)
    """Steps between in-memory snapshots (0 = none)."""
    ckpt_every: int = bounded(100, ge=0)
    """Steps between incremental disk checkpoints (0 = none)."""
    full_every: int = bounded(300, ge=0)
    """Steps between full disk checkpoints (0 = none); wins over incremental on the same step."""
    keep_full: int = bounded(2, ge=1)
    """Full checkpoints kept on disk (newest)."""
    keep_incremental: int = bounded(2, ge=1)
    """Incremental checkpoints kept on disk (newest)."""
    emit_memory_events: bool = True
    """Report every in-memory snapshot as a checkpoint event (the controller learns rollback targets)."""
    writer: str = one_of("thread", ("thread",),
                         reason="must be 'thread' (DCP saves collectively from a background thread)")
    """thread: DCP saves from a background thread (the only writer; "process" was the pre-DCP one)."""
    collective_timeout_s: float = bounded(120.0, gt=0)
    """Timeout of the checkpoint process group's collectives (a dead peer fails a save, never hangs it)."""
    overlap_copy: bool = True
    """Copy the snapshot on a copier thread, overlapped with the next forward/backward, and wait for
    it only before the optimizer next changes the state (a pipelined snapshot, as CheckFreq does).
    Takes effect once ``fence_before(optimizer)`` is called (the bundled loop does, trainer/loop.py):
    until then the copy stays on the training thread. Anything else that changes the saved tensors
    in place must call ``fence()`` first (restore, discard and the next snapshot already do)."""

    background_nice: int = bounded(10, ge=0, le=19, reason="must be in 0..19")
    """Niceness added to the copier and writer threads (Linux: per thread), so that where no core is
    idle the training thread gets the CPU first and the write takes what is left (measured on 2
    shared cores, bench/checkpoint_stall.py: steps during a write 1.2x a normal step instead of 2.2x;
    the write finishes later); where a core is idle it changes nothing. 0 = the training thread's."""

    def __post_init__(self) -> None:
        check_declared(self)


def _background_priority(nice: int) -> None:
    """Lower the calling thread's CPU priority by ``nice`` (Linux only: there a thread id is a
    scheduling entity; elsewhere it could name another process, so nothing is done)."""
    if not nice or not sys.platform.startswith("linux"):
        return
    tid = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, tid, min(os.getpriority(os.PRIO_PROCESS, tid) + nice, 19))
    except OSError:
        log.warning("could not lower the checkpoint thread's priority", exc_info=True)


class CheckpointManager:
    def __init__(
        self,
        cfg: CheckpointConfig,
        rank: int = 0,
        world: int = 1,
        on_event: Callable[[dict[str, Any]], None] | None = None,
        run_id: str | None = None,
    ) -> None:
        self.cfg = cfg
        self.rank = rank
        self.world = world
        self.run_id = run_id
        """Sidecars are tagged with it; only this run's checkpoints are listed and restored. None (for
        one-run directories and readers of another run's checkpoints, e.g. a study's common start)
        lists every run's. Pruning and discarding touch only the writer's own run ("" when None)."""
        self._own_run = run_id or ""
        self.instance = uuid.uuid4().hex
        """Tells this start's checkpoints from an earlier start of the same run (forensics only)."""
        self.on_event = on_event or (lambda payload: None)
        self.root = Path(cfg.dir)
        self.root.mkdir(parents=True, exist_ok=True)
        self.coordinator = rank == 0
        """Commits, prunes and discards disk checkpoints (the directory is shared)."""
        self._group = self._checkpoint_group(world, cfg.collective_timeout_s)
        if self.coordinator:
            remove_unfinished(self.root, self._own_run)  # left by a writer that died mid-write
        # The ring's evicted buffers are recycled as copy targets once no queued write holds them.
        self.ring = MemoryRing(cfg.memory_ring, copy_in=lambda state, spare: flatten(state, spare, copy=not self._fenced),
                               copy_out=lambda snap: clone_tensors(snap.materialize()),
                               keep=lambda snap: self._in_flight.get(id(snap), 0) > 0)
        self.last_detail = ""
        self.malformed_sidecars: dict[str, str] = {}
        """Sidecars skipped as malformed (path -> reason); each is logged and reported once."""
        self._in_flight: dict[int, int] = {}  # id(snapshot) -> queued writes
        # Guards the ring, its spare pool and the in-flight counts between the two threads.
        self._lock = self.ring.lock
        self._jobs: queue.Queue[tuple[int, CheckpointKind, FlatSnapshot] | None] = queue.Queue()
        self._feeder = threading.Thread(target=self._write_loop, name=f"ckpt-writer-{rank}", daemon=True)
        self._feeder.start()
        self._closed = False
        # overlap_copy: snapshots copied on the copier thread; _copied is set when none is pending.
        self._fenced = False
        self._copies: queue.Queue[FlatSnapshot | None] = queue.Queue()
        self._copied = threading.Event()
        self._copied.set()
        self._copier: threading.Thread | None = None
        self.fence_hooks: list[Any] = []
        """The optimizers' step pre-hook handles (``fence_before``)."""
        self.last_written: dict[str, Any] | None = None
        """The newest disk write's payload (set on the writer thread before the job counts as done)."""
        self.fence_wait_s = 0.0
        """Seconds the training thread has waited in ``fence`` for a pending copy (the part of the
        snapshot's stall that overlap did not hide; bench/checkpoint_stall.py reads it)."""

    @staticmethod
    def _checkpoint_group(world: int, timeout_s: float) -> Any:
        """A gloo group of its own for the writer thread's collectives (None when not distributed)."""
        import datetime

        import torch.distributed as dist

        if world == 1:
            return None
        if not (dist.is_available() and dist.is_initialized()):
            raise ValueError("world: > 1 needs an initialized process group (DCP saves collectively)")
        if dist.get_world_size() != world:
            raise ValueError(f"world: {world} is not the process group's size {dist.get_world_size()}")
        return dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout_s))

    # -- schedule ------------------------------------------------------------------------
    def kinds_due(self, step: int) -> list[CheckpointKind]:
        c = self.cfg
        due = []
        if c.snapshot_every and step % c.snapshot_every == 0:
            due.append(CheckpointKind.MEMORY)
        if step == 0:  # a rollback target from the start, but nothing on disk yet worth a write
            return due
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
        snap = self._snapshot(step, state_fn(), in_ring=CheckpointKind.MEMORY in due)
        for kind in due:
            if kind in _DISK_KINDS:
                self._enqueue(step, kind, snap)
        return due

    # -- writing -------------------------------------------------------------------------
    def snapshot(self, step: int, state: dict[str, Any]) -> None:
        """Copy the state to CPU (on the calling thread) and keep it in the ring."""
        self._snapshot(step, state, in_ring=True)

    def save(self, step: int, state: dict[str, Any], kind: CheckpointKind | str = CheckpointKind.FULL) -> None:
        """Copy now, write in the background (the on_event payload follows when verified)."""
        kind = CheckpointKind(kind)
        if kind == CheckpointKind.MEMORY:
            self._snapshot(step, state, in_ring=True)
            return
        self._enqueue(step, kind, self._snapshot(step, state, in_ring=False))

    def save_now(self, step: int, state: dict[str, Any], timeout: float | None = None) -> dict[str, Any] | None:
        """A preemption's save: the memory snapshot, then the full disk checkpoint of the same copy,
        waited for (at most ``timeout`` s). The disk write's payload (``verified`` says whether it
        was checked), or None when it did not finish in time (it goes on in the background)."""
        snap = self._snapshot(step, state, in_ring=True)
        self._enqueue(step, CheckpointKind.FULL, snap)
        if not self.wait(timeout):
            return None
        written = self.last_written
        return written if written is not None and written["step"] == step else None

    def fence_before(self, optimizer: Any) -> None:
        """Turn ``overlap_copy`` on for this optimizer: its ``step`` first waits for a pending copy.
        Pass the ``torch.optim.Optimizer`` itself (a wrapper such as Accelerate's has no step hooks):
        forward and backward only read the parameters, so its step is the first change to the state."""
        if not self.cfg.overlap_copy:
            return
        if not hasattr(optimizer, "register_step_pre_hook") or not hasattr(optimizer, "_optimizer_step_pre_hooks"):
            raise ValueError(f"optimizer: {type(optimizer).__name__} has no step pre-hooks; pass the torch "
                             "optimizer it wraps")
        self.fence_hooks.append(optimizer.register_step_pre_hook(lambda *_: self.fence()))
        if self._copier is None:
            self._copier = threading.Thread(target=self._copy_loop, name=f"ckpt-copier-{self.rank}", daemon=True)
            self._copier.start()
        self._fenced = True

    def fence(self) -> None:
        """Wait until every snapshot taken so far holds its copy (a no-op without overlap_copy)."""
        if self._copied.is_set():
            return
        t0 = time.perf_counter()
        self._copied.wait()
        self.fence_wait_s += time.perf_counter() - t0

    def _copy_loop(self) -> None:
        _background_priority(self.cfg.background_nice)
        while (snap := self._copies.get()) is not None:
            try:
                fill(snap)
            except Exception as exc:  # noqa: BLE001 - logged; the snapshot is marked bad, training goes on
                log.exception("checkpoint copy failed")
                snap.error = f"snapshot copy failed: {exc!r}"
            finally:
                if self._copies.empty():
                    self._copied.set()

    def _snapshot(self, step: int, state: dict[str, Any], in_ring: bool) -> FlatSnapshot:
        t0 = time.perf_counter()
        self.fence()  # one pending copy at a time: the buffers and views it uses stay its own
        snap = self.ring.copy(state)  # with overlap_copy, the copy itself is the copier thread's (_copy_loop)
        if self._fenced:
            self._copied.clear()
            self._copies.put(snap)
        if not in_ring:
            return snap
        with self._lock:
            self.ring.put(step, snap)
            steps = list(self.ring)
        if self.cfg.emit_memory_events:
            self._emit({"kind": CheckpointKind.MEMORY.value, "step": step, "path": "", "bytes": snap.nbytes,
                        "sha256": "", "seconds": time.perf_counter() - t0, "verified": True,
                        "detail": f"memory ring holds steps {steps[0]}..{steps[-1]} ({len(steps)})"})
        return snap

    def _enqueue(self, step: int, kind: CheckpointKind, snap: FlatSnapshot) -> None:
        with self._lock:
            self._in_flight[id(snap)] = self._in_flight.get(id(snap), 0) + 1
        self._jobs.put((step, kind, snap))

    def _release(self, snap: FlatSnapshot) -> None:
        """Offer a snapshot for reuse once nothing (ring, writer) refers to it any more."""
        self.ring.release(snap)

    def _write_loop(self) -> None:
        _background_priority(self.cfg.background_nice)
        while True:
            job = self._jobs.get()
            try:
                if job is None:
                    return
                self._copied.wait()  # not fence(): that counts the training thread's waits
                payload = self._write(*job)
                self.last_written = payload
                self._emit(payload)
            # DCP's CheckpointException is a BaseException: caught by name, or the writer thread dies
            except (Exception, CheckpointException) as exc:  # noqa: BLE001 - the writer logs and goes on; training must not die
                log.exception("checkpoint write failed")
                step, kind, _ = job  # type: ignore[misc]
                self.last_written = {"kind": kind.value, "step": step, "path": "", "bytes": 0, "sha256": "",
                                     "seconds": 0.0, "verified": False, "detail": f"write failed: {exc}"}
                self._emit(self.last_written)
            finally:
                if job is not None:
                    snap = job[2]
                    with self._lock:
                        self._in_flight[id(snap)] -= 1
                        if not self._in_flight[id(snap)]:
                            del self._in_flight[id(snap)]
                        self._release(snap)
                self._jobs.task_done()

    def _write(self, step: int, kind: CheckpointKind, snap: FlatSnapshot) -> dict[str, Any]:
        if snap.error:
            raise RuntimeError(snap.error)
        keep = {CheckpointKind.FULL.value: self.cfg.keep_full,
                CheckpointKind.INCREMENTAL.value: self.cfg.keep_incremental}
        # Views into one buffer: DCP copies each tensor whose storage is larger than itself.
        return write_checkpoint(self.root, step, kind.value, self.rank, self.world, snap.materialize(), keep,
                                self._own_run, self.instance, process_group=self._group,
                                coordinator=self.coordinator)

    # -- reading -------------------------------------------------------------------------
    def _entries(self) -> list[dict[str, Any]]:
        """Committed checkpoints; a malformed sidecar is skipped (it commits nothing), and
        reported the first time it is seen, so one bad file cannot stop saves or rollbacks."""
        entries, bad = scan_sidecars(self.root)
        if self.run_id is not None:
            entries = [m for m in entries if m.get("run_id", "") == self.run_id]
        for side, reason in bad:
            if str(side) in self.malformed_sidecars:
                continue
            self.malformed_sidecars[str(side)] = reason
            log.warning("malformed checkpoint sidecar %s skipped: %s", side, reason)
            named = sidecar_name_fields(side)
            if named is not None:
                kind, step, _tag = named
                self._emit({"kind": kind, "step": step, "path": str(side), "bytes": 0, "sha256": "",
                            "seconds": 0.0, "verified": False, "detail": f"malformed sidecar skipped: {reason}"})
        return entries

    def disk_steps(self) -> list[int]:
        return sorted({m["step"] for m in self._entries()})

    def available_steps(self) -> list[int]:
        """Steps a rollback can reach: the ring and committed disk checkpoints, ascending."""
        return sorted(set(self.ring.steps()) | set(self.disk_steps()))

    def restore(self, step: int, discard_newer: bool = True) -> tuple[dict[str, Any], str]:
        """(state, "memory"|"disk") for exactly this step; KeyError if absent or corrupt. The state
        is the caller's own copy (optimizer.load_state_dict keeps the tensors it is given)."""
        self.wait()
        bad = next((snap.error for s, snap in self.ring.items() if s == step and snap.error), None)
        state = None if bad else self.ring.get(step)  # a failed copy is no rollback target: disk, if any
        source = "memory"
        if state is None:
            metas = [m for m in self._entries() if m["step"] == step]
            if not metas:
                raise KeyError(f"step {step}: no checkpoint (available: {self.available_steps()})")
            source = "disk"
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
        path = entry_path(self.root, meta)
        try:
            return load_checked(path, meta, self.rank)
        except CorruptCheckpoint as exc:
            self._emit({"kind": meta["kind"], "step": meta["step"], "path": str(path), "bytes": meta["bytes"],
                        "sha256": meta["sha256"], "seconds": 0.0, "verified": False, "detail": f"corrupt: {exc}"})
            raise

    def latest_verified(self) -> int | None:
        """The newest disk step whose file passes the sha256 check now (corrupt ones reported)."""
        self.wait()
        for meta in reversed(self._entries()):
            path = entry_path(self.root, meta)
            try:
                verify_files(path, meta)
                return meta["step"]
            except CorruptCheckpoint as exc:
                self._emit({"kind": meta["kind"], "step": meta["step"], "path": str(path), "bytes": meta["bytes"],
                            "sha256": meta["sha256"], "seconds": 0.0, "verified": False, "detail": f"corrupt: {exc}"})
        return None

    def restore_latest(self) -> tuple[int, dict[str, Any], str, str]:
        """(step, state, source, detail) from the newest disk checkpoint that loads; corrupt newer
        ones are skipped and named in detail. KeyError when none is usable."""
        self.wait()
        skipped: list[str] = []
        for meta in reversed(self._entries()):
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
        self.wait()
        self.ring.discard_after(step)
        if not self.coordinator:  # the shared directory's files are the coordinator's to delete
            return
        for meta in self._entries():
            if meta["step"] > step and meta.get("run_id", "") == self._own_run:
                delete_entry(self.root, meta)

    # -- lifecycle -----------------------------------------------------------------------
    def wait(self, timeout: float | None = None) -> bool:
        """Block until every snapshot holds its copy and every queued disk write finished (verified
        or reported failed): before anything changes the state in place outside the fenced
        optimizer (a restore into the model, for one), call this or ``fence``. With ``timeout``:
        False when that did not happen within it."""
        if timeout is None:
            self.fence()
            self._jobs.join()
            return True
        end = time.monotonic() + timeout
        if not self._copied.wait(timeout):
            return False
        with self._jobs.all_tasks_done:
            return self._jobs.all_tasks_done.wait_for(lambda: not self._jobs.unfinished_tasks,
                                                      max(end - time.monotonic(), 0.0))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._jobs.put(None)
        self._feeder.join()
        if self._copier is not None:
            self._copies.put(None)
            self._copier.join()

    def _emit(self, payload: dict[str, Any]) -> None:
        payload = {**payload, "bytes": int(payload["bytes"]), "seconds": round(float(payload["seconds"]), 6)}
        try:
            self.on_event(payload)
        except Exception:  # noqa: BLE001 - a failing observer must not stop checkpointing
            log.exception("checkpoint on_event callback failed")
