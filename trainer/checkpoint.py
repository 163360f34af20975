"""Checkpoints: an in-memory ring for fast rollback, and atomic, verified, asynchronous disk copies.

Kinds (``core.events.CheckpointKind``):

- ``memory``: a CPU deep copy in a ring of the last ``memory_ring`` snapshots (every
  ``snapshot_every`` steps; agent/recovery/ring.py's ``MemoryRing``, the ring every loop uses).
  Rollback from here costs a copy, no I/O.
- ``incremental`` (every ``ckpt_every`` steps) and ``full`` (every ``full_every`` steps): both
  hold the *complete* state the loop passes, so either one alone restores a step exactly. They
  differ in retention: incrementals are a short rolling window (newest ``keep_incremental``), full
  ones the longer-lived anchors (newest ``keep_full``). We chose not to write deltas: in dense
  training every parameter and optimizer moment changes every step, so a delta is as large as the
  state and adds a fragile dependency on its base.

Writing (``save``): on the training thread the state is copied into a flat CPU buffer (the only
stall; evicted buffers are recycled, so it is a copy into warm memory). A background thread hands
the buffer to the writer — by default a separate low-priority process (``writer="process"``; see
``trainer/checkpoint_io.py``): a writer *thread* shares the GIL with the training loop and was
measured to slow the steps around each checkpoint by more than a synchronous ``torch.save`` costs
(``bench/checkpoint_stall.py``). The writer serialises to ``<name>.pt.tmp`` while hashing it
(sha256), fsyncs, renames it to ``<name>.pt`` and fsyncs the directory (atomic: a reader sees the
old set or the new file, never half a file), then *verifies* it — re-reads the file, checks the sha256 and
``torch.load``s it — and only then writes the ``<name>.pt.json`` sidecar (itself temp + rename)
and reports ``verified=True``. A checkpoint without its sidecar does not exist; a writer killed at
any point leaves the previous checkpoints intact and, at worst, a ``.tmp`` file that the next
manager removes; a dead writer process is reported (``verified=False``) and restarted. Old checkpoints are pruned only after a newer one verified.

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

Ranks: every rank writes its own files under ``<dir>/rank<r>/`` and restores from them alone, with
no collective. RNG states (and, with sharded optimizers, optimizer state) differ per rank, and a
shared rank-0 file would need a broadcast on every restore. For this replicated small model the
cost is ``world`` copies of the weights on disk; a sharded (FSDP) trainer would write one shard
each the same way. ``on_event`` is called from the writer's feeder thread for disk checkpoints (it must be
thread-safe, as the agent's publisher is). Files are written by this process and loaded with ``weights_only=False``
(they hold RNG states and plain objects): load only checkpoints you wrote.
"""

from __future__ import annotations

import logging
import pickle
import queue
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.recovery.ring import MemoryRing, cpu_copy
from core.enums import CheckpointKind
from trainer.checkpoint_io import (
    CorruptCheckpoint,
    FlatSnapshot,
    clone_tensors,
    delete_entry,
    entry_path,
    file_sha256,
    flatten,
    load_checked,
    read_frame,
    scan_sidecars,
    send_frame,
    sidecar_name_fields,
    write_checkpoint,
)

log = logging.getLogger(__name__)
_DISK_KINDS = (CheckpointKind.INCREMENTAL, CheckpointKind.FULL)
__all__ = ["CheckpointConfig", "CheckpointManager", "CorruptCheckpoint", "cpu_copy"]


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
    writer: str = "process"
    """process: a low-priority writer process (no GIL shared with training); thread: in-process."""

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
        if self.writer not in ("process", "thread"):
            raise ValueError("writer: must be 'process' or 'thread'")


