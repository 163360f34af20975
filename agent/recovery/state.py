"""What a rollback restores in a loop the kit does not know: model, optimizer, scheduler, RNG
states, the agent's own state (guard window, LR scale) and, when the loader can rewind, its
position. ``LoopState`` captures all of it as one dict and loads it back.

A loader that cannot rewind gives no ``DataPosition``: a rollback then restores the weights and
the data goes on from where it is, so the batches that led to the failure are not replayed (the
"skip the bad window" recovery of PaLM).
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch


class DataPosition(Protocol):
    """A loader position the kit can save and return to."""

    def get(self) -> Any:
        """The position now (any picklable value; the position of the next batch)."""
        ...

    def seek(self, position: Any) -> None:
        """Return to a position ``get`` gave."""
        ...


class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def rng_state() -> dict[str, Any]:
    rng: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    try:
        import numpy as np

        rng["numpy"] = np.random.get_state()
    except ImportError:  # numpy is optional for the agent
        pass
    return rng


def set_rng_state(rng: Mapping[str, Any]) -> None:
    torch.set_rng_state(rng["torch"])
    random.setstate(rng["python"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
    if "numpy" in rng:
        import numpy as np

        np.random.set_state(rng["numpy"])


@contextlib.contextmanager
def rng_untouched() -> Iterator[None]:
    """Run the block and put every global RNG back as it was: what the agent runs between steps (a
    validation: a DataLoader draws its base seed from the global generator, dropout in a
    ``training_step``) must not shift the training's random stream."""
    saved = rng_state()
    try:
        yield
    finally:
        set_rng_state(saved)


@dataclass(slots=True)
class LoopState:
    """The parts of a plain loop a rollback restores. ``extra``: more named stateful objects."""

    model: torch.nn.Module
    optimizer: Any
    scheduler: Any = None
    agent: Stateful | None = None
    data: DataPosition | None = None
    extra: dict[str, Stateful] = field(default_factory=dict)

    def capture(self, step: int) -> dict[str, Any]:
        """The state before step ``step`` runs (tensors still live; the ring copies them)."""
        state: dict[str, Any] = {"step": step, "model": self.model.state_dict(),
                                 "optimizer": self.optimizer.state_dict(), "rng": rng_state()}
        if self.scheduler is not None:
            state["scheduler"] = self.scheduler.state_dict()
        if self.agent is not None:
            state["agent"] = self.agent.state_dict()
        if self.data is not None:
            state["data"] = self.data.get()
        state["extra"] = {name: part.state_dict() for name, part in self.extra.items()}
        return state

    def load(self, state: dict[str, Any]) -> int:
        """Load a captured state (an independent copy: optimizers keep the tensors they get);
        returns its step."""
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None and "scheduler" in state:
            self.scheduler.load_state_dict(state["scheduler"])
        if "rng" in state:  # a Trainer checkpoint without its rng file has none
            set_rng_state(state["rng"])
        if self.agent is not None and "agent" in state:
            self.agent.load_state_dict(state["agent"])
        if self.data is not None and "data" in state:
            self.data.seek(state["data"])
        for name, part in self.extra.items():
            if name in state.get("extra", {}):
                part.load_state_dict(state["extra"][name])
        return int(state["step"])
