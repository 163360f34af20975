"""Short, declared collective timeouts and the Flight Recorder, for every process group the agent
makes or is given.

torch's default process-group timeout is 30 minutes for gloo (10 for NCCL): one dead or stuck
peer holds every survivor that long. ``init_kwargs`` gives ``init_process_group`` (or
Accelerate's ``InitProcessGroupKwargs``) the ``[agent.hang] collective_timeout_s``; for a group
that exists already (the user's, Accelerate's) ``apply_timeout`` sets it on the group's backend
(torch's ``_set_pg_timeout``, the one call that changes an existing group's timeout).

``enable_flight_recorder`` sets ``TORCH_FR_BUFFER_SIZE`` before a group is made, so each rank's
ring of collectives (torch 2.13's gloo records natively: sequence numbers enqueued, started and
completed per group) is there to dump when it hangs (agent/hang/evidence.py).
"""

from __future__ import annotations

import datetime
import logging
import os
from collections.abc import MutableMapping
from typing import Any

import torch.distributed as dist

log = logging.getLogger(__name__)

FR_ENV = "TORCH_FR_BUFFER_SIZE"
DEFAULT_TORCH_TIMEOUT_S = 1800.0
"""torch's default for gloo (``torch.distributed.constants.default_pg_timeout``)."""


def enable_flight_recorder(entries: int, env: MutableMapping[str, str] | None = None) -> bool:
    """Set ``TORCH_FR_BUFFER_SIZE`` to ``entries`` unless already set (a user's own value wins).
    Must run before the process group is made. True when the recorder will record."""
    env = os.environ if env is None else env
    if entries and not env.get(FR_ENV) and not env.get("TORCH_NCCL_TRACE_BUFFER_SIZE"):
        env[FR_ENV] = str(entries)
    try:
        return int(env.get(FR_ENV) or env.get("TORCH_NCCL_TRACE_BUFFER_SIZE") or 0) > 0
    except ValueError:
        return False


def timeout(seconds: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=seconds)


def init_kwargs(seconds: float) -> dict[str, Any]:
    """Keyword arguments for ``dist.init_process_group`` / ``dist.new_group``."""
    return {"timeout": timeout(seconds)}


def apply_timeout(seconds: float, group: Any = None) -> bool:
    """Give ``group`` (default: the world) a collective timeout of ``seconds``. False, with a
    warning naming the reason, when it cannot be set (no group, a backend torch cannot change)."""
    if not (dist.is_available() and dist.is_initialized()):
        return False
    try:
        from torch.distributed.distributed_c10d import _set_pg_timeout

        _set_pg_timeout(timeout(seconds), group)
    except Exception as exc:  # noqa: BLE001 - a timeout we cannot set is said, never fatal
        log.warning("cannot set a %.0f s collective timeout on %s: %s; a hung peer holds this rank for the "
                    "group's own timeout", seconds, "the world group" if group is None else group, exc)
        return False
    return True
