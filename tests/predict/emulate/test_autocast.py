"""CUDA's autocast policy and cuBLAS workspaces on CPU fake tensors (a prediction for a CUDA GPU), derived by hand
from ATen's autocast lists (aten/src/ATen/autocast_mode.h) and torch's cuBLAS workspace rule."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from torch import nn

from membench.common.vocab import OTHER
from membench.predict import gpus
from membench.predict.emulate import fake
from membench.predict.emulate.autocast import FP32, FP32_SET_OPT_DTYPE, LOWER_PRECISION_FP, PROMOTE, cuda_policy
from membench.predict.emulate.kernels import CUBLAS_MODULE, CudaKernels
from membench.trackers.storage import StorageTracker
from tests.helpers import sized_events


def _workspace_bytes(tracker) -> int:
    return sum(b for b, category, module in tracker.live.values() if (category, module) == (OTHER, CUBLAS_MODULE))


def _dtypes(dtype=torch.bfloat16, inference=False):
    with fake.fake_tensors():
        weight = nn.Parameter(torch.randn(8, 8))
        x = torch.randn(4, 8)
        mode = torch.inference_mode() if inference else torch.enable_grad()
        with mode, torch.autocast("cpu", dtype=dtype):
            y = nn.functional.linear(x, weight)
            return {"linear": y.dtype, "softmax": torch.softmax(y, -1).dtype,
                    "layer_norm": nn.functional.layer_norm(y, (8,)).dtype,
                    "einsum": torch.einsum("ij,jk->ik", x, weight).dtype, "sum": y.sum().dtype,
                    "exp": y.exp().dtype, "log_softmax with dtype": torch.log_softmax(y, -1, dtype=dtype).dtype,
                    "addcmul": torch.addcmul(y, x, y).dtype}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("inference", [False, True])
def test_cuda_policy_gives_each_op_the_dtype_cuda_autocast_gives_it(dtype, inference):
    with cuda_policy():
        got = _dtypes(dtype, inference)
    f32 = torch.float32
    # CUDA: matmuls and einsum (as a whole) in the low precision; softmax, layer_norm, sum, exp in fp32; an
    # explicit dtype is kept; addcmul promotes to the widest (fp32 x).
    assert got == {"linear": dtype, "softmax": f32, "layer_norm": f32, "einsum": dtype, "sum": f32, "exp": f32,
                   "log_softmax with dtype": dtype, "addcmul": f32}


def test_outside_the_policy_cpu_autocast_is_cpus_again():
    with cuda_policy():
        pass
    got = _dtypes()
    # CPU's own policy: softmax, layer_norm, sum and exp stay in bf16 (what made CUDA predictions wrong).
    assert got["softmax"] == got["layer_norm"] == got["sum"] == got["exp"] == torch.bfloat16


def test_a_weight_is_cast_once_per_autocast_region_and_the_cache_cleared_at_its_end():
    with cuda_policy(), fake.fake_tensors():
        weight = nn.Parameter(torch.randn(256, 256))  # 256 KiB in fp32, 128 KiB in bf16
        x = torch.randn(4, 256)
        tracker = StorageTracker()
        with tracker:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                a = x @ weight
                after_first = tracker.current
                b = x @ weight  # the cached bf16 copy of the weight: only the output is new
                after_second = tracker.current
            after_exit = tracker.current
    x_bf16, out = 4 * 256 * 2, 4 * 256 * 2
    assert after_first == 256 * 256 * 2 + x_bf16 + out  # the weight's copy, x's copy (not cached), the output
    assert after_second - after_first == x_bf16 + out
    assert after_exit == after_second - 256 * 256 * 2  # the cache let go of the weight's copy
    del a, b


def test_the_lists_are_the_installed_torchs_cuda_lists():
    """The op lists are copied from ATen's header; where the installed torch ships it, they must agree."""
    header = Path(torch.__file__).parent / "include" / "ATen" / "autocast_mode.h"
    if not header.is_file():
        pytest.skip("this torch ships no ATen headers to compare with")
    text = header.read_text()

    def macro(name):
        body = re.search(rf"#define {name}\(_\)(.*?)\n\n", text, re.S).group(1)
        return [".".join(filter(None, (a.strip(), b.strip())))
                for a, b in re.findall(r"_\((\w+)(?:,\s*(\w+))?\)", body)]
    assert macro("AT_FORALL_LOWER_PRECISION_FP") == list(LOWER_PRECISION_FP)
    assert macro("AT_FORALL_FP32") == list(FP32)
    assert macro("AT_FORALL_FP32_SET_OPT_DTYPE") == list(FP32_SET_OPT_DTYPE)
    assert macro("AT_FORALL_PROMOTE") == list(PROMOTE)


def test_one_cublas_workspace_per_handle_main_then_autograd():
    nbytes = 1 << 20
    with fake.fake_tensors():
        model = nn.Linear(16, 16)
        x = torch.randn(4, 16)
        tracker = StorageTracker()
        tracker.kernels = CudaKernels(gpus.gpu("H100"), workspace_bytes=nbytes)
        workspaces = tracker.kernels.workspaces
        with tracker:
            loss = model(x).sum()
            assert workspaces.allocated_bytes == _workspace_bytes(tracker) == nbytes
            model(x)  # the same thread again: no new workspace
            assert workspaces.allocated_bytes == nbytes
            loss.backward()  # the autograd thread's handle
            assert workspaces.allocated_bytes == _workspace_bytes(tracker) == 2 * nbytes
            model(x).sum().backward()
            assert workspaces.allocated_bytes == 2 * nbytes


