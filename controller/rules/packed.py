"""Numbers stored packed in a rule's JSON state: base64 of their zlib'd native bytes (pure).

A 16k-rank run's per-rank columns and windows are ~10^6 numbers; as JSON lists they cost tens of
MB and seconds to encode with every save (controller/runstate.py saves a rule's state with every
batch that touched it). Packed they are a few MB or less, encoded in tens of ms.

The store is not trusted: every decoder checks what it decodes (base64, zlib, the byte count
for the dtype and shape asked for) and raises ``PackedStateError`` (a ``ValueError``) with what
was wrong, which controller/runstate.py turns into a fresh rule state and a logged warning.
"""

from __future__ import annotations

import base64
import binascii
import zlib
from array import array
from collections.abc import Iterable
from typing import Any

import numpy as np


class PackedStateError(ValueError):
    """A stored packed state that cannot be what its rule saved (truncated, corrupt, wrong shape)."""


def pack_bytes(raw: bytes) -> str:
    # level 1: the columns are mostly repeats (aligned steps, rank gaps of 1), which level 1 already
    # folds; higher levels cost several times the time for a few percent
    return base64.b64encode(zlib.compress(raw, 1)).decode("ascii")


def unpack_bytes(text: Any) -> bytes:
    if not isinstance(text, str):
        raise PackedStateError(f"packed column: expected base64 text, got {type(text).__name__}")
    try:
        return zlib.decompress(base64.b64decode(text, validate=True))
    except (binascii.Error, zlib.error) as exc:
        raise PackedStateError(f"packed column: not base64 of zlib data ({exc})") from exc


def pack(kind: str, values: Iterable[Any]) -> str:
    """Numbers -> packed ``array(kind)`` (a 16k-rank column in ~1 ms, a few kB)."""
    return pack_bytes(array(kind, values).tobytes())


def unpack(kind: str, text: Any) -> list[Any]:
    raw = unpack_bytes(text)
    if len(raw) % array(kind).itemsize:
        raise PackedStateError(f"packed column: {len(raw)} bytes is no whole number of {kind!r} items")
    return array(kind, raw).tolist()


def pack_array(values: np.ndarray) -> list[str]:
    """A numpy array's values in C order, little-endian, one text per byte plane (its dtype and
    shape are the reader's to know). Byte planes: a float's sign, exponent and top mantissa bytes
    barely vary across a window of timings (an integer's high bytes not at all), and its low bytes
    are noise. A plane of one byte value is stored as that value; zlib is run only on the planes
    whose first ``_SAMPLE`` bytes it shrinks, so noise costs a copy, not a compression."""
    raw = np.ascontiguousarray(values, values.dtype.newbyteorder("<")).view(np.uint8)
    planes = np.ascontiguousarray(raw.reshape(-1, values.dtype.itemsize).T)
    out = []
    for plane in planes:
        if len(plane) and not (plane != plane[0]).any():
            out.append(f"c{plane[0]}:{len(plane)}")  # the length too: a reader checks every plane's
            continue
        data = plane.tobytes()
        sample = data[:_SAMPLE]
        if len(zlib.compress(sample, 1)) < _SHRINKS * len(sample):
            out.append("z" + pack_bytes(data))
        else:
            out.append("r" + base64.b64encode(data).decode("ascii"))
    return out


_SAMPLE = 1 << 16
_SHRINKS = 0.8


def unpack_array(stored: Any, dtype: type | np.dtype, shape: tuple[int, ...], name: str) -> np.ndarray:
    """The array ``pack_array`` stored, checked to hold exactly ``shape`` items of ``dtype``."""
    kind = np.dtype(dtype)
    count = int(np.prod(shape, dtype=np.int64))
    if not isinstance(stored, list) or len(stored) != kind.itemsize:
        got = len(stored) if isinstance(stored, list) else type(stored).__name__
        raise PackedStateError(f"{name}: expected {kind.itemsize} byte planes of {kind}, got {got}")
    out = np.empty((count, kind.itemsize), np.uint8)
    for i, text in enumerate(stored):
        if not isinstance(text, str) or text[:1] not in ("z", "r", "c"):
            raise PackedStateError(f"{name}: byte plane {i} is not a packed plane")
        if text[0] == "c":
            byte, _, length = text[1:].partition(":")
            if not (byte.isdigit() and len(byte) <= 3 and int(byte) < 256 and length.isdigit()):
                raise PackedStateError(f"{name}: byte plane {i} is no byte value and length")
            if int(length) != count:
                raise PackedStateError(f"{name}: byte plane {i} holds {length} bytes where shape {shape} needs {count}")
            out[:, i] = int(byte)
            continue
        try:
            data = unpack_bytes(text[1:]) if text[0] == "z" else base64.b64decode(text[1:], validate=True)
        except binascii.Error as exc:
            raise PackedStateError(f"{name}: byte plane {i} is not base64 ({exc})") from exc
        if len(data) != count:
            raise PackedStateError(f"{name}: byte plane {i} holds {len(data)} bytes where shape {shape} needs {count}")
        out[:, i] = np.frombuffer(data, np.uint8)
    return out.view(kind.newbyteorder("<")).reshape(shape).astype(kind)  # native order, writable
