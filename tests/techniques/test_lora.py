"""lora and qlora on a one-layer Llama: only the adapters have gradients and optimizer state, and qlora's base weights
are bitsandbytes' 4-bit layout, to the byte derived by hand; odd input is one line."""

from __future__ import annotations

import importlib.util

import pytest

from membench.cli import main
from membench.common.errors import UserError
from tests.helpers import measure

pytest.importorskip("peft")
pytest.importorskip("bitsandbytes")

LLAMA = ("hf:llama,num_hidden_layers=1,hidden_size=64,intermediate_size=128,num_attention_heads=4,"
         "num_key_value_heads=2,vocab_size=256")
HEAD_DIM = 64 // 4
# (out, in) of the layer's linear weights: q, k, v, o (k and v: 2 key/value heads of 16), gate, up, down
LINEARS = [(64, 64), (2 * HEAD_DIM, 64), (2 * HEAD_DIM, 64), (64, 64), (128, 64), (128, 64), (64, 128)]
RANK = 8
# peft's default target modules for llama (TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING): q_proj, v_proj.
# Each gets lora_A [r, in] and lora_B [out, r], fp32.
ADAPTER_BYTES = 4 * (RANK * 64 + 64 * RANK + RANK * 64 + 2 * HEAD_DIM * RANK)  # 7,168 B
# Adam: exp_avg and exp_avg_sq like each adapter, and one fp32 `step` scalar per parameter (4 of them).
ADAM_BYTES = 2 * ADAPTER_BYTES + 4 * 4


def nf4_layer_bytes(n: int, k: int) -> int:
    """What bitsandbytes 0.50.2 stores for one [n, k] weight, NF4 with double quantization (functional.quantize_4bit
    with compress_statistics, blocks of 64; the absmax quantized by quantize_blockwise in blocks of 256)."""
    elements = n * k
    blocks = -(-elements // 64)
    packed = (elements + 1) // 2  # two 4-bit values per uint8
    absmax = blocks  # uint8, one per block
    offset = 4  # the absmax's mean, an fp32 scalar
    nested_absmax = 4 * -(-blocks // 256)  # fp32, one per 256 blocks
    nested_code = 4 * 256  # the 8-bit dynamic map, copied per layer (code.to(device, copy=True))
    quant_map = 4 * 16  # the NF4 table (get_4bit_type), per layer
    return packed + absmax + offset + nested_absmax + nested_code + quant_map


@pytest.fixture(scope="module")
def runs():
    # --zero-grad zeros keeps the gradients after the step, so the steady state shows them beside the state.
    options = dict(batch_size=2, seq_len=32, zero_grad="zeros")
    return {name: measure(LLAMA, techniques, **options, **extra).memory.current_breakdown
            for name, techniques, extra in (("baseline", (), {}), ("lora", ("lora",), {}),
                                            ("lora-bf16", ("lora",), {"base_dtype": "bf16"}),
                                            ("qlora", ("qlora",), {}))}


def test_only_the_adapters_have_gradients_and_optimizer_state(runs):
    base, lora = runs["baseline"], runs["lora"]
    assert lora["gradients"] == ADAPTER_BYTES and lora["optimizer_state"] == ADAM_BYTES
    assert lora["parameters"] == base["parameters"] + ADAPTER_BYTES  # the base is all there, frozen
    # over a bf16 base peft keeps the adapters fp32 (autocast_adapter_dtype): the same gradients and state
    assert runs["lora-bf16"]["gradients"] == ADAPTER_BYTES and runs["lora-bf16"]["optimizer_state"] == ADAM_BYTES


def test_qlora_base_weights_are_bitsandbytes_4bit_layout(runs):
    # qlora keeps the unquantized base (embeddings, norms, LM head) in bf16, its compute dtype: the lora run over a
    # bf16 base, with each linear weight of the layer (bf16, 2 B a weight) replaced by its NF4 layout.
    bf16_linears = sum(2 * n * k for n, k in LINEARS)
    nf4 = sum(nf4_layer_bytes(n, k) for n, k in LINEARS)
    qlora = runs["qlora"]
    assert qlora["parameters"] == runs["lora-bf16"]["parameters"] - bf16_linears + nf4
    assert qlora["gradients"] == ADAPTER_BYTES and qlora["optimizer_state"] == ADAM_BYTES
    assert qlora["other"] == 4 * 256  # bitsandbytes' dynamic map, cached once at the first quantization


@pytest.mark.parametrize("args, message", [
    (["--techniques", "lora", "--lora-rank", "0"], "--lora-rank must be an integer from 1 to 2147483647, got 0"),
    (["--techniques", "lora", "--lora-targets", "q_proj,nope"],
     "--lora-targets: the model has no linear layer 'nope'; valid: down_proj, gate_proj, k_proj, lm_head, o_proj, "
     "q_proj, up_proj, v_proj, or all-linear"),
    (["--techniques", "lora+qlora"], "cannot combine lora with qlora"),
    (["--techniques", "qlora", "--compute-dtype", "fp8"], "argument --compute-dtype: invalid choice: 'fp8'"),
])
def test_odd_input_is_one_line(capsys, args, message):
    try:
        code = main(["predict", "--workload", LLAMA, "--seq-len", "32", "--batch-size", "1", *args])
    except SystemExit as exit:  # argparse's own refusals
        code = exit.code
    assert code == 2
    # one line of membench's (a library imported on the way may log warnings of its own: torchao's via torch)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("membench")]
    assert len(lines) == 1 and message in lines[0]


def test_without_the_packages_they_are_refused_with_the_install_hint(monkeypatch):
    from membench.techniques import lora

    find = importlib.util.find_spec
    monkeypatch.setattr(lora.importlib.util, "find_spec", lambda name, *a: None if name == "bitsandbytes"
                        else find(name, *a))
    with pytest.raises(UserError, match=r'^technique qlora needs bitsandbytes, which is not installed: pip install '
                                        r'-e "\.\[finetune\]"$'):
        lora.need("bitsandbytes", "qlora")


def test_the_verdict_says_what_an_adapter_trains_and_checks_the_base_stayed_frozen():
    import torch

    from membench.equivalence import Trained, _adapter_verdict
    from membench.spec import RunSpec
    from membench.techniques import resolve

    run = RunSpec(workload=LLAMA, batch_size=2, techniques=("lora",))
    stack = resolve(run)
    base, a = torch.zeros(6), torch.zeros(2)

    def trained(base_after, losses):
        state = {"parameters": {"w": base_after, "w.lora_A": a + 1}, "optimizer state": {"w.lora_A:exp_avg": a}}
        return Trained({"w": base, "w.lora_A": a}, {}, state, losses, set())

    ref = trained(base, [1.0, 0.9])
    verdict = _adapter_verdict(run, stack, ref, trained(base, [1.0, 0.85]), 2)
    assert verdict.verdict == "precision" and verdict.detail.startswith(
        "trains an adapter, not the baseline's model: 2 of 8 parameters (25%) train, the other 1 tensors stay frozen")
    moved = _adapter_verdict(run, stack, ref, trained(base + 1, [1.0, 0.85]), 2)
    assert moved.verdict == "not-equivalent" and "1 frozen base tensors changed (w)" in moved.detail