def test_workspace_sizes_follow_torchs_rule():
    assert gpus.cublas_workspace_bytes(gpus.gpu("H100").compute_capability) == 32 * 2**20
    assert gpus.cublas_workspace_bytes(gpus.gpu("a100").compute_capability) == 8_519_680  # 4096 KiB x 2 + 16 KiB x 8
    assert gpus.cublas_workspace_bytes((8, 0), {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}) == 32 * 2**20
    assert gpus.cublas_workspace_bytes((9, 0), {"CUBLAS_WORKSPACE_CONFIG": ":16:8:4096:2"}) == 8_519_680
    # As torch: no ":SIZE:COUNT" found is a warning and the default (tests/test_fuzz.py has the rest).
    assert gpus.cublas_workspace_bytes((9, 0), {"CUBLAS_WORKSPACE_CONFIG": ":lots"}) == 32 * 2**20
    with pytest.raises(Exception, match=r"unknown --gpu 'B9000'; valid: H100"):
        gpus.gpu("B9000")


def test_under_inference_mode_a_composite_ops_temporaries_are_counted():
    """einsum reaches a dispatch mode whole under inference_mode; its decomposition's layout copies (two 128 KiB
    copies of the operands, then the 256 KiB output) must be counted as they are outside inference_mode."""
    with fake.fake_tensors():
        a, b = torch.randn(64, 32, 16), torch.randn(64, 32, 16)  # 128 KiB each, fp32
        peaks = []
        for mode in (torch.enable_grad, torch.inference_mode):
            tracker = StorageTracker()
            with tracker, mode():
                torch.einsum("bqd,bkd->bqk", a, b)
            peaks.append(tracker.peak.bytes)
    assert peaks == [2 * 64 * 32 * 16 * 4 + 64 * 32 * 32 * 4] * 2


def test_under_inference_mode_no_weight_copy_is_kept():
    with cuda_policy(), fake.fake_tensors():
        weight = nn.Parameter(torch.randn(256, 256))
        x = torch.randn(4, 256)
        tracker = StorageTracker()
        with tracker, torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
            a = x @ weight
            held = tracker.current
    assert held == 4 * 256 * 2  # the output only: the weight's and x's bf16 copies were freed after the matmul
    del a



def test_einsums_casts_are_freed_first_to_last_as_atens_vector_of_casts_is():
    """CUDA's autocast casts einsum's operands (a tensor list) into one vector, destroyed first to last after the
    op: a real GPU trace of a bf16 inference forward frees the input's copy before the weight's."""
    with cuda_policy(), fake.fake_tensors():
        weight = nn.Parameter(torch.randn(64, 32))  # its bf16 copy: 4 KiB
        x = torch.randn(4, 16, 64)  # its bf16 copy: 8 KiB
        tracker = StorageTracker(trace=True)
        with tracker, torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
            y = torch.einsum("bsd,dk->bsk", x, weight)
    order = sized_events(tracker.trace)
    assert order[:2] == [("alloc", 4 * 16 * 64 * 2), ("alloc", 64 * 32 * 2)]
    assert [e for e in order if e[0] == "free"][:2] == [("free", 4 * 16 * 64 * 2), ("free", 64 * 32 * 2)]
    del y


@pytest.mark.parametrize("inference", [False, True])
def test_a_calls_arguments_are_cast_last_to_first_and_let_go_first_to_last(inference):
    """ATen's autocast kernel casts in `(*F)(cached_cast(..., args, device_type)...)`: the arguments of one call,
    which GCC evaluates right to left, so nn.Linear's bias is cast first, then its weight, then its input (as an
    H200's traces show for every Linear under autocast); the casts are that call's temporaries, destroyed in the
    reverse order, the input's first. Sizes by hand: bias 48 x 2 B, weight 48 x 64 x 2 B, input 2 x 16 x 64 x 2 B,
    output 2 x 16 x 48 x 2 B."""
    bias, weight, x, out = 48 * 2, 48 * 64 * 2, 2 * 16 * 64 * 2, 2 * 16 * 48 * 2
    with cuda_policy(), fake.fake_tensors():
        linear = nn.Linear(64, 48)
        inputs = torch.randn(2, 16, 64)
        tracker = StorageTracker(trace=True)
        mode = torch.inference_mode() if inference else torch.enable_grad()
        with tracker, mode, torch.autocast("cpu", dtype=torch.bfloat16):
            y = linear(inputs)
            within = len(tracker.trace)  # before the region's end lets go of the cached casts
    order = sized_events(tracker.trace)[:within]
    assert order[:4] == [("alloc", bias), ("alloc", weight), ("alloc", x), ("alloc", out)]
    # under grad the weight's and bias's casts are cached and the input's is saved for backward: nothing is freed
    assert [e for e in order if e[0] == "free"] == ([("free", x), ("free", weight), ("free", bias)] if inference
                                                    else [])
    del y


def test_a_tensor_lists_elements_are_cast_first_to_last():
    """einsum's operands are one TensorList argument: its `cached_cast` casts them in a loop, first to last."""
    with cuda_policy(), fake.fake_tensors():
        a, b, c = nn.Parameter(torch.randn(8, 4)), torch.randn(4, 16), torch.randn(16, 2)
        tracker = StorageTracker(trace=True)
        with tracker, torch.autocast("cpu", dtype=torch.bfloat16):
            y = torch.einsum("ij,jk,kl->il", a, b, c)
    assert [e for e in sized_events(tracker.trace) if e[0] == "alloc"][:3] == [
        ("alloc", 8 * 4 * 2), ("alloc", 4 * 16 * 2), ("alloc", 16 * 2 * 2)]
    del y
