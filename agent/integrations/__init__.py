"""The agent inside the trainers people use. Which to use:

- **Plain loop**: ``agent.hooks.Agent`` plus the recovery kit (``agent.recovery.RecoveryKit``):
  the guard enforced before ``optimizer.step()``, every command applied at step boundaries, the
  hold and controller-silence timeouts.
- **Accelerate tracker** (``AgentTracker``, agent/integrations/accelerate.py): report-only.
- **Hugging Face ``Trainer``** (``CliffguardCallback``, agent/integrations/hf.py): the kit driven
  from a real ``TrainerCallback``. ``transformers`` is imported only when that name is used, so
  ``from agent.integrations import AgentTracker`` works without it installed.
"""

from __future__ import annotations

from typing import Any

from agent.integrations.accelerate import AgentTracker

__all__ = ["AgentTracker", "CliffguardCallback"]


def __getattr__(name: str) -> Any:
    if name == "CliffguardCallback":
        from agent.integrations.hf import CliffguardCallback

        return CliffguardCallback
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
