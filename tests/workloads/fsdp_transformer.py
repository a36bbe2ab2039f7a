"""The transformer PyTorch's own FSDP2 memory test trains (test/distributed/_composable/fsdp/
test_fully_shard_memory.py: ModelArgs(vocab_size=32, n_layers=3, dim=768, n_heads=12, weight_tying=False), the
toy Transformer of torch.testing._internal.distributed._tensor.common_dtensor), written out here with the same
modules and shapes: that module needs expecttest, which membench does not install. Its defaults kept:
max_seq_len 16, dropout 0.1, causal attention."""

import torch
import torch.nn.functional as F
from torch import nn

from membench.workloads import Workload

VOCAB, LAYERS, DIM, HEADS, MAX_SEQ, DROPOUT = 32, 3, 768, 12, 16, 0.1
TOKENS = 4  # the test's input: torch.randint(0, vocab_size, (1, 4)) at batch size 1


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(DIM, DIM, bias=False) for _ in range(4))
        self.resid_dropout = nn.Dropout(DROPOUT)

    def forward(self, x):
        bsz, seq, _ = x.shape
        q, k, v = (w(x).view(bsz, seq, HEADS, DIM // HEADS).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        out = F.scaled_dot_product_attention(q, k, v, None, DROPOUT if self.training else 0, True)
        return self.resid_dropout(self.wo(out.transpose(1, 2).reshape(bsz, seq, -1)))


class FeedForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1, self.gelu, self.w2 = nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM)
        self.resid_dropout = nn.Dropout(DROPOUT)

    def forward(self, x):
        return self.resid_dropout(self.w2(self.gelu(self.w1(x))))


class TransformerBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention_norm, self.attention = nn.LayerNorm(DIM), Attention()
        self.ffn_norm, self.feed_forward = nn.LayerNorm(DIM), FeedForward()

    def forward(self, x):
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok_embeddings, self.pos_embeddings = nn.Embedding(VOCAB, DIM), nn.Embedding(MAX_SEQ, DIM)
        self.dropout = nn.Dropout(DROPOUT)
        self.layers = nn.ModuleList(TransformerBlock() for _ in range(LAYERS))
        self.norm, self.output = nn.LayerNorm(DIM), nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens) + self.pos_embeddings(torch.arange(0, tokens.shape[1], device=tokens.device))
        h = self.dropout(h)
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h)).float()


def transformer() -> Workload:
    """The test's step: forward, loss.sum().backward(), Adam."""
    return Workload(
        build_model=Transformer,
        make_batch=lambda batch_size, generator: (torch.randint(0, VOCAB, (batch_size, TOKENS), generator=generator),),
        loss_fn=lambda model, batch: model(batch[0]).sum(),
        blocks=lambda model: list(model.layers),
    )


def adam_single_tensor(params, lr: float) -> torch.optim.Optimizer:
    """The test's optimizer: Adam with foreach=False ("intermediates increase peak memory")."""
    return torch.optim.Adam(params, lr=lr, foreach=False)
