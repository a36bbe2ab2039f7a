"""Values a prediction reads back (predict/emulate/values.py): known ones answered exactly, a random draw by its
median draw, anything else 1; each answer not known exactly named with where the code asked."""

from __future__ import annotations

import pytest
import torch

from membench.predict.emulate import fake
from membench.predict.run import predict
from tests.helpers import spec


def test_values_made_from_numbers_follow_the_ops_on_them():
    """An optimizer's step count: made from a number, added to in place (one at a time and as a foreach list)."""
    with fake.fake_tensors() as values:
        step = torch.tensor(0.0)
        step += 1
        steps = [torch.tensor(0.0) for _ in range(3)]
        for _ in range(2):
            torch._foreach_add_(steps, torch.tensor(1.0), alpha=1.0)
        scale = torch.full((), 4.0)
        assert step.item() == 1.0 and (step * 3).item() == 3.0
        assert [s.item() for s in steps] == [2.0, 2.0, 2.0]
        assert (scale.sqrt() + step).item() == 3.0
    assert values.answered() == []  # known exactly: nothing to name


def test_a_random_draw_answers_its_median_draw_and_says_so():
    """LayerDrop's `torch.rand([]) < p` keeps the layer for p <= 0.5, and always for p = 0 (certain)."""
    with fake.fake_tensors() as values:
        draw = torch.rand([])
        kept = [not bool(draw < p) for p in (0.1, 0.0, 0.7)]
        uniform = torch.empty(()).uniform_(2.0, 4.0).item()
    assert kept == [True, True, False] and uniform == 3.0
    answered = values.answered()
    assert len(answered) == 4 and all(__file__.rpartition("/")[2] in a for a in answered)
    assert "answered False, the median draw's (other draws give True)" in answered[0]
    assert "False for every value the draw can take" in answered[1]
    assert "answered True, the median draw's (other draws give False)" in answered[2]


def test_a_value_the_prediction_does_not_have_answers_one_and_is_named():
    with fake.fake_tensors() as values:
        x = torch.empty(10)
        for _ in range(3):
            assert bool(x.any()) is True
        assert (x.sum() > 0).item() is True
    first, second = values.answered()
    assert first.endswith("a tensor's value, which a prediction does not have: answered True (3x)")
    assert "test_values.py" in second and second.endswith("answered True")


def test_a_shape_that_depends_on_values_is_refused_with_where():
    where = r"aten\.\w+.* at \S*tests/predict/emulate/test_values\.py:\d+ "
    with fake.fake_tensors(), pytest.raises(fake.NeedsValues, match=where):
        x = torch.empty(10)
        x[x > 0]


OPT = ("hf:opt,num_hidden_layers=4,hidden_size=64,word_embed_proj_dim=64,ffn_dim=128,num_attention_heads=2,"
       "vocab_size=256,max_position_embeddings=64")


def test_layerdrop_keeps_every_layer_and_says_so():
    """transformers' OPT decoder draws `torch.rand([]) < layerdrop` for each layer in training: every answer was
    true, all layers were skipped and the prediction came out low. Now a layerdrop of 0.1 keeps all four layers
    (the memory of layerdrop 0, which draws nothing) and names the four answers."""
    pytest.importorskip("transformers")
    plain = predict(spec(OPT, batch_size=2, device="cuda", seq_len=32))
    dropping = predict(spec(OPT + ",layerdrop=0.1", batch_size=2, device="cuda", seq_len=32))
    assert plain.status == dropping.status == "ok"
    assert dropping.memory.peak_allocated_bytes == plain.memory.peak_allocated_bytes
    assert not plain.assumed
    (said,) = dropping.assumed
    assert said.startswith("transformers/models/opt/modeling_opt.py:")
    assert said.endswith("a random draw's outcome: answered False, the median draw's (other draws give True) (4x)")
