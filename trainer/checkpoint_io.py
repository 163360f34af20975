"""The checkpoint disk format (torch.distributed.checkpoint) and the flat staging buffers.

A disk checkpoint is one DCP directory shared by every rank, committed by a sidecar::

    full-000000300/            DCP files: __<rank>_0.distcp (each rank's share), .metadata
    full-000000300.json        sidecar: format, step, kind, world, files {name: sha256}, sha256
                               (of that manifest), bytes, run_id, instance — its presence commits the
                               directory; a malformed one commits nothing (skipped, reported)
    full-000000300-<tag>/ (.json)   the same for a run with an id (tag = run_tag(run_id)), so runs
                               sharing a directory never overwrite, list or prune each other's files
    incremental-000000400/ (.json)
    *.tmp/                     unfinished writes (the run's own are removed by its next manager)

The state is saved as ``{"shared": <everything but PER_RANK_KEYS>, "ranks": {"<r>": <rank r's
PER_RANK_KEYS>}}``. DCP writes a tensor or object that several ranks hold under one key once
(its planner de-duplicates), so a replicated model costs one copy; DTensor (sharded) values keep
their global shape and are resharded by DCP to whatever mesh the loader passes
(``load_resharded``). ``load_full`` needs no collective and no target: it rebuilds the whole
state from the metadata, which is what a replicated trainer at any world size restores from.

Snapshots travel as a *flat* snapshot: every tensor of the state copied into one CPU byte
buffer (64-byte aligned slots) plus a small picklable skeleton in which each tensor is a
``Slot``. One buffer is cheap to recycle (the next snapshot copies into warm memory): it is the
preallocated staging area of the asynchronous save (``FlatStager``) and the in-memory ring's
storage.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.tensor import DTensor

log = logging.getLogger(__name__)
_ALIGN = 64
_ATOMIC = (int, float, str, bytes, bool, type(None))


# -- flat snapshots --------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Slot:
    """Stands for tensor ``index`` of a flat snapshot inside the skeleton."""

    index: int


@dataclass(frozen=True, slots=True)
class ShardSlot:
    """A DTensor in the skeleton: its local shard is tensor ``index``; the rest rebuilds it."""

    index: int
    mesh: Any
    placements: tuple[Any, ...]
    shape: tuple[int, ...]
    stride: tuple[int, ...]


@dataclass(slots=True)
class FlatSnapshot:
    skeleton: Any
    metas: list[tuple[int, torch.dtype, tuple[int, ...]]]
    """(byte offset, dtype, shape) per tensor slot."""
    flat: torch.Tensor
    """uint8 CPU buffer holding every tensor's bytes."""
    views: list[torch.Tensor] | None = None
    """Typed views of the non-empty slots (built once per buffer, reused by every copy into it)."""
    pending: list[torch.Tensor] | None = None
    """Sources not yet copied (``flatten(..., copy=False)``); ``fill`` copies them."""
    error: str | None = None
    """Why a deferred copy failed (the buffer then holds no consistent state: never written or restored)."""

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

    if isinstance(obj, DTensor):  # staged as its local shard; DCP needs it back as a DTensor
        tensors.append(obj.to_local().detach())
        return ShardSlot(len(tensors) - 1, obj.device_mesh, tuple(obj.placements), tuple(obj.shape),
                         tuple(obj.stride()))
    if isinstance(obj, torch.Tensor):
        tensors.append(obj.detach())
        return Slot(len(tensors) - 1)
    if isinstance(obj, dict):
        out = {k: _strip(v, tensors) for k, v in obj.items()}
        return out if type(obj) is dict else type(obj)(out)
    if isinstance(obj, list | tuple) and all(isinstance(v, _ATOMIC) for v in obj):
        return list(obj) if isinstance(obj, list) else obj  # e.g. random.getstate(): nothing to walk
    if isinstance(obj, list):
        return [_strip(v, tensors) for v in obj]
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(_strip(v, tensors) for v in obj)
    return copy.deepcopy(obj)


