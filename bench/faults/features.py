"""Features other branches are adding, probed in this checkout by what they leave in the source.

A scenario that ``requires`` one of these is skipped (``feature missing``) until it is merged;
the probe looks for the feature's own names, so a partial port does not count as present.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _has(path: str, *needles: str) -> Callable[[], bool]:
    def probe() -> bool:
        p = REPO / path
        files = [p] if p.is_file() else sorted(p.rglob("*.py")) if p.is_dir() else []
        text = "\n".join(f.read_text(errors="replace") for f in files)
        return bool(text) and all(n in text for n in needles)
    return probe


def _has_any(path: str, *needles: str) -> Callable[[], bool]:
    probes = [_has(path, n) for n in needles]
    return lambda: any(p() for p in probes)


FEATURES: dict[str, tuple[str, Callable[[], bool]]] = {
    # i11-keys
    "ed25519-commands": ("i11-keys: Ed25519 command keys", _has("core/keys.py", "Ed25519PrivateKey")),
    "signed-events": ("i11-keys: per-run event signatures checked by the controller",
                      _has("controller/edge.py", "EVENT_SIG_HEADER")),
    "step-jump-bounds": ("i11-keys: steps bounded relative to the run's last step",
                         _has("controller/bounds.py", "STEP_JUMP")),
    # i11-store
    "store-retry": ("i11-store: store errors retried with backoff, never skipped",
                    _has("controller/store/errors.py", "class Backoff")),
    "store-gone-exits": ("i11-store: a lost/read-only store stops the controller non-zero",
                         _has("controller/store/errors.py", "class StoreLost")),
    "health-endpoint": ("i11-store: controller liveness/readiness over HTTP", _has("controller", "/healthz")),
    "oversized-dlq": ("i11-store: oversized messages reach the DLQ truncated", _has("controller/edge.py", "DLQ_KEEP_BYTES")),
    "broker-child-dies": ("i11-store: the Tansu child dies with `cliffguard broker`",
                          _has_any("controller/broker.py", "PDEATHSIG", "prctl", "dies with its parent")),
    # i10-kit
    "pause-timeout": ("i10-kit: a controller pause times out on the trainer side",
                      _has("agent/recovery/config.py", "pause_timeout_s")),
}


def missing(feature: str | None) -> str | None:
    """None when ``feature`` is present (or none is required), else what is missing."""
    if feature is None:
        return None
    what, probe = FEATURES[feature]
    return None if probe() else what
