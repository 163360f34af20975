"""What a rollback restored, in words, for its ack.

Read off the state that was loaded (``LoopState.capture``'s dict, the bundled trainer's, or a
Hugging Face ``checkpoint-N`` read by agent/integrations/hf_checkpoints.py), so the ack says
exactly what came back, never what a loop of another kind would have restored. One table: a key
of the state and its name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

PARTS: tuple[tuple[str, str], ...] = (
    ("model", "weights"),
    ("optimizer", "optimizer"),
    ("scheduler", "scheduler"),
    ("loss_scaler", "loss scaler"),
    ("agent", "guard window"),
    ("rng", "RNG"),
    ("data", "data position"),
    ("sampler", "data position (sampler)"),
    ("elastic", "elastic batch plan"),
)
"""State key -> what it is called in an ack, in the order the ack lists them."""
RNG_NAMES = {"torch": "torch", "cuda": "CUDA", "python": "python", "numpy": "numpy"}

NO_DATA_POSITION = "data position not saved: the loader goes on from where it is"
REPLAYED = " (one that draws its batches from the restored RNG replays the same ones)"


def describe_restored(state: Mapping[str, Any]) -> str:
    """``weights, optimizer, scheduler, guard window, RNG (torch, python, numpy), data position``,
    the extra stateful parts by name, and a note when no data position came back."""
    names: list[str] = []
    for key, name in PARTS:
        value = state.get(key)
        if value is None:
            continue
        if key == "rng":
            name = f"RNG ({', '.join(RNG_NAMES.get(str(k), str(k)) for k in value)})"
        names.append(name)
    names += [str(name) for name in (state.get("extra") or {})]
    text = ", ".join(names) or "nothing"
    if state.get("data") is None and state.get("sampler") is None:
        text += f"; {NO_DATA_POSITION}" + (REPLAYED if state.get("rng") is not None else "")
    return text
