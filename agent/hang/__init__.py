"""Hangs: short collective timeouts, a watchdog that dumps each rank's Flight Recorder and stacks
when its training thread stalls, the restart command, and a restarted group's node check.

``HangConfig`` (config.py) is ``[agent.hang]``; ``HangPart`` (part.py) is the agent's part;
evidence.py captures, watchdog.py watches, node_check.py checks, timeouts.py sets the timeouts.
Names are loaded on first use, so reading the config does not import torch's distributed runtime.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "HangConfig": "config", "HangPart": "part", "NotThisLife": "part", "Evidence": "evidence",
    "capture": "evidence", "is_collective_error": "evidence", "Watchdog": "watchdog", "run_check": "node_check",
    "judge": "node_check", "CheckResult": "node_check", "apply_timeout": "timeouts",
    "enable_flight_recorder": "timeouts", "init_kwargs": "timeouts",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"cliffguard.agent.hang.{_WHERE[name]}"), name)
