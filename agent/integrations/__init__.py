"""The agent inside the trainers people use. Which to use:

- **Plain loop**: ``agent.hooks.Agent`` plus the recovery kit (``agent.recovery.RecoveryKit``):
  the guard enforced before ``optimizer.step()``, every command applied at step boundaries, the
  hold and controller-silence timeouts.
- **Accelerate** (agent/integrations/accelerate.py): ``AgentTracker`` is report-only (its run
  declares no command: the controller alerts, never pauses); ``accelerate_kit(accelerator, model,
  optimizer, scheduler, run=...)`` is the recovery kit for an Accelerator loop in one line.
- **Lightning** (``CliffguardLightningCallback`` in agent/integrations/lightning.py, extra ``[lightning]``):
  the kit driven from a real ``pytorch_lightning.Callback``.
- **Hugging Face ``Trainer``** (``CliffguardHFCallback``, agent/integrations/hf.py): the kit driven
  from a real ``TrainerCallback``. ``transformers`` is imported only when that name is used, so
  ``from agent.integrations import AgentTracker`` works without it installed.
"""

from __future__ import annotations

from typing import Any

from cliffguard.agent.integrations.accelerate import AgentTracker, accelerate_kit

__all__ = ["AgentTracker", "CliffguardCallback", "CliffguardHFCallback", "accelerate_kit"]


def __getattr__(name: str) -> Any:
    if name in ("CliffguardHFCallback", "CliffguardCallback"):  # the second: the former name, in README.md
        from cliffguard.agent.integrations.hf import CliffguardHFCallback

        return CliffguardHFCallback
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
