"""The 8-bit, 4-bit and paged optimizers' state in a prediction against each library's own allocation.

The parameters straddle both libraries' small-tensor threshold (4096 elements: bitsandbytes' min_8bit_size, torchao's
`numel() >= 4096`) and torchao's block-size rule (`numel() % block_size == 0`): 4095, 4096 and 4097 elements, and a
64-element bias. The bytes are derived by hand from each library's source (predict/emulate/lowbit_optimizers.py).
"""

from __future__ import annotations

import pytest
import torch

from membench import optimizers
from membench.common.errors import UserError
from membench.predict.emulate.lowbit_optimizers import LowBitStandIn
from membench.predict.run import predict_memory
from tests.helpers import spec

SHAPES = [(63, 65), (64, 64), (4097,), (64,)]  # 4095, 4096, 4097, 64 elements

# bitsandbytes: under 4096 elements two fp32 states; from 4096 two uint8 states and two fp32 absmax per 256 elements
# (rounded up); one pair of 256-entry fp32 quantization maps per optimizer.
BNB = (2 * 4 * 4095  # (63, 65): fp32
       + 2 * 4096 + 2 * 4 * 16  # (64, 64): uint8, 16 blocks
       + 2 * 4097 + 2 * 4 * 17  # (4097,): uint8, 17 blocks (4097 = 16 * 256 + 1)
       + 2 * 4 * 64  # bias: fp32
       + 2 * 4 * 256)  # qmap1, qmap2
# torchao: a 0-dim fp32 step per parameter; quantized only where numel >= 4096 and numel % block == 0, so (64, 64)
# alone; the others zeros_like(p) (fp32 here) per state. Per quantized state: codes, fp32 scale per block, qmap.
STEPS = 4 * 4
TORCHAO_PLAIN = 2 * 4 * (4095 + 4097 + 64)
TORCHAO = {
    "torchao-adamw8bit": STEPS + TORCHAO_PLAIN + 2 * (4096 + 4 * (4096 // 256) + 4 * 256),
    "torchao-adamw4bit": STEPS + TORCHAO_PLAIN + 2 * (4096 // 2 + 4 * (4096 // 128) + 4 * 16),
    "torchao-adamwfp8": STEPS + TORCHAO_PLAIN + 2 * (4096 + 4 * (4096 // 256)),
}


def _params():
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(shape)) for shape in SHAPES]
    for p in params:
        p.grad = torch.randn_like(p)
    return params


def _state_bytes(optimizer) -> int:
    """Bytes of the distinct storages the optimizer's state holds (a torchao subclass through its inner tensors)."""
    seen, total = set(), 0

    def add(t):
        nonlocal total
        if hasattr(t, "__tensor_flatten__"):
            for name in t.__tensor_flatten__()[0]:
                add(getattr(t, name))
            return
        storage = t.untyped_storage()
        if storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            total += storage.nbytes()

    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                add(value)
    return total


def _library(name: str, monkeypatch):
    pytest.importorskip(optimizers.LIBRARY[name][2])
    if name.startswith("torchao"):
        # torchao's step makes the state, then compiles the update (seconds on CPU): the update is skipped.
        monkeypatch.setattr(torch, "compile", lambda fn, **kw: lambda *a, **k: None)
    opt = optimizers.make(name, _params(), lr=1e-3)
    opt.step()
    return opt


@pytest.mark.parametrize("name", ["adamw8bit", "paged-adamw8bit"])
def test_bitsandbytes_state_as_the_library_allocates_it(name, monkeypatch):
    assert _state_bytes(_library(name, monkeypatch)) == BNB
    stand_in = LowBitStandIn(_params(), 1e-3, name, cuda=False)
    stand_in.step()
    assert _state_bytes(stand_in) == BNB


@pytest.mark.parametrize("name", sorted(TORCHAO))
def test_torchao_state_as_the_library_allocates_it(name, monkeypatch):
    assert _state_bytes(_library(name, monkeypatch)) == TORCHAO[name]
    stand_in = LowBitStandIn(_params(), 1e-3, name, cuda=True)
    stand_in.step()
    assert _state_bytes(stand_in) == TORCHAO[name]


def test_paged_state_from_1e5_elements_is_unified_memory():
    """get_state_buffer pages a state of at least 1e5 elements on CUDA: the two uint8 states of a 100,000-element
    parameter (200,000 B), not its absmax, nor a 99,999-element parameter's states."""
    paged = []

    def make_paged(p, dtype):
        paged.append(torch.zeros_like(p, dtype=dtype))
        return paged[-1]

    params = [torch.nn.Parameter(torch.zeros(100_000)), torch.nn.Parameter(torch.zeros(99_999))]
    for p in params:
        p.grad = torch.zeros_like(p)
    stand_in = LowBitStandIn(params, 1e-3, "paged-adamw8bit", cuda=True, paged=make_paged)
    stand_in.step()
    assert sum(t.nbytes for t in paged) == 2 * 100_000
    assert all(stand_in.state[params[0]][key] is t for key, t in zip(("state1", "state2"), paged))


@pytest.mark.slow  # two predictions of an hf model (the stand-in's paging is checked above, by default)
def test_paged_state_is_neither_allocated_nor_reserved_in_a_prediction():
    """hf:llama with a 2048-token vocabulary and hidden size 64: the embedding and the untied LM head have 131,072
    elements each, so their four uint8 states (524,288 B) are paged; the device keeps the same state less those."""
    workload = ("hf:llama,num_hidden_layers=1,hidden_size=64,intermediate_size=128,num_attention_heads=2,"
                "num_key_value_heads=2,vocab_size=2048")
    plain, paged = (predict_memory(spec(workload, batch_size=1, seq_len=16, optimizer=name, device="cuda",
                                        gpu="A10G"))
                    for name in ("adamw8bit", "paged-adamw8bit"))
    assert paged.off_device.unified_bytes == 4 * 2048 * 64
    assert plain.current_breakdown["optimizer_state"] - paged.current_breakdown["optimizer_state"] == 4 * 2048 * 64


def test_a_library_optimizer_without_its_library_is_one_line_with_the_install_hint(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "torchao.optim", None)  # importing it raises ImportError
    with pytest.raises(UserError, match=r"needs torchao, which is not installed: pip install 'membench\[finetune\]'"):
        optimizers.check("torchao-adamw4bit")


def test_an_optimizer_the_installed_library_lacks_is_one_line(monkeypatch):
    monkeypatch.setitem(optimizers.LIBRARY, "adamw8bit", ("bitsandbytes.optim", "NoSuchAdamW", "bitsandbytes"))
    with pytest.raises(UserError, match=r"^optimizer adamw8bit: bitsandbytes.optim has no NoSuchAdamW in the "
                                        r"installed bitsandbytes [\d.]+; upgrade bitsandbytes$"):
        optimizers.check("adamw8bit")


def test_a_cpu_run_of_a_torchao_optimizer_is_refused_before_it_runs():
    pytest.importorskip("torchao")
    from membench.api import plan

    with pytest.raises(UserError, match="torchao compiles its step, which cannot run under the storage tracker"):
        plan("gpt-tiny", "baseline", 2, "cpu", optimizer="torchao-adamw8bit")
