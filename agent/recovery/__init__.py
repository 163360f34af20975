"""The recovery kit: the trainer side of every command, for any training loop (agent/recovery/kit.py).

``RecoveryKit`` (kit.py) implements ``agent.command_target.CommandTarget``; ``MemoryRing`` (ring.py)
keeps rollback snapshots; ``LoopState`` (state.py) says what a rollback restores; timeouts.py holds
the hold and controller-silence policies; ``KitConfig`` (config.py) is ``[agent.recovery]``.

Names are loaded on first use, so reading the config (agent/config.py) does not import the
runtime (agent/hooks.py).
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "Boundary": "boundary", "KitConfig": "config", "RecoveryKit": "kit", "RollbackUnavailable": "kit", "MemoryRing": "ring",
    "cpu_copy": "ring", "DataPosition": "state", "LoopState": "state", "RingStore": "store",
    "StateStore": "store", "Timeout": "timeouts", "apply_timeout": "timeouts", "timed_out": "timeouts",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"cliffguard.agent.recovery.{_WHERE[name]}"), name)
