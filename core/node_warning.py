"""A node's scheduler warning, as its launcher and its workers tell each other (issue 24, "shrink,
don't kill").

An elastic production run spans several node-group jobs joined by one c10d rendezvous. When the
scheduler preempts one group, only that group must leave; the others save with it and go on at the
smaller world. Two facts cross the process boundary, through small files beside the restart plan
(``[agent.hang] plan_dir``: the job's one shared directory, as the checkpoints already need):

- ``warned-<node>.json``: the node's launcher (``cliffguard train``) got the scheduler's warning.
  Its workers need it because a worker cannot tell the scheduler's SIGTERM from the one torchrun's
  elastic agent sends its workers on every membership change (a node joining): only the launcher
  receives the first and never the second.
- ``left-<node>.json``: the launcher stopped its torchrun agent after its workers saved, so the
  node cannot join the next rendezvous round. The nodes that stay wait for it before leaving for
  their own restart: a warned node's agent still alive when they re-form would be counted in the
  new world and never start its workers (the survivors would wait out the rendezvous timeout).

Everything read back is checked (a file half written, from another run, or not JSON counts as absent).
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


def _name(kind: str, node: str) -> str:
    return f"{kind}-{_SAFE.sub('_', node)[:100]}.json"


def _write(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)  # atomic: a reader sees the old file or the whole new one


def _read(path: Path, node: str) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("node") != node or not isinstance(data.get("at"), (int, float)):
        return None
    return data


def warned_path(plan_dir: str | Path, node: str) -> Path:
    return Path(plan_dir) / _name("warned", node)


def first_warned_since(plan_dir: str | Path, since: float) -> float | None:
    """The earliest time any node's launcher wrote a warning at or after ``since`` (None: none)."""
    times = []
    for path in Path(plan_dir).glob("warned-*.json"):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        at = data.get("at") if isinstance(data, dict) else None
        if isinstance(at, (int, float)) and at >= since:
            times.append(float(at))
    return min(times) if times else None


def left_path(plan_dir: str | Path, node: str) -> Path:
    return Path(plan_dir) / _name("left", node)


def write_warned(plan_dir: str | Path, node: str, signal_name: str, at: float | None = None) -> None:
    _write(warned_path(plan_dir, node), {"node": node, "signal": signal_name, "at": time.time() if at is None else at})


def read_warned(plan_dir: str | Path, node: str, since: float) -> dict[str, Any] | None:
    """The node's warning if its launcher wrote one at or after ``since`` (wall time), else None."""
    data = _read(warned_path(plan_dir, node), node)
    return data if data is not None and data["at"] >= since else None


def write_left(plan_dir: str | Path, node: str) -> None:
    _write(left_path(plan_dir, node), {"node": node, "at": time.time()})


def has_left(plan_dir: str | Path, node: str, since: float) -> bool:
    data = _read(left_path(plan_dir, node), node)
    return data is not None and data["at"] >= since


def clear(plan_dir: str | Path, node: str) -> None:
    """A fresh launch of the node (a requeued job starting again) forgets its last warning."""
    for path in (warned_path(plan_dir, node), left_path(plan_dir, node), saved_path(plan_dir, node)):
        try:
            path.unlink()
        except FileNotFoundError:
            pass


def saved_path(plan_dir: str | Path, node: str) -> Path:
    return Path(plan_dir) / _name("saved", node)


def write_saved(plan_dir: str | Path, node: str, step: int) -> None:
    """The warned node's workers saved (every rank's share of the checkpoint is written): its
    launcher may stop them now."""
    _write(saved_path(plan_dir, node), {"node": node, "at": time.time(), "step": step})


def has_saved(plan_dir: str | Path, node: str, since: float) -> bool:
    data = _read(saved_path(plan_dir, node), node)
    return data is not None and data["at"] >= since
