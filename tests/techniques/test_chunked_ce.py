"""chunked-ce: the logits projected and upcast one chunk of tokens at a time (torchtune's CEWithChunkedOutputLoss),
against Hugging Face's ForCausalLMLoss, which upcasts the whole logits tensor. Every byte derived by hand.

B=2 sequences of T=64 tokens, hidden size D=32, a vocabulary of V=8192, in bf16: N = B*T = 128 tokens,
F = N*V*4 = 4,194,304 B (the logits in fp32), H = F/2 (in bf16), 8 chunks of 16 tokens.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from membench.common.errors import UserError
from membench.predict.run import predict_memory
from membench.techniques.chunked_ce import chunked_loss
from membench.trackers.storage import StorageTracker
from tests.helpers import spec

B, T, D, V = 2, 64, 32, 8192
F = B * T * V * 4
H = F // 2

# Hugging Face's peak is in backward, at log_softmax's backward: its saved fp32 log-probabilities (F), nll_loss's
# gradient (F) and log_softmax's gradient (F); the loss (4 B) and backward's seed gradient (4 B). The bf16 logits
# and their fp32 copy were freed when the forward returned (log_softmax saves only its output).
HF_PEAK = 3 * F + 4 + 4
# chunked-ce's peak is in forward, at the last chunk's cross-entropy: the 8 chunks' bf16 logits (H in all), their
# saved fp32 log-probabilities (F in all), the last chunk's fp32 copy (F/8); each chunk's hidden states copied
# contiguous for the matmul and saved (8 x 16 x 32 x 2 B) and its labels flattened (8 x 16 x 8 B); the count of
# tokens (int64), nll_loss's total_weight per chunk (8 x 4 B), the last chunk's loss (4 B) and the running sum (4 B).
CHUNKED_PEAK = H + F + F // 8 + 8 * 16 * D * 2 + 8 * 16 * 8 + 8 + 8 * 4 + 4 + 4


def _loss_peak(loss_fn) -> int:
    """The peak the loss's forward and backward add to what exists before (the hidden states, the head, labels)."""
    torch.manual_seed(0)
    head = nn.Linear(D, V, bias=False).to(torch.bfloat16)
    labels = torch.randint(0, V, (B, T))
    hidden = torch.randn(B, T, D, dtype=torch.bfloat16, requires_grad=True)
    targets = nn.functional.pad(labels, (0, 1), value=-100)[..., 1:].contiguous()
    tracker = StorageTracker()
    tracker.track_all([head.weight, labels, hidden, targets], "inputs")
    before = tracker.current
    with tracker:
        loss_fn(hidden, head, labels, targets).backward()
    return tracker.peak.bytes - before


def test_chunked_ce_upcasts_one_chunk_at_a_time_where_hugging_face_upcasts_all():
    from transformers.loss.loss_utils import ForCausalLMLoss

    assert _loss_peak(lambda h, head, labels, targets: ForCausalLMLoss(head(h), labels, V)) == HF_PEAK
    assert _loss_peak(lambda h, head, labels, targets: chunked_loss(h, head, targets)) == CHUNKED_PEAK


@pytest.mark.slow  # two predictions of an hf model: 9 s (the loss's own bytes are checked above, by default)
def test_chunked_ce_lowers_a_causal_lm_prediction_by_the_logits_tensors():
    """The whole step, predicted: the same difference, less the targets chunked-ce's split keeps through the
    forward (B x T int64, 1,024 B; Hugging Face's shifted labels are gone by its backward's peak). All else live
    at the two peaks is the same: parameters, optimizer state, the batch, the trunk's saved activations."""
    workload = f"hf:llama,num_hidden_layers=1,hidden_size={D},intermediate_size=64,num_attention_heads=2," \
               f"num_key_value_heads=2,vocab_size={V}"
    base = predict_memory(spec(workload, ("bf16",), batch_size=B, seq_len=T, device="cpu"))
    chunked = predict_memory(spec(workload, ("bf16", "chunked-ce"), batch_size=B, seq_len=T, device="cpu"))
    assert (base.peak_phase, chunked.peak_phase) == ("backward", "forward")
    assert base.peak_source.startswith("3 fp32 logits-sized tensors (4.00 MiB each: 128 tokens x 8192 vocabulary")
    assert chunked.peak_source is None  # no tensor of the whole logits' size is left
    assert base.peak_allocated_bytes - chunked.peak_allocated_bytes == HF_PEAK - CHUNKED_PEAK - B * T * 8


def test_the_chunked_loss_is_the_mean_over_the_same_tokens():
    torch.manual_seed(0)
    head = nn.Linear(D, V, bias=False)
    hidden, targets = torch.randn(B, T, D), torch.randint(0, V, (B, T))
    targets[0, -1] = -100
    whole = nn.functional.cross_entropy(head(hidden).flatten(0, 1), targets.flatten(), ignore_index=-100)
    torch.testing.assert_close(chunked_loss(hidden, head, targets), whole)


def test_chunked_ce_needs_a_causal_lm():
    from membench.api import plan

    with pytest.raises(UserError, match="chunked-ce needs a causal language model"):
        plan("vit-tiny", "chunked-ce", 2, "cpu")