def flatten(state: Any, spare: FlatSnapshot | None = None, *, copy: bool = True) -> FlatSnapshot:
    """Copy ``state`` into a flat snapshot, reusing ``spare``'s buffer when the layout matches.
    ``copy=False``: walk the state and lay out the buffer now, copy the tensors later with ``fill``
    (the caller must keep them unchanged until then)."""
    tensors: list[torch.Tensor] = []
    skeleton = _strip(state, tensors)
    metas = []
    off = 0
    for t in tensors:
        metas.append((off, t.dtype, tuple(t.shape)))
        off += -(-t.numel() * t.element_size() // _ALIGN) * _ALIGN
    layout = tuple((d, s) for _, d, s in metas)
    if spare is not None and spare.layout == layout and spare.nbytes == off and spare.views is not None:
        flat, views = spare.flat, spare.views
    else:
        # pinned where a GPU exists: the device-to-host copy then runs at full speed, without a bounce buffer
        pinned = torch.cuda.is_available() and any(t.is_cuda for t in tensors)
        flat = torch.empty(off, dtype=torch.uint8, pin_memory=pinned)
        views = [flat[o : o + t.numel() * t.element_size()].view(d).view(sh)
                 for t, (o, d, sh) in zip(tensors, metas, strict=True) if t.numel()]
    snap = FlatSnapshot(skeleton=skeleton, metas=metas, flat=flat, views=views,
                        pending=[t for t in tensors if t.numel()])
    if copy:
        fill(snap)
    return snap


def fill(snap: FlatSnapshot) -> None:
    """Copy a snapshot's pending sources into its buffer (complete when this returns)."""
    srcs, snap.pending = snap.pending, None
    if srcs:
        cuda = any(t.is_cuda for t in srcs)
        torch._foreach_copy_(snap.views, srcs, non_blocking=cuda)  # one call: per-tensor dispatch was most of the stall
        if cuda:
            torch.cuda.synchronize()


def materialize(skeleton: Any, metas: list[tuple[int, torch.dtype, tuple[int, ...]]], flat: torch.Tensor) -> Any:
    if isinstance(skeleton, ShardSlot):
        local = materialize(Slot(skeleton.index), metas, flat)
        return DTensor.from_local(local, skeleton.mesh, skeleton.placements, run_check=False,
                                  shape=torch.Size(skeleton.shape), stride=skeleton.stride)
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


class FlatStager:
    """A DCP ``AsyncStager`` (``dcp.async_save(..., async_stager=FlatStager())``) that stages into a
    recycled flat CPU buffer: after the first save, staging is one copy into warm memory, where DCP's
    ``DefaultStager`` rebuilds its staging dict each time. The buffer is reused by the next
    ``stage``, so wait for the previous upload before staging again (CheckpointManager queues its
    writes and recycles buffers only when they are free)."""

    _synchronize_after_execute = False

    def __init__(self) -> None:
        self._last: FlatSnapshot | None = None

    @property
    def should_synchronize_after_execute(self) -> bool:
        return False

    def stage(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        self._last = flatten(state_dict, self._last)
        return self._last.materialize()

    def synchronize_staging(self) -> None:
        pass

    def close(self) -> None:
        self._last = None


# -- the disk format -------------------------------------------------------------------------
FORMAT = "dcp-1"
PER_RANK_KEYS = ("rng",)
"""Top-level state keys that differ per rank (saved under the rank's own key, never de-duplicated)."""


class CorruptCheckpoint(Exception):
    pass


class ReshardError(ValueError):
    """A checkpoint that cannot be loaded into the new topology's state; the message says why."""


def run_tag(run_id: str) -> str:
    """A file-name-safe tag for a run id ("" for untagged checkpoints)."""
    return hashlib.sha256(run_id.encode()).hexdigest()[:12] if run_id else ""


def ckpt_path(root: Path, step: int, kind: str, run_id: str = "") -> Path:
    """The checkpoint's DCP directory. The run's tag is in the name so two runs sharing a
    directory never overwrite each other."""
    tag = run_tag(run_id)
    return root / (f"{kind}-{step:09d}-{tag}" if tag else f"{kind}-{step:09d}")


def entry_path(root: Path, meta: dict[str, Any]) -> Path:
    return ckpt_path(root, meta["step"], meta["kind"], meta.get("run_id", ""))


def sidecar_path(path: Path) -> Path:
    return path.with_name(path.name + ".json")


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


def manifest_sha256(files: dict[str, str]) -> str:
    """One digest for a checkpoint directory: over its files' names and digests."""
    return hashlib.sha256("".join(f"{n}\0{files[n]}\n" for n in sorted(files)).encode()).hexdigest()


_SIDECAR_NAME = re.compile(r"^(full|incremental)-(\d{9,})(?:-([0-9a-f]{12}))?\.json$")


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
    for field, typ in (("step", int), ("kind", str), ("sha256", str), ("bytes", int), ("world", int)):
        value = meta.get(field)
        if not isinstance(value, typ) or isinstance(value, bool):
            raise ValueError(f"{field}: missing or not {typ.__name__}")
    if meta.get("format") != FORMAT:
        raise ValueError(f"format: {meta.get('format')!r} is not {FORMAT!r}")
    files = meta.get("files")
    if not isinstance(files, dict) or not files or not all(
            isinstance(k, str) and "/" not in k and k not in ("", ".", "..") and isinstance(v, str)
            for k, v in files.items()):
        raise ValueError("files: missing or not a {name: sha256} object of plain file names")
    if manifest_sha256(files) != meta["sha256"]:
        raise ValueError("sha256: does not match the files' digests")
    if meta["world"] < 1:
        raise ValueError("world: must be >= 1")
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
    for side in root.glob("*.json"):
        if sidecar_name_fields(side) is None:
            continue  # not ours (the run's config.json may share the directory)
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
    sidecar_path(path).unlink(missing_ok=True)  # the sidecar first: it is the commit
    shutil.rmtree(path, ignore_errors=True)


def remove_unfinished(root: Path, run_id: str) -> None:
    """Remove this run's ``*.tmp`` directories (a writer died mid-write); another run's stay."""
    tag = run_tag(run_id)
    for stale in root.glob("*.tmp"):
        name = stale.name.removesuffix(".tmp").removesuffix(".json")
        if (name.rsplit("-", 1)[-1] == tag) if tag else name.count("-") == 1:
            log.warning("removing unfinished checkpoint %s", stale)
            shutil.rmtree(stale, ignore_errors=True) if stale.is_dir() else stale.unlink(missing_ok=True)


_INT_KEYS = "__int_keys__"
_EMPTY = "__empty_dict__"


def _encode(obj: Any) -> Any:
    """DCP addresses values by string paths: int-keyed dicts (an optimizer's ``state``) are tagged
    so they come back with int keys, and empty dicts (which DCP drops) are kept as a marker."""
    if isinstance(obj, dict):
        if not obj:
            return _EMPTY
        if all(isinstance(k, int) and not isinstance(k, bool) for k in obj):
            return {_INT_KEYS: {str(k): _encode(v) for k, v in obj.items()}}
        if not all(isinstance(k, str) for k in obj):
            raise TypeError(f"checkpoint state: dict keys must be all str or all int, got {list(obj)[:4]!r}")
        return {k: _encode(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_encode(v) for v in obj]
    return obj


def _decode(obj: Any) -> Any:
    if isinstance(obj, str) and obj == _EMPTY:
        return {}
    if isinstance(obj, dict):
        if set(obj) == {_INT_KEYS}:
            return {int(k): _decode(v) for k, v in obj[_INT_KEYS].items()}
        return {k: _decode(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_decode(v) for v in obj]
    return obj


def to_dcp_state(state: dict[str, Any], rank: int) -> dict[str, Any]:
    shared = {k: v for k, v in state.items() if k not in PER_RANK_KEYS}
    own = {k: state[k] for k in PER_RANK_KEYS if k in state}
    out = {"shared": _encode(shared)}
    if own:
        out["ranks"] = {str(rank): _encode(own)}
    return out


def from_dcp_state(saved: dict[str, Any], rank: int) -> dict[str, Any]:
    """The state for ``rank``: the shared part plus the rank's own part when the saving world had
    that rank (a rank new to the run gets none: the caller seeds it)."""
    shared = _decode(saved.get("shared", {}))
    own = _decode(saved.get("ranks", {}).get(str(rank), {}))
    return {**(shared or {}), **(own or {})}


def verify_files(path: Path, meta: dict[str, Any]) -> None:
    """Every file the sidecar lists is present with its sha256 (re-read; CorruptCheckpoint if not)."""
    for name, sha in sorted(meta["files"].items()):
        try:
            actual = file_sha256(path / name)
        except OSError as exc:
            raise CorruptCheckpoint(f"{path.name}/{name}: unreadable ({exc})") from exc
        if actual != sha:
            raise CorruptCheckpoint(f"{path.name}/{name}: sha256 mismatch (expected {sha[:12]}…, got {actual[:12]}…)")


def _read_metadata(path: Path) -> Any:
    import torch.distributed.checkpoint as dcp

    return dcp.FileSystemReader(str(path)).read_metadata()


def check_layout(path: Path) -> None:
    """The metadata loads and every item it names lies inside its file (a truncated shard fails)."""
    try:
        md = _read_metadata(path)
    except Exception as exc:  # noqa: BLE001 - an unreadable metadata file means the checkpoint is bad
        raise CorruptCheckpoint(f"{path.name}: metadata does not load ({exc!r})") from exc
    ends: dict[str, int] = {}  # each file's furthest item end (one stat per file, not per item)
    for info in (md.storage_data or {}).values():
        ends[info.relative_path] = max(ends.get(info.relative_path, 0), info.offset + info.length)
    for name, end in sorted(ends.items()):
        file = path / name
        if not file.is_file() or end > file.stat().st_size:
            raise CorruptCheckpoint(f"{path.name}/{name}: shorter than its metadata says")


def load_full(path: Path) -> dict[str, Any]:
    """The whole saved state, rebuilt from the metadata (no target, no collective): every tensor
    at its global shape, DTensors gathered, objects unpickled."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    out: dict[str, Any] = {}
    _load_state_dict(out, storage_reader=dcp.FileSystemReader(str(path)), planner=_EmptyStateDictLoadPlanner(),
                     no_dist=True)
    return out


def load_checked(path: Path, meta: dict[str, Any], rank: int = 0) -> dict[str, Any]:
    """``{"step", "kind", "world", "state"}`` for ``rank`` after the files' sha256 check."""
    verify_files(path, meta)
    try:
        saved = load_full(path)
    # DCP raises CheckpointException, a BaseException
    except (Exception, CheckpointException) as exc:  # noqa: BLE001 - any failure to read means the checkpoint is bad
        raise CorruptCheckpoint(f"{path.name}: does not load ({exc!r})") from exc
    return {"step": meta["step"], "kind": meta["kind"], "world": meta["world"], "state": from_dcp_state(saved, rank)}


def load_resharded(path: Path, target: dict[str, Any], rank: int = 0, process_group: Any = None) -> dict[str, Any]:
    """The checkpoint loaded into ``target``'s tensors in place, DTensors resharded to the target's
    meshes (collective over ``process_group`` when distributed); returns the state (``target``'s
    structure, objects from the checkpoint). Every tensor of the target must exist in the
    checkpoint with the same global shape, else ReshardError naming it, before anything is read."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    md = _read_metadata(path)
    encoded = to_dcp_state(target, rank)
    flat, _ = flatten_state_dict(encoded)
    for key, value in flat.items():
        if not isinstance(value, torch.Tensor):
            continue
        shape = tuple(value.shape)  # a DTensor's shape is its global shape
        saved = md.state_dict_metadata.get(key)
        if saved is None:
            raise ReshardError(f"{key}: not in checkpoint {path.name}; it cannot be resharded into this state")
        if not isinstance(saved, TensorStorageMetadata) or tuple(saved.size) != shape:
            got = tuple(saved.size) if isinstance(saved, TensorStorageMetadata) else type(saved).__name__
            raise ReshardError(f"{key}: checkpoint {path.name} holds {got}, this topology needs global shape {shape}")
    no_dist = not (dist.is_available() and dist.is_initialized()) or process_group is None
    _load_state_dict(encoded, storage_reader=dcp.FileSystemReader(str(path)), process_group=process_group,
                     no_dist=no_dist)
    return from_dcp_state(encoded, rank)


def write_checkpoint(root: Path, step: int, kind: str, rank: int, world: int, state: Any,
                     keep: dict[str, int], run_id: str = "", instance: str = "", *,
                     process_group: Any = None, coordinator: bool = True) -> dict[str, Any]:
    """Save with DCP into ``<name>.tmp/`` (collectively over ``process_group`` when given), then, on
    the coordinator only: hash every file, check the layout, rename to ``<name>/``, commit the
    sidecar (temp + rename) and prune this run's own older ones (another run's files in the
    directory are never touched). Returns the event payload."""
    import torch.distributed.checkpoint as dcp

    t0 = time.perf_counter()
    final = ckpt_path(root, step, kind, run_id)
    tmp = final.with_name(final.name + ".tmp")
    if coordinator and tmp.exists():
        shutil.rmtree(tmp, ignore_errors=True)
    dcp.save(to_dcp_state(state, rank), storage_writer=dcp.FileSystemWriter(str(tmp)),
             process_group=process_group, no_dist=process_group is None)
    payload = {"kind": kind, "step": step, "path": str(final), "bytes": 0, "sha256": ""}
    if not coordinator:  # the coordinator commits and reports the whole checkpoint
        return {**payload, "seconds": time.perf_counter() - t0, "verified": True, "detail": f"rank {rank} share written"}
    files = {p.name: file_sha256(p) for p in sorted(tmp.iterdir()) if p.is_file()}
    nbytes = sum((tmp / n).stat().st_size for n in files)
    sha = manifest_sha256(files)
    payload.update(bytes=nbytes, sha256=sha)
    try:
        check_layout(tmp)
    except CorruptCheckpoint as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        return {**payload, "seconds": time.perf_counter() - t0, "verified": False,
                "detail": f"verification failed: {exc}"}
    if final.exists():  # an uncommitted leftover of the same step (its sidecar is absent)
        delete_entry(root, {"step": step, "kind": kind, "run_id": run_id})
    os.replace(tmp, final)
    fsync_dir(root)
    side = sidecar_path(final)
    side_tmp = side.with_name(side.name + ".tmp")
    with side_tmp.open("w") as fh:
        json.dump({"format": FORMAT, "step": step, "kind": kind, "sha256": sha, "bytes": nbytes, "files": files,
                   "world": world, "run_id": run_id, "instance": instance, "written_at": time.time()}, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(side_tmp, side)
    fsync_dir(root)
    entries = [m for m in disk_entries(root, run_id) if m["kind"] == kind]
    for meta in entries[: -keep[kind]]:  # pruned only now that a newer one verified
        delete_entry(root, meta)
    return {**payload, "seconds": time.perf_counter() - t0, "verified": True, "detail": ""}
