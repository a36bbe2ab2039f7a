"""benchmarks/software_2022.py, which the Hugging Face table of the real-GPU validation uses to predict what that
doc's torch (1.10 or 1.9) and transformers 4.18 kept: softmax saving its input, BERT adding an fp32 all-zeros mask,
torch 1.9's CUDA autocast running gelu in fp32, the engine summing gradients out of place, clipping one gradient at
a time. Each checked on CPU against what is expected by hand."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
pytest.importorskip("transformers")
from software_2022 import early_2022  # noqa: E402


def saved_bytes(fn) -> int:
    """Bytes of the distinct storages autograd saves while fn runs."""
    storages = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(storages.values())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_softmax_saves_its_input_too_and_its_gradient_is_unchanged(dtype):
    x = (torch.randn(2, 3, 8, 8) * 3).to(dtype).requires_grad_()
    grad = torch.randn(2, 3, 8, 8).to(dtype)
    element = torch.tensor([], dtype=dtype).element_size()

    today = saved_bytes(lambda: F.softmax(x * 1, dim=-1))
    with early_2022():
        then = saved_bytes(lambda: F.softmax(x * 1, dim=-1))
        (expected,) = torch.autograd.grad(F.softmax(x * 1, dim=-1), x, grad)
    assert today == 2 * 3 * 8 * 8 * element  # the output
    assert then == 2 * today  # and the input (x * 1, a tensor of its own)
    (actual,) = torch.autograd.grad(F.softmax(x * 1, dim=-1), x, grad)
    assert torch.equal(expected, actual)
    assert F.softmax is not None and F.softmax.__name__ == "softmax"  # restored on leaving


def test_bert_keeps_one_fp32_score_matrix_more_per_layer():
    from transformers import BertConfig, BertForSequenceClassification

    layers, heads, batch, seq = 2, 2, 3, 8
    config = BertConfig(vocab_size=50, hidden_size=8, num_hidden_layers=layers, num_attention_heads=heads,
                        intermediate_size=16, max_position_embeddings=seq, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0, attn_implementation="eager")
    torch.manual_seed(0)
    model = BertForSequenceClassification(config).train()
    ids = torch.randint(0, 50, (batch, seq))

    def step():
        return model(input_ids=ids, labels=torch.zeros(batch, dtype=torch.long)).loss

    today = saved_bytes(step)
    with early_2022():
        then = saved_bytes(step)
    # Each layer's softmax input (scores + the mask, float32) is kept as well; nothing else changes.
    assert then - today == layers * batch * heads * seq * seq * 4


@pytest.mark.parametrize(("version", "gelu_dtype"), [("1.9", torch.float32), ("1.10", torch.float16)])
def test_torch_1_9s_cuda_autocast_runs_gelu_in_fp32(version, gelu_dtype):
    from membench.predict.emulate import autocast

    before = autocast.cuda_lists
    x = torch.randn(4, 8, dtype=torch.float16)
    with early_2022(version), autocast.cuda_policy(), torch.autocast("cpu", dtype=torch.float16):
        assert F.gelu(x).dtype == gelu_dtype
        assert F.layer_norm(x, (8,)).dtype == torch.float32  # the rest of CUDA's policy as before
    assert autocast.cuda_lists is before


def test_an_unknown_torch_version_is_refused():
    with pytest.raises(ValueError, match="one of 1.9, 1.10"), early_2022("2.0"):
        pass


def test_the_engine_sums_two_gradients_out_of_place_as_torch_before_pytorch_88339_did():
    from membench.predict import gpus
    from membench.predict.emulate import fake
    from membench.predict.emulate.kernels import CudaKernels
    from membench.trackers.storage import StorageTracker

    n, v = 64, 1000
    full = n * v * 4  # one fp32 (64, 1000) gradient

    def backward_peak() -> int:
        """Peak live bytes in backward above those before it, of a CUDA prediction where y feeds two nodes."""
        with fake.fake_tensors():
            tracker = StorageTracker()
            tracker.kernels = CudaKernels(gpus.gpu("V100"), workspace_bytes=0)
            with tracker:
                x = torch.randn(n, v, requires_grad=True)
                y = x.exp()
                loss = (y * 3 + y * 5).sum()
                before = tracker.current
                tracker.reset_peak()
                loss.backward()
            return tracker.peak.bytes - before

    today = backward_peak()
    with early_2022():
        then = backward_peak()
    assert today == 2 * full + 4  # the two gradients reaching y (the second added into the first), the loss's
    assert then == 3 * full + 4  # and their sum, a third tensor, while both are alive
    assert backward_peak() == today  # restored on leaving


def test_gradients_are_clipped_one_at_a_time_as_torch_before_2_0_did():
    from membench.predict import gpus
    from tests.helpers import cuda_trace

    def clip():
        params = [torch.nn.Parameter(torch.empty(n)) for n in (10, 20, 30)]
        for p in params:
            p.grad = torch.empty(p.shape)
        torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)  # as membench's step clips fake CUDA gradients

    today = cuda_trace(clip, gpus.gpu("V100"))
    with early_2022():
        then = cuda_trace(clip, gpus.gpu("V100"))
    # Past the parameters and gradients (6 allocations), before the coefficient (9 events) and their frees (6):
    four, twelve = ("alloc", 4), ("alloc", 12)
    # today: _foreach_norm's partial norms (3 x 4 B) before its three 0-dim outputs; their stack and its norm; the
    # stack let go, then the norms as clip_grad_norm_'s _get_total_norm returns
    assert today[6:-15] == [twelve, four, four, four, ("free", 12), twelve, four, ("free", 12), *[("free", 4)] * 3]
    # torch 1.10: a norm per gradient, their stack (the list of norms let go as it returns), the stack's norm
    assert then[6:-15] == [four, four, four, twelve, *[("free", 4)] * 3, four, ("free", 12)]
    assert today[:6] == then[:6] and today[-15:] == then[-15:]
    assert cuda_trace(clip, gpus.gpu("V100")) == today  # restored on leaving
