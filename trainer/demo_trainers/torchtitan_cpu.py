"""torchtitan on CPU, for the demo and the tests only (agent/integrations/torchtitan.py never imports it).

torchtitan 0.3.0 has no CPU path: it picks "cuda" when no accelerator is visible, reads memory
statistics ``torch.cpu`` lacks, compiles FlexAttention with Inductor, lets FSDP reduce gradients with
PREMUL_SUM (gloo has none) and calls ``torch.distributed.set_timeout`` (torch 2.13.0 has none).
``on_cpu()`` patches exactly those seams in torchtitan's modules (idempotent, before the trainer is
built); with ``parallelism.spmd_backend = "partial_dtensor"`` its debug Llama then trains on gloo
processes with FSDP and saves and loads its DCP checkpoints. ``TokenTokenizer`` and
``TokenBatches`` stand in for the Hugging Face tokenizer and dataset the debug config names (not
in the wheel): token ids from a callable, each sample one document.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist
from torchtitan.components.dataloader import BaseDataLoader
from torchtitan.components.tokenizer import BaseTokenizer

BatchFn = Callable[[int, int, int], "torch.Tensor | tuple[torch.Tensor, torch.Tensor]"]
"""``batch_fn(position, dp_rank, dp_world)``: this rank's share, ``[B, T+1]`` int64 token ids or an
``(inputs, targets)`` pair of ``[B, T]``."""


def _cpu_device() -> SimpleNamespace:
    """What torchtitan asks of ``torch.cuda`` (device name, memory statistics), answered for the CPU."""
    return SimpleNamespace(
        set_device=lambda device: None, current_device=lambda: 0, device_count=lambda: 1,
        get_device_name=lambda device=None: "cpu", synchronize=lambda device=None: None,
        get_device_properties=lambda device=None: SimpleNamespace(total_memory=1 << 34, name="cpu"),
        reset_peak_memory_stats=lambda device=None: None, empty_cache=lambda: None,
        memory_stats=lambda device=None: {}, is_available=lambda: True)


def _sum_reduction(fully_shard: Callable[..., Any]) -> Callable[..., Any]:
    def shard(*args: Any, **kwargs: Any) -> Any:
        out = fully_shard(*args, **kwargs)
        # gloo has no PREMUL_SUM: FSDP then divides before and after a plain SUM itself
        for module in out if isinstance(out, list) else [out]:
            module.set_force_sum_reduction_for_comms(True)
        return out

    shard.cliffguard_cpu = True  # type: ignore[attr-defined]
    return shard


def on_cpu() -> None:
    """Patch torchtitan for gloo processes on CPU (see the module docstring). Call before building."""
    import torch.nn.attention.flex_attention as flex
    import torchtitan.components.metrics as metrics
    import torchtitan.distributed.fsdp as fsdp
    import torchtitan.distributed.parallel_dims as parallel_dims
    import torchtitan.distributed.utils as dist_utils
    import torchtitan.models.common.attention as attention
    import torchtitan.models.common.token_dispatcher as token_dispatcher
    import torchtitan.tools.utils as tools

    device = _cpu_device()
    for module in (tools, metrics, parallel_dims, dist_utils, token_dispatcher):
        if hasattr(module, "device_type"):
            module.device_type = "cpu"
        if hasattr(module, "device_module"):
            module.device_module = device
    local = lambda: torch.device("cpu")  # noqa: E731 - one CPU "device" per process, not cpu:<rank>
    tools.get_local_device = dist_utils.get_local_device = local
    # eager FlexAttention: its reference implementation (torch's own debug switch), which has a
    # backward on CPU; the compiled CPU kernel has none and refuses inputs that require grad
    flex._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG = True
    flex._validate_device = lambda query, key, value: None
    attention.FlexAttention._compiled_flex_attn = flex.flex_attention
    attention._compiled_create_block_mask = flex.create_block_mask
    if not getattr(fsdp.fully_shard, "cliffguard_cpu", False):
        fsdp.fully_shard = _sum_reduction(fsdp.fully_shard)
    if not hasattr(dist, "set_timeout"):  # torch 2.13.0 lacks it; the timeouts stay as created
        dist.set_timeout = lambda timeout, group=None: None  # type: ignore[attr-defined]


class TokenTokenizer(BaseTokenizer):
    """A tokenizer of no text: the batches already are token ids below ``vocab_size``."""

    @dataclass(kw_only=True, slots=True)
    class Config(BaseTokenizer.Config):
        vocab_size: int = 2048

    def __init__(self, config: Config | None = None, *, tokenizer_path: str = "") -> None:
        super().__init__()
        self.vocab_size = (config or self.Config()).vocab_size

    def encode(self, *args: Any, **kwargs: Any) -> list[int]:
        raise NotImplementedError("TokenTokenizer has no text: its batches are token ids")

    def decode(self, *args: Any, **kwargs: Any) -> str:
        raise NotImplementedError("TokenTokenizer has no text: its batches are token ids")

    def get_vocab_size(self) -> int:
        return self.vocab_size


class TokenBatches(BaseDataLoader):
    """torchtitan's ``(input_dict, labels)`` batches from ``Config.batch_fn``, one per position, in
    order; its position is its state (so torchtitan's checkpoints carry it)."""

    @dataclass(kw_only=True, slots=True)
    class Config(BaseDataLoader.Config):
        batch_fn: BatchFn | None = None
        """``(position, dp_rank, dp_world)`` -> this rank's batch (required; see ``BatchFn``)."""
        length: int = 10**6
        """Positions before the loader ends (or starts again at 0, when ``infinite``)."""
        infinite: bool = False
        """Start again at 0 after ``length`` positions (torchtitan's validator sets it)."""

        def __post_init__(self) -> None:
            if self.length < 1:
                raise ValueError("length must be at least 1")

    def __init__(self, config: Config, *, dp_world_size: int, dp_rank: int, tokenizer: Any = None,
                 seq_len: int = 0, local_batch_size: int = 0, snapshot_every_n_steps: int | None = None) -> None:
        if config.batch_fn is None:
            raise ValueError("TokenBatches.Config.batch_fn: give the function that makes the batches")
        self.config = dataclasses.replace(config)
        self.dp_world_size, self.dp_rank = dp_world_size, dp_rank
        self.position = 0

    def __iter__(self) -> Iterator[tuple[dict[str, torch.Tensor], torch.Tensor]]:
        fn = self.config.batch_fn
        assert fn is not None
        while self.position < self.config.length or self.config.infinite:
            ids = fn(self.position % self.config.length, self.dp_rank, self.dp_world_size)
            self.position += 1
            x, y = ids if isinstance(ids, tuple) else (ids[:, :-1], ids[:, 1:])
            positions = torch.arange(x.shape[1]).expand_as(x).contiguous()  # one document per sample
            yield {"input": x, "positions": positions}, y

    def state_dict(self) -> dict[str, Any]:
        # one key per rank, as torchtitan's own loader: a DCP checkpoint keeps one value per key
        return {f"dp_rank_{self.dp_rank}": self.position}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.position = int(state_dict[f"dp_rank_{self.dp_rank}"])
