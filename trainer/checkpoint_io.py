"""The checkpoint disk format and the writer process (``python -m trainer.checkpoint_io``).

Split from ``trainer/checkpoint.py`` so the writer can run in its own process: it imports only
this module. Layout under a rank's directory::

    full-000000300.pt          torch.save({"step", "kind", "rank", "world", "state"})
    full-000000300.pt.json     sidecar: step, kind, sha256, bytes, run_id, instance — its presence
                               commits the file; a malformed one commits nothing (skipped, reported)
    full-000000300-<tag>.pt(.json)   the same for a run with an id (tag = run_tag(run_id)), so runs
                               sharing a directory never overwrite, list or prune each other's files
    incremental-000000400.pt(.json)
    *.tmp                      unfinished writes (removed by the next manager)

Snapshots travel as a *flat* snapshot: every tensor of the state copied into one CPU byte
buffer (64-byte aligned slots) plus a small picklable skeleton in which each tensor is a
``Slot``. One buffer is cheap to recycle (the next snapshot copies into warm memory) and cheap to
hand to the writer process (one pipe write, no pickling of tensor data on the training thread).

Writer protocol (stdin/stdout of the child, 8-byte big-endian length-prefixed frames):
parent -> child: pickled header ``{step, kind, rank, world, skeleton, metas, nbytes, keep}`` then
the raw buffer; child -> parent: the pickled checkpoint payload dict. The child runs at a lower
CPU priority (nice 10) so serialising, hashing and verifying yield to the training processes,
and it has its own GIL, which a writer *thread* would share with the training loop.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import pickle
import re
import struct
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import torch

log = logging.getLogger(__name__)
_ALIGN = 64


# -- flat snapshots --------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Slot:
    """Stands for tensor ``index`` of a flat snapshot inside the skeleton."""

    index: int


@dataclass(slots=True)
class FlatSnapshot:
    skeleton: Any
    metas: list[tuple[int, torch.dtype, tuple[int, ...]]]
    """(byte offset, dtype, shape) per tensor slot."""
    flat: torch.Tensor
    """uint8 CPU buffer holding every tensor's bytes."""

    @property
    def layout(self) -> tuple[tuple[torch.dtype, tuple[int, ...]], ...]:
        return tuple((d, s) for _, d, s in self.metas)

    @property
    def nbytes(self) -> int:
        return self.flat.numel()

    def materialize(self) -> Any:
        """The state with tensors as views into the buffer (clone before handing it out)."""
        return materialize(self.skeleton, self.metas, self.flat)


def _strip(obj: Any, tensors: list[torch.Tensor]) -> Any:
    import copy

    if isinstance(obj, torch.Tensor):
        tensors.append(obj.detach())
        return Slot(len(tensors) - 1)
    if isinstance(obj, dict):
        out = {k: _strip(v, tensors) for k, v in obj.items()}
        return out if type(obj) is dict else type(obj)(out)
    if isinstance(obj, list):
        return [_strip(v, tensors) for v in obj]
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(_strip(v, tensors) for v in obj)
    return copy.deepcopy(obj)


