"""A small GPT (nanoGPT-style): token + position embeddings, pre-LN blocks, tied LM head.

Byte-level by default (``vocab_size=256``). The default size is chosen so one training step
(forward + backward + AdamW) on a micro-batch of 4 sequences of 64 bytes takes roughly
30–80 ms per process when two processes share two CPU cores with one thread each — the setup
``torchrun --nproc_per_node 2`` runs here (measured ~50 ms; 0.83 M parameters).

``flops_per_token`` follows the PaLM appendix-B formula ``6N + 12·L·H·Q·T`` (N = non-embedding
parameters, L layers, H heads, Q head dim, T sequence length): the 6N term is the dense matmuls
of forward + backward, the second term the attention score/value matmuls, which do not appear
in N. nanoGPT's ``estimate_mfu`` is the same formula.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.nn import functional as F

from cliffguard.core.declared import bounded, check_declared


@dataclass(kw_only=True, slots=True)
class GPTConfig:
    n_layer: int = bounded(4, ge=1)
    """Transformer blocks (L)."""
    n_head: int = bounded(4, ge=1)
    """Attention heads per block (H)."""
    n_embd: int = 128
    """Model width; the head dim Q is n_embd // n_head."""
    block_size: int = bounded(64, ge=2)
    """Context length: the longest sequence the position embedding covers."""
    vocab_size: int = bounded(256, ge=2)
    """Vocabulary; 256 = raw bytes."""
    dropout: float = bounded(0.0, ge=0, lt=1)
    """Dropout on attention, residual and embedding outputs (0 keeps steps deterministic)."""

    def __post_init__(self) -> None:
        check_declared(self)
        if self.n_embd < 1 or self.n_embd % self.n_head:
            raise ValueError("n_embd: must be a positive multiple of n_head")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.resid_dropout = nn.Dropout(cfg.dropout)
        self.dropout = cfg.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q = q.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
        k = k.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
        v = v.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True
        )
        y = y.transpose(1, 2).contiguous().view(b, t, c)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd)
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(cfg.vocab_size, cfg.n_embd),
                wpe=nn.Embedding(cfg.block_size, cfg.n_embd),
                drop=nn.Dropout(cfg.dropout),
                h=nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)]),
                ln_f=nn.LayerNorm(cfg.n_embd),
            )
        )
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        # Weight tying (as GPT-2): the output projection is the token embedding.
        self.transformer.wte.weight = self.lm_head.weight
        self.apply(self._init_weights)
        # GPT-2's scaled init of residual projections keeps the residual stream's variance flat in depth.
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def num_params(self, non_embedding: bool = False) -> int:
        """Parameter count; ``non_embedding`` leaves out the position embedding (the token
        embedding stays: it is tied to the LM head, which is a real matmul per token)."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.transformer.wpe.weight.numel()
        return n

    def flops_per_token(self, seq_len: int | None = None) -> float:
        """Training FLOPs per token (forward + backward), PaLM: ``6N + 12·L·H·Q·T``."""
        t = self.cfg.block_size if seq_len is None else seq_len
        c = self.cfg
        return 6.0 * self.num_params(non_embedding=True) + 12.0 * c.n_layer * c.n_head * c.head_dim * t

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        _, t = idx.shape
        if t > self.cfg.block_size:
            raise ValueError(f"idx: sequence length {t} exceeds block_size {self.cfg.block_size}")
        pos = torch.arange(t, dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.reshape(-1))
        return logits, loss
