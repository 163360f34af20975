"""The Accelerate tracker: ``Accelerator(log_with=[AgentTracker(agent)])``.

Every ``accelerator.log({"loss": ..., "lr": ...}, step=...)`` becomes a ``step`` event (timing
from the interval between logs, MFU when ``tokens`` is logged). Report-only: a tracker never
sees the optimizer, so the guard's verdict is reported, not enforced, and no command is applied.
A loop that should also act uses the recovery kit (agent/recovery/kit.py).
"""

from __future__ import annotations

import logging
from typing import Any

from accelerate.tracking import GeneralTracker

from agent.hooks import Agent

log = logging.getLogger(__name__)


def _scalar(values: dict[str, Any], *names: str) -> float | None:
    for n in names:
        v = values.get(n)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
    return None


class AgentTracker(GeneralTracker):
    """Accelerate ``GeneralTracker`` that turns logged scalars into agent events (every rank)."""

    name = "cliffguard"
    requires_logging_directory = False
    main_process_only = False

    def __init__(self, agent: Agent) -> None:
        super().__init__()
        self.agent = agent
        self._started = False

    @property
    def tracker(self) -> Agent:
        return self.agent

    def store_init_configuration(self, values: dict) -> None:
        if not self._started:
            self.agent.start(config=dict(values))
            self._started = True

    def log(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        if not self._started:
            self.store_init_configuration({})
        loss = _scalar(values, "loss", "train_loss")
        if loss is None:
            return
        tokens = _scalar(values, "tokens")
        self.agent.report_step(loss, step=step, lr=_scalar(values, "lr", "learning_rate"),
                               grad_norm=_scalar(values, "grad_norm"), tokens=int(tokens or 0))

    def finish(self) -> None:
        self.agent.close()