def flatten(state: Any, spare: FlatSnapshot | None = None) -> FlatSnapshot:
    """Copy ``state`` into a flat snapshot, reusing ``spare``'s buffer when the layout matches."""
    tensors: list[torch.Tensor] = []
    skeleton = _strip(state, tensors)
    metas = []
    off = 0
    for t in tensors:
        metas.append((off, t.dtype, tuple(t.shape)))
        off += -(-t.numel() * t.element_size() // _ALIGN) * _ALIGN
    layout = tuple((d, s) for _, d, s in metas)
    if spare is not None and spare.layout == layout and spare.nbytes == off:
        flat = spare.flat
    else:
        flat = torch.empty(off, dtype=torch.uint8)
    for t, (o, dtype, shape) in zip(tensors, metas, strict=True):
        n = t.numel() * t.element_size()
        if n:
            flat[o : o + n].view(dtype).view(shape).copy_(t)
    return FlatSnapshot(skeleton=skeleton, metas=metas, flat=flat)


def materialize(skeleton: Any, metas: list[tuple[int, torch.dtype, tuple[int, ...]]], flat: torch.Tensor) -> Any:
    if isinstance(skeleton, Slot):
        o, dtype, shape = metas[skeleton.index]
        n = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
        if n == 0:
            return torch.empty(shape, dtype=dtype)
        return flat[o : o + n].view(dtype).view(shape)
    if isinstance(skeleton, dict):
        out = {k: materialize(v, metas, flat) for k, v in skeleton.items()}
        return out if type(skeleton) is dict else type(skeleton)(out)
    if isinstance(skeleton, list):
        return [materialize(v, metas, flat) for v in skeleton]
    if isinstance(skeleton, tuple) and not hasattr(skeleton, "_fields"):
        return tuple(materialize(v, metas, flat) for v in skeleton)
    return skeleton


def clone_tensors(obj: Any) -> Any:
    """Independent tensors (views of one buffer with different dtypes cannot be torch.saved)."""
    if isinstance(obj, torch.Tensor):
        return obj.clone()
    if isinstance(obj, dict):
        out = {k: clone_tensors(v) for k, v in obj.items()}
        return out if type(obj) is dict else type(obj)(out)
    if isinstance(obj, list):
        return [clone_tensors(v) for v in obj]
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(clone_tensors(v) for v in obj)
    return obj


# -- the disk format -------------------------------------------------------------------------
class CorruptCheckpoint(Exception):
    pass


class _HashingWriter:
    """File-like wrapper: torch.save streams through it, so the sha256 costs no second read."""

    def __init__(self, fh: BinaryIO) -> None:
        self.fh = fh
        self.sha = hashlib.sha256()
        self.n = 0

    def write(self, data: bytes) -> int:
        self.sha.update(data)
        self.n += len(data)
        return self.fh.write(data)

    def flush(self) -> None:
        self.fh.flush()


def run_tag(run_id: str) -> str:
    """A file-name-safe tag for a run id ("" for untagged, pre-run-id checkpoints)."""
    return hashlib.sha256(run_id.encode()).hexdigest()[:12] if run_id else ""


def ckpt_path(root: Path, step: int, kind: str, run_id: str = "") -> Path:
    # The run's tag is in the name so two runs sharing a directory never overwrite each other.
    tag = run_tag(run_id)
    return root / (f"{kind}-{step:09d}-{tag}.pt" if tag else f"{kind}-{step:09d}.pt")


def entry_path(root: Path, meta: dict[str, Any]) -> Path:
    return ckpt_path(root, meta["step"], meta["kind"], meta.get("run_id", ""))


def fsync_dir(path: Path) -> None:
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


_SIDECAR_NAME = re.compile(r"^(full|incremental)-(\d{9,})(?:-([0-9a-f]{12}))?\.pt\.json$")


def sidecar_name_fields(side: Path) -> tuple[str, int, str] | None:
    """(kind, step, run tag) that a sidecar's file name claims, or None for a name we never write."""
    m = _SIDECAR_NAME.match(side.name)
    return (m[1], int(m[2]), m[3] or "") if m else None


def parse_sidecar(side: Path) -> dict[str, Any]:
    """A sidecar's fields, each checked (files on disk are untrusted); ValueError says what is wrong."""
    named = sidecar_name_fields(side)
    if named is None:
        raise ValueError("not a checkpoint sidecar name")
    try:
        meta = json.loads(side.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"unreadable ({exc})") from exc
    except ValueError as exc:
        raise ValueError(f"not valid JSON ({exc})") from exc
    if not isinstance(meta, dict):
        raise ValueError("not a JSON object")
    for field, typ in (("step", int), ("kind", str), ("sha256", str), ("bytes", int)):
        value = meta.get(field)
        if not isinstance(value, typ) or isinstance(value, bool):
            raise ValueError(f"{field}: missing or not {typ.__name__}")
    if not isinstance(meta.get("run_id", ""), str):
        raise ValueError("run_id: not str")
    if (meta["kind"], meta["step"], run_tag(meta.get("run_id", ""))) != named:
        raise ValueError(f"kind/step/run {meta['kind']}/{meta['step']}/{meta.get('run_id', '')!r} "
                         "do not match the file name")
    return meta


def scan_sidecars(root: Path) -> tuple[list[dict[str, Any]], list[tuple[Path, str]]]:
    """(committed checkpoints oldest first, full after incremental on one step; malformed
    sidecars as (path, reason)). A malformed sidecar commits nothing and is skipped."""
    good, bad = [], []
    for side in root.glob("*.pt.json"):
        try:
            good.append(parse_sidecar(side))
        except ValueError as exc:
            bad.append((side, str(exc)))
    return sorted(good, key=lambda m: (m["step"], m["kind"] == "full")), bad


def disk_entries(root: Path, run_id: str | None = None) -> list[dict[str, Any]]:
    """Committed checkpoints (their well-formed sidecars), oldest first, of run ``run_id`` only
    unless it is None (untagged sidecars belong to run ""); see ``scan_sidecars``."""
    return [m for m in scan_sidecars(root)[0] if run_id is None or m.get("run_id", "") == run_id]


def delete_entry(root: Path, meta: dict[str, Any]) -> None:
    path = entry_path(root, meta)
    path.with_name(path.name + ".json").unlink(missing_ok=True)  # sidecar first: it is the commit
    path.unlink(missing_ok=True)


def load_checked(path: Path, sha: str) -> dict[str, Any]:
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


def write_checkpoint(root: Path, step: int, kind: str, rank: int, world: int, state: Any,
                     keep: dict[str, int], run_id: str = "", instance: str = "") -> dict[str, Any]:
    """Temp + fsync + rename, verify by loading, commit the sidecar, prune this run's own older
    ones (another run's files in the directory are never touched); the event payload."""
    t0 = time.perf_counter()
    final = ckpt_path(root, step, kind, run_id)
    tmp = final.with_name(final.name + ".tmp")
    with tmp.open("wb") as fh:
        writer = _HashingWriter(fh)
        torch.save({"step": step, "kind": kind, "rank": rank, "world": world, "state": state}, writer)
        fh.flush()
        os.fsync(fh.fileno())
    sha = writer.sha.hexdigest()
    os.replace(tmp, final)
    fsync_dir(root)
    payload = {"kind": kind, "step": step, "path": str(final), "bytes": writer.n, "sha256": sha}
    try:
        load_checked(final, sha)
    except CorruptCheckpoint as exc:
        final.unlink(missing_ok=True)
        return {**payload, "seconds": time.perf_counter() - t0, "verified": False,
                "detail": f"verification failed: {exc}"}
    side = final.with_name(final.name + ".json")
    side_tmp = side.with_name(side.name + ".tmp")
    with side_tmp.open("w") as fh:
        json.dump({"step": step, "kind": kind, "sha256": sha, "bytes": writer.n, "rank": rank, "world": world,
                   "run_id": run_id, "instance": instance, "written_at": time.time()}, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(side_tmp, side)
    fsync_dir(root)
    entries = [m for m in disk_entries(root, run_id) if m["kind"] == kind]
    for meta in entries[: -keep[kind]]:  # pruned only now that a newer one verified
        delete_entry(root, meta)
    return {**payload, "seconds": time.perf_counter() - t0, "verified": True, "detail": ""}


# -- the writer process ----------------------------------------------------------------------
def send_frame(fh: BinaryIO, data: bytes | memoryview) -> None:
    fh.write(struct.pack(">Q", len(data)))
    fh.write(data)


def read_exact(fh: BinaryIO, n: int) -> bytearray:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = fh.readinto(view[got:])  # type: ignore[attr-defined]
        if not k:
            raise EOFError("checkpoint writer pipe closed")
        got += k
    return buf


def read_frame(fh: BinaryIO) -> bytearray:
    (n,) = struct.unpack(">Q", read_exact(fh, 8))
    return read_exact(fh, n)


def writer_main(root: str) -> int:
    """Serve write jobs until stdin closes. stdout carries only frames; logs go to stderr."""
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    inp = sys.stdin.buffer
    try:
        os.nice(10)
    except OSError:
        pass
    torch.set_num_threads(1)
    path = Path(root)
    while True:
        try:
            header = pickle.loads(read_frame(inp))
        except EOFError:
            return 0
        flat = torch.frombuffer(read_exact(inp, header["nbytes"]), dtype=torch.uint8) if header["nbytes"] else (
            torch.empty(0, dtype=torch.uint8))
        state = clone_tensors(materialize(header["skeleton"], header["metas"], flat))
        try:
            payload = write_checkpoint(path, header["step"], header["kind"], header["rank"], header["world"],
                                       state, header["keep"], header.get("run_id", ""), header.get("instance", ""))
        except Exception as exc:  # noqa: BLE001 - report and serve the next job
            payload = {"kind": header["kind"], "step": header["step"], "path": "", "bytes": 0, "sha256": "",
                       "seconds": 0.0, "verified": False, "detail": f"write failed: {exc!r}"}
        send_frame(out, pickle.dumps(payload))
        out.flush()


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    # Run the importable module's copy, not __main__'s: the skeleton's Slots unpickle as
    # trainer.checkpoint_io.Slot, and isinstance must compare against that class.
    from trainer import checkpoint_io

    raise SystemExit(checkpoint_io.writer_main(sys.argv[1]))
