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


def pack_array(values: np.ndarray) -> str:
    """A numpy array's values in C order (its dtype and shape are the reader's to know)."""
    return pack_bytes(np.ascontiguousarray(values).tobytes())


def unpack_array(text: Any, dtype: type | np.dtype, shape: tuple[int, ...], name: str) -> np.ndarray:
    """The array ``pack_array`` stored, checked to hold exactly ``shape`` items of ``dtype``."""
    raw = unpack_bytes(text)
    want = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    if len(raw) != want:
        raise PackedStateError(f"{name}: {len(raw)} bytes where shape {shape} of {np.dtype(dtype)} needs {want}")
    return np.frombuffer(raw, dtype).reshape(shape).copy()  # writable, and not tied to the text
