"""bitsandbytes' and torchao's 8-bit, 4-bit and paged AdamW in a prediction: their state as each library makes it.

Neither library's step runs on fake tensors: bitsandbytes builds its quantization maps from values when the
optimizer is made (functional.create_dynamic_map reads a tensor back), and torchao compiles its step, which
torch.compile refuses under a dispatch mode such as the storage tracker. A prediction steps a stand-in instead that
makes each parameter's state with the library's dtypes and shapes, in its order, and updates it in place as the
library's kernels do. Read from bitsandbytes 0.50.2 and torchao 0.18.0 (tests/predict/test_lowbit_optimizers.py
holds the stand-in's state against each library's own, byte for byte).

bitsandbytes (optim/optimizer.py, Optimizer2State.init_state; AdamW8bit and PagedAdamW8bit pass optim_bits=8):
- a parameter under `min_8bit_size` (4096) elements keeps two fp32 states (state1, state2) like torch's Adam;
- from 4096 elements: two uint8 states of the parameter's shape, and per state one fp32 absmax per block of 256
  elements (`blocks = n // 256 + bool(n % 256)`); the two 256-entry fp32 quantization maps (qmap1: signed,
  qmap2: unsigned) are one pair per optimizer, made on the host when it is built (fill_qmap) and copied to the
  device at the first 8-bit parameter's state (`self.name2qmap["dynamic"].to(p.device)`);
- `state["step"]` is a Python int;
- paged (PagedAdamW8bit, get_state_buffer): a state of at least 1e5 elements on a CUDA device is a
  cudaMallocManaged buffer (`F.get_paged`), outside the caching allocator; smaller ones and absmax are not;
- the step's CUDA kernels (optimizer_update_8bit_blockwise, optimizer_update_32bit) update in place.

torchao (optim/adam.py, _AdamBase; subclass_8bit.py, subclass_4bit.py, subclass_fp8.py):
- the learning rate becomes a 0-dim fp32 tensor (add_param_group) and `state["step"]` a 0-dim fp32 tensor
  (`torch.tensor(0.0)`), both on the host;
- a parameter of at least 4096 elements whose size is a multiple of the block size gets, per state (exp_avg,
  exp_avg_sq), codes (8-bit: uint8 of its size; 4-bit: uint8 of half its size; fp8: float8_e4m3fn of its size),
  one fp32 scale per block (8-bit and fp8: 256 elements; 4-bit: 128), and for 8-bit and 4-bit a quantization map
  of 256 or 16 fp32 values made from a Python list (`torch.tensor(qmap_list, device=device)`), per state;
- any other parameter: `torch.zeros_like(p)` per state, in the parameter's dtype;
- the step is `torch.compile`d (inductor): what its fused kernels take besides the state is not counted.
"""

from __future__ import annotations

import torch

BNB = ("adamw8bit", "paged-adamw8bit")
BNB_MIN_8BIT_SIZE = 4096  # Optimizer2State(min_8bit_size=4096)
BNB_BLOCK = 256  # init_state: blocksize = 256
BNB_PAGED_FROM = 1e5  # get_state_buffer: `if not self.is_paged or p.numel() < 1e5`: not paged
BNB_QMAP = 256  # functional.create_dynamic_map: 256 values
TORCHAO_MIN = 4096  # _AdamBase._new_buffer: `local_p.numel() >= 4096 and local_p.numel() % self.block_size == 0`
# name -> (block size, codes dtype, codes per element as (numerator, denominator), quantization map's length)
TORCHAO = {
    "torchao-adamw8bit": (256, torch.uint8, (1, 1), 256),
    "torchao-adamw4bit": (128, torch.uint8, (1, 2), 16),
    "torchao-adamwfp8": (256, torch.float8_e4m3fn, (1, 1), 0),
}


def note(name: str, cuda: bool) -> str | None:
    """What the stand-in does not count, for the prediction's `assumed` lines."""
    if name in TORCHAO:
        return (f"{name}: torchao's step is torch.compile'd; the buffers its fused kernels take beside the state "
                "are not counted (the state is, as torchao makes it)")
    if name in BNB and not cuda:
        return f"{name}: bitsandbytes' CPU step's temporaries are not counted (its CUDA kernels update in place)"
    return None


class LowBitStandIn(torch.optim.Optimizer):
    """The library optimizer `name` as its state is made. `paged(p, dtype)`: a CUDA prediction's maker of unified
    memory (bitsandbytes' paged buffers, off_device.OffDeviceLedger.paged), None where the target is the CPU
    (bitsandbytes pages only on CUDA: get_state_buffer returns a plain buffer for a CPU parameter)."""

    def __init__(self, params, lr: float, name: str, cuda: bool, paged=None):
        super().__init__(params, {"lr": lr})
        self.name, self.cuda, self.paged = name, cuda, paged
        self.qmaps: tuple[torch.Tensor, ...] | None = None
        if name in BNB and not cuda:  # fill_qmap at construction; on CUDA these are host tensors
            self.qmaps = (torch.zeros(BNB_QMAP), torch.zeros(BNB_QMAP))
        if name in TORCHAO:
            for group in self.param_groups:  # add_param_group: the learning rate as a host tensor
                group["lr"] = torch.tensor(group["lr"], dtype=torch.float32)

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    (self._bnb_state if self.name in BNB else self._torchao_state)(p, state)
                state["step"] += 1
        return None

    def _bnb_state(self, p: torch.Tensor, state: dict) -> None:
        state["step"] = 0
        if p.numel() < BNB_MIN_8BIT_SIZE:
            state["state1"] = self._bnb_buffer(p, torch.float32)
            state["state2"] = self._bnb_buffer(p, torch.float32)
            return
        if self.qmaps is None:  # the pair's copy to the device, at the first 8-bit parameter
            self.qmaps = (torch.zeros(BNB_QMAP), torch.zeros(BNB_QMAP))
        blocks = p.numel() // BNB_BLOCK + bool(p.numel() % BNB_BLOCK)
        state["state1"] = self._bnb_buffer(p, torch.uint8)
        state["qmap1"] = self.qmaps[0]
        state["state2"] = self._bnb_buffer(p, torch.uint8)
        state["qmap2"] = self.qmaps[1]
        state["absmax1"] = torch.zeros((blocks,), dtype=torch.float32)
        state["absmax2"] = torch.zeros((blocks,), dtype=torch.float32)

    def _bnb_buffer(self, p: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        if self.name == "paged-adamw8bit" and self.paged is not None and p.numel() >= BNB_PAGED_FROM:
            return self.paged(p, dtype)
        return torch.zeros_like(p, dtype=dtype)

    def _torchao_state(self, p: torch.Tensor, state: dict) -> None:
        state["step"] = torch.tensor(0.0)
        block, codes_dtype, (num, den), qmap = TORCHAO[self.name]
        n = p.numel()
        for key in ("exp_avg", "exp_avg_sq"):
            if n >= TORCHAO_MIN and n % block == 0:  # the subclass's tensors, each under its own key here
                state[f"{key}.codes"] = torch.zeros(n * num // den, dtype=codes_dtype)
                state[f"{key}.scale"] = torch.zeros(n // block)
                if qmap:
                    state[f"{key}.qmap"] = torch.zeros(qmap)
            else:
                state[key] = torch.zeros_like(p)

