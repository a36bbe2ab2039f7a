"""act-offload and opt-offload predicted for CUDA: the host copies apart from device memory, derived by hand.

tests.workloads:mlp is Flatten, Linear(192, 64), ReLU, Linear(64, 10), cross-entropy, at batch 4 (fp32). Pinned host
memory comes from torch's CachingHostAllocator, which rounds each block up to a power of two.
"""

from __future__ import annotations

from membench.predict.emulate.off_device import pinned_block
from membench.predict.run import predict_traced
from tests.helpers import spec

PARAMS = (192 * 64 * 4, 64 * 4, 64 * 10 * 4, 10 * 4)  # bytes: 49152, 256, 2560, 40
PINNED_PARAMS = sum(pinned_block(n) for n in PARAMS)  # 65536 + 256 + 4096 + 64 = 69952

# What autograd saves in forward, each packed by save_on_cpu into a pinned block of its own: the first addmm's input
# [4, 192] (its weight is not saved: the input needs no gradient), ReLU's output [4, 64], the second addmm's input
# (that output again, packed again) and its weight [10, 64], log_softmax's output [4, 10], and nll_loss's input (that
# output again), target [4] (int64) and total_weight (0-dim fp32).
SAVED = (4 * 192 * 4, 4 * 64 * 4, 4 * 64 * 4, 10 * 64 * 4, 4 * 10 * 4, 4 * 10 * 4, 4 * 8, 4)
PINNED_SAVED = sum(pinned_block(n) for n in SAVED)  # 4096 + 1024 + 1024 + 4096 + 256 + 256 + 32 + 4 = 10788


def _predict(*techniques):
    return predict_traced(spec("tests.workloads:mlp", techniques, batch_size=4, device="cuda", gpu="A10G")).memory


def test_pinned_block_is_the_next_power_of_two():
    assert [pinned_block(n) for n in (0, 1, 3, 4, 40, 2560, 49152)] == [0, 1, 4, 4, 64, 4096, 65536]


def test_act_offload_keeps_the_saved_tensors_in_pinned_host_memory():
    memory = _predict("act-offload")
    assert PINNED_SAVED == 10788
    assert memory.off_device.pinned_host_peak_bytes == PINNED_SAVED
    assert memory.off_device.pageable_host_peak_bytes == 0


def test_opt_offload_keeps_the_optimizer_state_on_the_host():
    """The device keeps no optimizer state; the host keeps a pinned copy of each parameter and, from the gradients'
    move to the step's zero_grad, of each gradient: both at once at the peak. Adam's two moments (2 x 52,736 B) live
    in pageable host memory (zeros_like of a host parameter), exact sizes, with the step's temporaries."""
    base, offload = _predict(), _predict("opt-offload")
    assert base.current_breakdown["optimizer_state"] == 2 * sum(-(-n // 512) * 512 for n in PARAMS)  # CUDA blocks
    assert offload.current_breakdown["optimizer_state"] == 0
    assert offload.current_breakdown["parameters"] == base.current_breakdown["parameters"]
    assert offload.off_device.pinned_host_peak_bytes == 2 * PINNED_PARAMS == 139904
    assert offload.off_device.pageable_host_peak_bytes >= 2 * sum(PARAMS)


def test_both_offloads_stack_with_the_pinned_peaks_apart_in_time():
    """The saved activations' copies are freed in backward, before the gradients move to the host: the pinned peak
    is the parameters' copies plus the larger of the two (the gradients'), not the sum of the three."""
    memory = _predict("act-offload", "opt-offload")
    assert memory.off_device.pinned_host_peak_bytes == PINNED_PARAMS + max(PINNED_SAVED, PINNED_PARAMS)
