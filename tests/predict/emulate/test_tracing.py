"""transformers sees no fake tensor while a prediction runs (predict/emulate/tracing.py): its `is_tracing(tensor)`
counts a FakeTensor as tracing and then takes export's paths, which a run on real tensors never takes."""

from __future__ import annotations

import pytest
import torch

from membench.predict.emulate import fake

transformers = pytest.importorskip("transformers")
masking_utils = pytest.importorskip("transformers.masking_utils")
import_utils = pytest.importorskip("transformers.utils.import_utils")

B, L, V, E = 4, 512, 1000, 64


def test_a_fake_tensor_is_not_tracing_inside_a_prediction_and_is_again_after():
    with fake.fake_tensors():
        x = torch.empty(2)
        assert not import_utils.is_tracing(x)
    assert import_utils.is_tracing(x)  # outside, transformers' own answer again


def test_one_sequence_per_row_is_found_as_on_real_tensors():
    # position_ids 0..L-1 in every row: one sequence per row, None on real tensors; inside a prediction the read
    # (packed[:, -1] == 0).all() is answered True (predict/emulate/values.py), so None too, where it was the
    # [B, L] packed-sequence tensor before (and create_causal_mask then built a full mask).
    real = torch.arange(L).expand(B, L)
    assert masking_utils.find_packed_sequence_indices(real) is None
    with fake.fake_tensors():
        assert masking_utils.find_packed_sequence_indices(torch.arange(L).expand(B, L)) is None


def test_gpt2_attends_causally_without_a_mask_as_on_a_gpu(monkeypatch):
    # On real tensors create_causal_mask returns None (SDPA runs is_causal=True); inside a prediction it built the
    # full [B, 1, L, L] boolean mask, which SDPA turned into a float bias (4 MiB here) kept by memory-efficient
    # attention for backward, in every layer.
    modeling_gpt2 = pytest.importorskip("transformers.models.gpt2.modeling_gpt2")
    made = []
    original = modeling_gpt2.create_causal_mask

    def create_causal_mask(*args, **kwargs):
        made.append(original(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(modeling_gpt2, "create_causal_mask", create_causal_mask)
    config = transformers.GPT2Config(n_layer=1, n_embd=E, n_head=2, vocab_size=V, n_positions=L,
                                     bos_token_id=0, eos_token_id=0, attn_implementation="sdpa")
    with torch.device("meta"):
        model = transformers.GPT2LMHeadModel(config)
    with fake.fake_tensors():
        fake.materialize(model)
        model(input_ids=torch.randint(0, V, (B, L)), use_cache=False)  # as in training: no cache
    assert made == [None]
