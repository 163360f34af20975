"""The GPT sizes the benchmarks train, by name (``--size`` / ``--sizes``).

Kept as the fields of ``trainer.model.GPTConfig`` so a bench's parent process can list them without
importing torch; ``gpt_config`` builds the config where the training happens.
"""

from __future__ import annotations

from typing import Any

SIZES: dict[str, dict[str, Any]] = {
    "default": {},  # GPTConfig(): 0.8M parameters, the size every CPU figure was measured on
    "wide": {"n_layer": 6, "n_head": 6, "n_embd": 384},  # ~10.7M parameters
}


def gpt_config(name: str) -> Any:
    """The ``GPTConfig`` of size ``name`` (a key of ``SIZES``)."""
    from cliffguard.trainer.model import GPTConfig

    return GPTConfig(**SIZES[name])
