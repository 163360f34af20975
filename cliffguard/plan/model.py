"""A decoder-only transformer's shape, its parameter count and its training FLOPs per token.

The counts follow Narayanan et al. 2021 ("Efficient Large-Scale Language Model Training on GPU
Clusters", §5.1): a layer holds 12h² + 13h parameters (attention 4h², MLP 8h², biases and
layer norms 13h), the embedding Vh + sh; a forward pass costs 24h² + 4sh FLOPs per token per layer
(the matmuls plus the attention scores) and the logits 2Vh; a backward pass twice the forward.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum


class Recompute(StrEnum):
    NONE = "none"
    SELECTIVE = "selective"  # only the attention core (scores, softmax, dropout) is recomputed
    FULL = "full"  # each layer's forward is rerun in the backward pass from its stored input


# Hidden size per layer of the published GPT-3 family (GPT-3 175B: 96 layers, hidden 12288) and
# a head dimension of 128: the shape `ModelShape.from_params` assumes.
ASPECT_RATIO = 128
HEAD_DIM = 128
DEFAULT_SEQ = 2048
DEFAULT_VOCAB = 51200  # GPT-2's 50257 padded to a multiple of 1024, as in Megatron-LM


@dataclass(frozen=True)
class ModelShape:
    layers: int
    hidden: int
    heads: int
    vocab: int = DEFAULT_VOCAB
    seq: int = DEFAULT_SEQ

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "heads", "vocab", "seq"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name}: must be a positive integer, got {value!r}")
        if self.hidden % self.heads:
            raise ValueError(f"heads: {self.heads} does not divide hidden {self.hidden}")

    @classmethod
    def from_params(cls, params: float, vocab: int = DEFAULT_VOCAB, seq: int = DEFAULT_SEQ) -> ModelShape:
        """The GPT-3-proportioned shape closest to ``params``: hidden = 128·layers, heads of 128,
        layers rounded to a multiple of 4 so that pipeline degrees 2 and 4 divide them."""
        if not math.isfinite(params) or params <= 0:
            raise ValueError(f"params: must be a positive number, got {params!r}")
        layers_exact = (params / (12 * ASPECT_RATIO**2)) ** (1 / 3)
        layers = max(4, 4 * round(layers_exact / 4))
        hidden = ASPECT_RATIO * layers
        return cls(layers=layers, hidden=hidden, heads=hidden // HEAD_DIM, vocab=vocab, seq=seq)

    @property
    def params_per_layer(self) -> int:
        return 12 * self.hidden**2 + 13 * self.hidden

    @property
    def embedding_params(self) -> int:
        return (self.vocab + self.seq) * self.hidden  # token + learned position embeddings, tied output

    @property
    def params(self) -> int:
        return self.layers * self.params_per_layer + self.embedding_params

    def forward_flops_per_token_per_layer(self) -> float:
        return 24.0 * self.hidden**2 + 4.0 * self.seq * self.hidden

    def train_flops_per_token(self, recompute: Recompute = Recompute.NONE) -> float:
        """FLOPs the hardware runs per trained token: forward + backward (3 forwards) plus the
        recomputation. With full recomputation this is Narayanan et al.'s 96·l·h²(1 + s/6h + V/16lh)."""
        layer_fwd = self.forward_flops_per_token_per_layer()
        extra = {
            Recompute.NONE: 0.0,
            Recompute.SELECTIVE: 4.0 * self.seq * self.hidden,  # the attention scores and weighted sum
            Recompute.FULL: layer_fwd,
        }[Recompute(recompute)]
        return self.layers * (3 * layer_fwd + extra) + 6.0 * self.vocab * self.hidden

    def model_flops_per_token(self) -> float:
        """Useful FLOPs per token (no recomputation): the numerator of MFU."""
        return self.train_flops_per_token(Recompute.NONE)
