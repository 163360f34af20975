"""The content of the data faults (trainer/faults.py): what a batch becomes under ``data_shift``,
``dup_burst`` and ``garble``. Pure functions of (batch, step, rank, seed), so a fault corrupts the
same way in every run; trainer/fault_wrappers.py applies them in the sampler.

- ``shifted``: every sequence is a window of another corpus, the prose of the Python documentation
  (``pydoc_data.topics``, on every Python install: no download), where the default corpus is code.
- ``garbled``: every other sequence as a broken decode leaves text: about one byte in six replaced
  by the replacement character U+FFFD (``EF BF BD``) and one in twenty by a control byte.
- ``dup_burst`` needs no content: the sampler hands out the burst's first batch again.
"""

from __future__ import annotations

import functools

import torch

_REPLACEMENT = (0xEF, 0xBF, 0xBD)


@functools.cache
def prose_tokens() -> torch.Tensor:
    """The Python documentation's prose as byte tokens (uint8)."""
    from pydoc_data.topics import topics

    text = "\n\n".join(topics[k] for k in sorted(topics)).encode("utf-8")
    return torch.frombuffer(bytearray(text), dtype=torch.uint8)


def _generator(seed: int, step: int, rank: int) -> torch.Generator:
    return torch.Generator().manual_seed(hash((seed, step, rank, 0xDA7A)) & 0x7FFF_FFFF)  # ints: the same every process


def _split(window: torch.Tensor, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    window = window.to(dtype=like.dtype, device=like.device)
    return window[:, :-1].contiguous(), window[:, 1:].contiguous()


def shifted(x: torch.Tensor, y: torch.Tensor, step: int, rank: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch's sequences replaced by windows of the prose corpus (inputs and next-byte targets)."""
    prose = prose_tokens()
    n, t = x.shape
    starts = torch.randint(0, prose.numel() - t - 1, (n,), generator=_generator(seed, step, rank))
    window = prose[starts.unsqueeze(1) + torch.arange(t + 1).unsqueeze(0)].long()
    return _split(window, x)


def garbled(x: torch.Tensor, y: torch.Tensor, step: int, rank: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every other sequence (0, 2, ...) garbled (see the module docstring); the rest unchanged."""
    gen = _generator(seed, step, rank)
    window = torch.cat([x, y[:, -1:]], dim=1).cpu().clone()
    t = window.shape[1]
    for row in range(0, window.shape[0], 2):
        out: list[int] = []
        draws = torch.rand(t, generator=gen).tolist()
        controls = torch.randint(1, 9, (t,), generator=gen).tolist()
        for byte, u, c in zip(window[row].tolist(), draws, controls, strict=True):
            if u < 1 / 6:
                out.extend(_REPLACEMENT)
            elif u < 1 / 6 + 1 / 20:
                out.append(c)
            else:
                out.append(byte)
            if len(out) >= t:
                break
        window[row] = torch.tensor(out[:t], dtype=window.dtype)
    return _split(window, x)
