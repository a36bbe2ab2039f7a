"""A GPT-style decoder-only Transformer in plain torch (pre-norm blocks, scaled_dot_product_attention)."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from membench.workloads.base import Batch, Workload


@dataclass(frozen=True)
class GPTConfig:
    layers: int
    heads: int
    dim: int
    vocab: int
    seq_len: int


CONFIGS = {
    "gpt-tiny": GPTConfig(layers=2, heads=2, dim=64, vocab=256, seq_len=64),
    "gpt-mini": GPTConfig(layers=4, heads=4, dim=128, vocab=1024, seq_len=256),
    "gpt-small": GPTConfig(layers=12, heads=12, dim=768, vocab=50304, seq_len=1024),  # GPT-2 small
    "gpt-medium": GPTConfig(layers=24, heads=16, dim=1024, vocab=50304, seq_len=1024),  # GPT-2 medium
}


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.heads = cfg.heads
        self.ln1 = nn.LayerNorm(cfg.dim)
        self.qkv = nn.Linear(cfg.dim, 3 * cfg.dim)
        self.proj = nn.Linear(cfg.dim, cfg.dim)
        self.ln2 = nn.LayerNorm(cfg.dim)
        self.fc = nn.Linear(cfg.dim, 4 * cfg.dim)
        self.out = nn.Linear(4 * cfg.dim, cfg.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab, cfg.dim)
        self.pos = nn.Embedding(cfg.seq_len, cfg.dim)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.ln = nn.LayerNorm(cfg.dim)
        self.head = nn.Linear(cfg.dim, cfg.vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.head(self.hidden(idx))

    def hidden(self, idx: torch.Tensor) -> torch.Tensor:
        """The last hidden states, before the output projection (chunked-ce projects them itself)."""
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        for block in self.blocks:
            x = block(x)
        return self.ln(x)


def lm_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    tokens, targets = batch
    logits = model(tokens)
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def lm_split(model: nn.Module, batch: Batch) -> tuple:
    """Hidden states, output projection and targets (already the next tokens: make_batch shifts them)."""
    tokens, targets = batch
    return model.hidden(tokens), model.head, targets


def gpt(name: str, seq_len: int | None = None) -> Workload:
    """seq_len (--seq-len) replaces the config's context length, position embeddings included."""
    cfg = CONFIGS[name] if seq_len is None else dataclasses.replace(CONFIGS[name], seq_len=seq_len)

    def make_batch(batch_size: int, generator: torch.Generator) -> Batch:
        seq = torch.randint(0, cfg.vocab, (batch_size, cfg.seq_len + 1), generator=generator)
        return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()

    return Workload(
        build_model=functools.partial(GPT, cfg),
        make_batch=make_batch,
        loss_fn=lm_loss,
        causal_lm=lm_split,
        blocks=lambda model: list(model.blocks),
        items_per_sample=cfg.seq_len,
        unit="tokens",
    )