class _ProcessWriter:
    """One ``python -m trainer.checkpoint_io`` child; restarted after it dies."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.proc: subprocess.Popen[bytes] | None = None

    def _ensure(self) -> subprocess.Popen[bytes]:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "trainer.checkpoint_io", str(self.root)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=str(Path(__file__).resolve().parents[1]),
            )
        return self.proc

    def start(self) -> None:
        self._ensure()  # the child imports torch while training runs; the first job need not wait

    def write(self, header: dict[str, Any], snap: FlatSnapshot) -> dict[str, Any]:
        proc = self._ensure()
        assert proc.stdin is not None and proc.stdout is not None
        try:
            send_frame(proc.stdin, pickle.dumps(header))
            proc.stdin.write(memoryview(snap.flat.numpy()).cast("B"))
            proc.stdin.flush()
            return pickle.loads(read_frame(proc.stdout))
        except (OSError, EOFError) as exc:
            raise RuntimeError(f"writer process died (exit {self._reap(proc)}): {exc!r}") from exc

    @staticmethod
    def _reap(proc: subprocess.Popen[bytes]) -> int:
        """Exit code of a writer whose pipe broke. Its pipes close before the kernel reports the
        exit, so poll() alone can still say "running" (seen on a loaded machine); a writer that
        closed its pipe is no use, so one that does not exit promptly is killed."""
        try:
            return proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait()

    def close(self) -> None:
        if self.proc is None:
            return
        try:
            if self.proc.stdin:
                self.proc.stdin.close()
            self.proc.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()


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
        self.root = Path(cfg.dir) / f"rank{rank}"
        self.root.mkdir(parents=True, exist_ok=True)
        for stale in self.root.glob("*.tmp"):  # left by a writer that died mid-write
            log.warning("removing unfinished checkpoint file %s", stale)
            stale.unlink(missing_ok=True)
        # The ring's evicted buffers are recycled as copy targets once no queued write holds them.
        self.ring = MemoryRing(cfg.memory_ring, copy_in=flatten, copy_out=lambda snap: clone_tensors(snap.materialize()),
                               keep=lambda snap: self._in_flight.get(id(snap), 0) > 0)
        self.last_detail = ""
        self.malformed_sidecars: dict[str, str] = {}
        """Sidecars skipped as malformed (path -> reason); each is logged and reported once."""
        self._in_flight: dict[int, int] = {}  # id(snapshot) -> queued writes
        # Guards the ring, its spare pool and the in-flight counts between the two threads.
        self._lock = self.ring.lock
        self._jobs: queue.Queue[tuple[int, CheckpointKind, FlatSnapshot] | None] = queue.Queue()
        self._process = _ProcessWriter(self.root) if cfg.writer == "process" else None
        if self._process is not None and (cfg.ckpt_every or cfg.full_every):
            self._process.start()  # else started by the first save (e.g. a checkpoint_now command)
        self._feeder = threading.Thread(target=self._write_loop, name=f"ckpt-writer-{rank}", daemon=True)
        self._feeder.start()
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

    def _snapshot(self, step: int, state: dict[str, Any], in_ring: bool) -> FlatSnapshot:
        t0 = time.perf_counter()
        snap = self.ring.copy(state)
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
        while True:
            job = self._jobs.get()
            try:
                if job is None:
                    return
                self._emit(self._write(*job))
            except Exception as exc:  # noqa: BLE001 - the writer logs and goes on; training must not die
                log.exception("checkpoint write failed")
                step, kind, _ = job  # type: ignore[misc]
                self._emit({"kind": kind.value, "step": step, "path": "", "bytes": 0, "sha256": "",
                            "seconds": 0.0, "verified": False, "detail": f"write failed: {exc}"})
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
        keep = {CheckpointKind.FULL.value: self.cfg.keep_full,
                CheckpointKind.INCREMENTAL.value: self.cfg.keep_incremental}
        if self._process is None:
            return write_checkpoint(self.root, step, kind.value, self.rank, self.world,
                                    clone_tensors(snap.materialize()), keep, self._own_run, self.instance)
        header = {"step": step, "kind": kind.value, "rank": self.rank, "world": self.world,
                  "skeleton": snap.skeleton, "metas": snap.metas, "nbytes": snap.nbytes, "keep": keep,
                  "run_id": self._own_run, "instance": self.instance}
        return self._process.write(header, snap)

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
        state = self.ring.get(step)
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
            return load_checked(path, meta["sha256"])
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
                if file_sha256(path) == meta["sha256"]:
                    return meta["step"]
            except OSError:
                pass
            self._emit({"kind": meta["kind"], "step": meta["step"], "path": str(path), "bytes": meta["bytes"],
                        "sha256": meta["sha256"], "seconds": 0.0, "verified": False,
                        "detail": "corrupt: sha256 mismatch or unreadable"})
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
        for meta in self._entries():
            if meta["step"] > step and meta.get("run_id", "") == self._own_run:
                delete_entry(self.root, meta)

    # -- lifecycle -----------------------------------------------------------------------
    def wait(self) -> None:
        """Block until every queued disk write finished (verified or reported failed)."""
        self._jobs.join()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._jobs.put(None)
            self._feeder.join()
        finally:
            if self._process is not None:
                self._process.close()

    def _emit(self, payload: dict[str, Any]) -> None:
        payload = {**payload, "bytes": int(payload["bytes"]), "seconds": round(float(payload["seconds"]), 6)}
        try:
            self.on_event(payload)
        except Exception:  # noqa: BLE001 - a failing observer must not stop checkpointing
            log.exception("checkpoint on_event callback failed")
