"""The step-time model (membench/predict/time/): one GEMM's and one elementwise op's predicted time derived by hand
from the GPU table's figures, the two clocks, and a prediction's record carrying its step time."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from membench.predict.gpus import GPUS
from membench.predict.time import efficiency
from membench.predict.time.hardware import SPEEDS, speed
from membench.predict.time.model import estimate, op_time
from membench.predict.time.ops import OpCall, classify
from membench.predict.time.show import time_lines

aten = torch.ops.aten
A100_SMS, A100_CC = 108, (8, 0)


def _classified(op, *shapes_dtype):
    with FakeTensorMode():
        args = [torch.empty(shape, dtype=dtype) for shape, dtype in shapes_dtype]
        out = op(*args)
        return classify(op, tuple(args), {}, out, "forward")


def test_the_speed_figures_are_for_cards_of_the_gpu_table():
    """Keyed by the GPU table's names; the cards without figures (RTX 3090, ...) predict no step time."""
    assert set(SPEEDS) <= set(GPUS)
    assert {"H100", "H200", "A100", "V100", "L4", "T4"} <= set(SPEEDS)


def test_a_gemm_by_hand_on_an_a100():
    """bf16 [4096, 4096] @ [4096, 4096] on an A100 80GB SXM.
    FLOPs: 2 * 4096**3 = 137,438,953,472. Bytes: three 4096 x 4096 bf16 matrices = 3 * 33,554,432 = 100,663,296.
    Tiles: 128 x 128 gives 32 * 32 = 1,024 tiles on 108 SMs: ceil(1024 / 108) = 10 waves, 1,024 / 1,080 busy =
    0.948148...; no tile quantization (4096 is a multiple of 128). The 128 x 64 tile: 2,048 tiles, 19 waves,
    2,048 / 2,052 = 0.99805 busy times its reuse (128 * 64 / 192) / 64 = 0.6667: 0.6654, worse; 64 x 64: reuse 0.5.
    So the fraction is 0.948148 x 0.869 (the A100 SXM's MAMF, 86.9% of 312 TFLOPS bf16):
    time = 137,438,953,472 / (312e12 * 0.869 * 0.948148) = 534.67 us. Memory: 100,663,296 B at 2,039 GB/s x 0.78
    = 63.29 us, shorter: the GEMM is compute-bound."""
    call = _classified(aten.mm.default, ((4096, 4096), torch.bfloat16), ((4096, 4096), torch.bfloat16))
    assert call.kind == "gemm" and call.gemm == (1, 4096, 4096, 4096)
    assert call.flops == 137_438_953_472
    assert call.bytes == 100_663_296
    seconds = op_time(call, speed("A100"), A100_SMS, A100_CC, "central")
    assert seconds == pytest.approx(137_438_953_472 / (312e12 * 0.869 * (1024 / 1080)), rel=1e-12)
    assert seconds == pytest.approx(534.67e-6, rel=1e-4)


def test_an_elementwise_add_by_hand_on_an_a100():
    """fp32 [1024, 1024] + [1024, 1024]: reads two 4 MiB tensors and writes one: 12,582,912 B, no FLOPs counted.
    At the A100's 2,039 GB/s x 0.78 (efficiency.MEMORY_BANDWIDTH's central value): 12,582,912 / 1.59042e12 =
    7.9117 us."""
    call = _classified(aten.add.Tensor, ((1024, 1024), torch.float32), ((1024, 1024), torch.float32))
    assert call.kind == "memory" and call.bytes == 12_582_912 and call.flops == 0
    seconds = op_time(call, speed("A100"), A100_SMS, A100_CC, "central")
    assert seconds == pytest.approx(12_582_912 / (2039e9 * 0.78), rel=1e-12)
    assert seconds == pytest.approx(7.9117e-6, rel=1e-4)


def test_a_broadcast_input_is_read_once():
    """[1024, 1024] + [1024] reads 4 MiB and 4 KiB, writes 4 MiB: 8,392,704 B (not the expanded 4 MiB twice)."""
    call = _classified(aten.add.Tensor, ((1024, 1024), torch.float32), ((1024,), torch.float32))
    assert call.bytes == 2 * 4 * 2**20 + 4096


