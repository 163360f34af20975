"""The agent inside the trainers people use. Which to use:

- **Plain loop**: ``guarded_loop(model, optimizer, scheduler, run=...)`` (agent/integrations/loop.py):
  the agent and the recovery kit (``agent.recovery.RecoveryKit``) behind ``batches``/``backward``/
  ``step``: the guard enforced before ``optimizer.step()``, every command applied at step
  boundaries, the hold and controller-silence timeouts. ``accelerator=`` makes it an Accelerate loop.
- **Accelerate** (agent/integrations/accelerate.py): ``AgentTracker`` is report-only (its run
  declares no command: the controller alerts, never pauses); ``accelerate_kit(accelerator, model,
  optimizer, scheduler, run=...)`` is the recovery kit for an Accelerator loop in one line.
- **Lightning** (``CliffguardLightningCallback`` in agent/integrations/lightning.py, extra ``[lightning]``):
  the kit driven from a real ``pytorch_lightning.Callback``.
- **DeepSpeed** (``attach(engine, run=...)`` in agent/integrations/deepspeed.py, extra ``[deepspeed]``):
  the kit on a ``DeepSpeedEngine``, its ``backward``/``step``/``save_checkpoint`` wrapped; rollback
  from the ring of this rank's ZeRO partitions or from the engine's own checkpoint tags.
- **torchtitan** (``guarded(config, run=...)`` in a config module, agent/integrations/torchtitan.py,
  extra ``[torchtitan]``): ``CliffguardTrainer``, torchtitan's ``Trainer`` with the kit at its seams;
  rollback from the ring of this rank's FSDP shards or from its checkpointer's saved steps.
- **Hugging Face ``Trainer``** (``CliffguardHFCallback``, agent/integrations/hf.py): the kit driven
  from a real ``TrainerCallback``. ``transformers`` is imported only when that name is used, so
  ``from cliffguard.agent.integrations import AgentTracker`` works without it installed.
"""

from __future__ import annotations

from typing import Any

from cliffguard.agent.integrations.accelerate import AgentTracker, accelerate_kit
from cliffguard.agent.integrations.loop import GuardedLoop, guarded_loop

__all__ = ["AgentTracker", "CliffguardHFCallback", "GuardedLoop", "accelerate_kit", "guarded_loop"]


def __getattr__(name: str) -> Any:
    if name == "CliffguardHFCallback":
        from cliffguard.agent.integrations.hf import CliffguardHFCallback

        return CliffguardHFCallback
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
