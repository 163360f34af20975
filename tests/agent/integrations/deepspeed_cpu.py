"""DeepSpeed on CPU in the tests, without its 4.5-minute compiler run.

The CPU accelerator's first ``init_distributed`` JIT-builds ``deepspeed_shm_comm`` (a shared-memory
all-reduce, with g++ and ninja) whenever DeepSpeed's op probe calls it compatible. The tests do not
need it: with torch.distributed already initialised on gloo, DeepSpeed's ``TorchBackend`` falls
back to gloo's collectives when the op is absent. ``deepspeed.ops.__compatible_ops__`` is the dict
DeepSpeed reads that decision from (computed once per process; its own comment: edits to it
persist), so marking the op incompatible there skips the build and nothing else.
"""

from __future__ import annotations

import os


def without_shm_build() -> None:
    """Call before ``deepspeed.initialize``: no shared-memory op, so no JIT build (gloo does the work)."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def fp16_everywhere() -> None:
    """Let DeepSpeed's fp16 engine start on any CPU. Its CPU accelerator says fp16 is supported only
    where oneDNN has native fp16 kernels (``torch.ops.mkldnn._is_mkldnn_fp16_supported``: AVX512-FP16
    or AMX); elsewhere ``_do_sanity_check`` refuses the config, although torch runs half-precision
    CPU ops there too (slower). The test is about the loss scaler's overflow skips reaching the
    agent, not about the CPU's speed, so it claims support where torch can run the ops."""
    from deepspeed.accelerator import get_accelerator

    acc = get_accelerator()
    if not acc.is_fp16_supported():
        acc.is_fp16_supported = lambda: True  # type: ignore[method-assign]