def test_many_tiny_ops_are_launch_bound():
    """1,000 adds of 4-element tensors: each takes the GPU nanoseconds, the host 11 us (the central per-op cost):
    the step is the host's 11 ms, nearly all of it the GPU waiting (launch)."""
    tiny = OpCall(op="add", kind="memory", phase="forward", recomputed=False, dtype="float32", bytes=48)
    step = estimate([tiny] * 1000, speed("A100"), A100_SMS, A100_CC, "central")
    assert step.step_s == pytest.approx(1000 * efficiency.HOST_PER_OP_S.central, rel=1e-6)
    assert step.by_class_s["launch"] > 0.99 * step.step_s


def test_a_read_back_waits_for_the_gpu():
    """A 1 ms memory op, then a .item(), then another: the read-back is issued (one host cost, while the GPU still
    runs op 1) and returns when op 1 is done; op 2 is issued one host cost after that. So the step is op 1's
    issue, op 1, op 2's issue, op 2."""
    big = OpCall(op="copy_", kind="memory", phase="forward", recomputed=False, dtype="float32",
                 bytes=int(2039e9 * 0.78 * 1e-3))
    sync = OpCall(op="_local_scalar_dense", kind="sync", phase="forward", recomputed=False, dtype="float32")
    host = efficiency.HOST_PER_OP_S.central
    step = estimate([big, sync, big], speed("A100"), A100_SMS, A100_CC, "central")
    assert step.step_s == pytest.approx(host + 1e-3 + host + 1e-3, rel=1e-9)


def test_the_range_brackets_the_central_value():
    gemm = _classified(aten.mm.default, ((2048, 1024), torch.float16), ((1024, 4096), torch.float16))
    add = _classified(aten.add.Tensor, ((2048, 4096), torch.float16), ((2048, 4096), torch.float16))
    ends = {end: estimate([gemm, add] * 10, speed("H100"), 132, (9, 0), end).step_s for end in efficiency.ENDS}
    assert ends["fast"] < ends["central"] < ends["slow"]


def test_a_cuda_prediction_records_its_step_time_and_ckpt_costs_more(tmp_path):
    """gpt-tiny on an A100: checkpointing runs each block's forward again in backward, so its predicted step is
    longer than the baseline's by at least the recomputed GPU time less what the baseline's GPU waited for."""
    from membench.api import plan
    from membench.predict.run import predict
    from membench.results import read_result, result_path, write_record

    jobs = plan("gpt-tiny", "ckpt", 4, device="cpu", target_device="cuda", gpu="A100", check=False, timeline=False,
                in_process=True)
    records = [predict(job) for job in jobs]
    base, ckpt = (r.predicted_time for r in records)
    assert base is not None and ckpt is not None
    assert base.recomputed_s == 0 < ckpt.recomputed_s
    assert ckpt.step_s > base.step_s
    assert base.low_s <= base.step_s <= base.high_s
    assert set(base.by_class_s) == {"gemm", "attention", "elementwise", "optimizer", "communication", "launch"}
    path = result_path(tmp_path, records[1].name)
    write_record(path, records[1])
    assert read_result(path).predicted_time == ckpt
    lines = time_lines(records)
    assert lines[0].startswith("Predicted step time on A100 (a prediction: no GPU ran")
    cost = f"ckpt: {round((ckpt.step_s / base.step_s - 1) * 100):+d}% step time vs baseline"
    assert lines[2].endswith(cost) and "tokens/s" in lines[2] and cost not in lines[1]


def test_a_foreach_op_writes_what_its_schema_marks():
    """_foreach_add_(xs, ys) over three fp32 tensors of 1,000 elements returns nothing: it reads xs and ys (6 x
    4,000 B) and writes xs back (3 x 4,000 B): 36,000 B, in one kernel (3 tensors, 3 chunks: under
    multi_tensor_apply's limits)."""
    with FakeTensorMode():
        xs = [torch.empty(1000) for _ in range(3)]
        ys = [torch.empty(1000) for _ in range(3)]
        out = torch._foreach_add_(xs, ys)
        call = classify(aten._foreach_add_.List, (xs, ys), {}, out, "optimizer")
    assert call.bytes == 36_000 and call.kernels == 1


def test_a_fill_only_writes():
    """zero_ on 1,000 fp32 elements writes 4,000 B and reads nothing."""
    with FakeTensorMode():
        x = torch.empty(1000)
        call = classify(aten.zero_.default, (x,), {}, x.zero_(), "optimizer")
    assert call.bytes == 4_000
