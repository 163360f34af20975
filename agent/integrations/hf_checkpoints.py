"""Rollback targets for the Hugging Face callback: the kit's memory ring first, else the Trainer's
own ``checkpoint-N`` directories (those ``on_save`` reported as checkpoint events).

A directory is read as the Trainer writes it: ``model.safetensors`` (or ``pytorch_model.bin``),
``optimizer.pt``, ``scheduler.pt`` and ``rng_state[_<rank>].pth``. Weights a model ties (GPT-2's
``lm_head``) are not in the file; they keep the live model's tensors, which the tied source
overwrites anyway. The guard's window and the LR scale are not in these files: a rollback from
disk keeps the current guard and sets the command's LR scale as always. Files are the Trainer's
own, written by this run, and loaded with ``weights_only=False`` (they hold RNG states).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from cliffguard.agent.recovery.store import StateStore
from cliffguard.core.enums import CheckpointKind


class TrainerCheckpoints:
    """A ``StateStore``: ``inner`` (the kit's ring store) first, then the noted ``checkpoint-N`` dirs."""

    def __init__(self, inner: StateStore, model: torch.nn.Module, rank: int = 0) -> None:
        self.inner = inner
        self.model = model
        self.rank = rank
        self.dirs: dict[int, Path] = {}

    def note_saved(self, step: int, path: str | Path) -> None:
        self.dirs[int(step)] = Path(path)

    def _disk(self) -> dict[int, Path]:
        return {s: d for s, d in self.dirs.items() if (d / "optimizer.pt").is_file()}

    def available_steps(self) -> list[int]:
        return sorted(set(self.inner.available_steps()) | set(self._disk()))

    def restore(self, step: int, discard_newer: bool = True) -> tuple[dict[str, Any], str]:
        if step in self.inner.available_steps():
            return self.inner.restore(step, discard_newer)
        path = self._disk().get(step)
        if path is None:
            raise KeyError(f"step {step}: not in the memory ring nor a Trainer checkpoint (have {self.available_steps()})")
        state = self._load(step, path)
        if discard_newer:
            self.discard_after(step)
        return state, f"disk ({path.name})"

    def _load(self, step: int, path: Path) -> dict[str, Any]:
        weights: dict[str, torch.Tensor]
        if (path / "model.safetensors").is_file():
            from safetensors.torch import load_file

            weights = load_file(str(path / "model.safetensors"))
        else:
            weights = torch.load(path / "pytorch_model.bin", map_location="cpu", weights_only=True)
        model = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        unknown = set(weights) - set(model)
        if unknown:
            raise KeyError(f"{path}: weights the model does not have: {sorted(unknown)[:3]}")
        model.update(weights)
        state: dict[str, Any] = {"step": step, "model": model,
                                 "optimizer": torch.load(path / "optimizer.pt", map_location="cpu", weights_only=False)}
        if (path / "scheduler.pt").is_file():
            state["scheduler"] = torch.load(path / "scheduler.pt", map_location="cpu", weights_only=False)
        rng_file = next((f for f in (path / f"rng_state_{self.rank}.pth", path / "rng_state.pth") if f.is_file()), None)
        if rng_file is not None:
            rng = torch.load(rng_file, map_location="cpu", weights_only=False)
            state["rng"] = {"torch": rng["cpu"], "python": rng["python"], "numpy": rng["numpy"],
                            **({"cuda": rng["cuda"]} if "cuda" in rng else {})}
        return state  # without an rng file the RNG goes on as it is (and the ack says it was not restored)

    def discard_after(self, step: int) -> None:
        self.inner.discard_after(step)
        self.dirs = {s: d for s, d in self.dirs.items() if s <= step}  # the Trainer's files stay; we forget them

    def on_step(self, step: int, state_fn: Callable[[], dict[str, Any]]) -> list[CheckpointKind]:
        return self.inner.on_step(step, state_fn)

    def save(self, step: int, state: dict[str, Any], kind: CheckpointKind | str = CheckpointKind.MEMORY) -> None:
        self.inner.save(step, state, kind)
