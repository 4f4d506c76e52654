"""A small decoder-only transformer over bytes: the model of the reference workloads.

Token embedding plus learned positions, ``n_layers`` pre-LayerNorm blocks (causal self-attention through
``torch.nn.functional.scaled_dot_product_attention``, then a GELU MLP), a final LayerNorm and an output projection
tied to the token embedding. The defaults are sized to train a few hundred steps in well under a minute on two CPU
cores; ``ModelConfig`` is the one place they live.
"""
from __future__ import annotations

import math
from typing import Annotated, Any, Optional

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field, model_validator
from torch import nn

__all__ = ["ModelConfig", "ByteTransformer"]


class ModelConfig(BaseModel):
    """Shape of a ``ByteTransformer``: a frozen pydantic model, validated on construction; unknown keys are refused."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    vocab_size: Annotated[int, Field(ge=2, le=65536)] = 256
    context: Annotated[int, Field(ge=2, le=4096)] = 64
    d_model: Annotated[int, Field(ge=8, le=4096)] = 128
    n_layers: Annotated[int, Field(ge=1, le=64)] = 2
    n_heads: Annotated[int, Field(ge=1, le=64)] = 4
    mlp_ratio: Annotated[int, Field(ge=1, le=16)] = 4
    dropout: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.0

    @model_validator(mode="after")
    def _heads_divide_width(self) -> "ModelConfig":
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be a multiple of n_heads ({self.n_heads})")
        return self

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump()


class _CausalSelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads = cfg.n_heads
        self.dropout = cfg.dropout
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.resid_drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.n_heads, c // self.n_heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0
        )
        return self.resid_drop(self.proj(y.transpose(1, 2).reshape(b, t, c)))


class _Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = _CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.d_model, cfg.mlp_ratio * cfg.d_model),
            nn.GELU(),
            nn.Linear(cfg.mlp_ratio * cfg.d_model, cfg.d_model),
            nn.Dropout(cfg.dropout),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class ByteTransformer(nn.Module):
    """``forward(tokens[B, T], targets=None) -> (logits[B, T, vocab], loss or None)``; ``T <= config.context``."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)
        self.pos_emb = nn.Embedding(config.context, config.d_model)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(_Block(config) for _ in range(config.n_layers))
        self.ln_f = nn.LayerNorm(config.d_model)
        self.head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.head.weight = self.tok_emb.weight  # tied
        self.apply(self._init_weights)
        # GPT-2's scaling of the residual projections keeps the residual stream's variance flat with depth.
        for name, p in self.named_parameters():
            if name.endswith("proj.weight") or name.endswith("mlp.2.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layers))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def forward(
        self, tokens: torch.Tensor, targets: Optional[torch.Tensor] = None
    ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        t = tokens.shape[1]
        if t > self.config.context:
            raise ValueError(f"sequence length {t} exceeds the model's context {self.config.context}")
        pos = torch.arange(t, device=tokens.device)
        x = self.drop(self.tok_emb(tokens) + self.pos_emb(pos))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss
