"""nn.Embedding's backward on CUDA (predict/emulate/embedding.py): what embedding_dense_backward allocates besides
its gradient, worked out by hand from Embedding.cu and EmbeddingBackwardKernel.cu, and where among those the
gradient itself comes."""

from __future__ import annotations

import torch

from membench.predict import gpus
from membench.predict.emulate.embedding import embedding_backward_scratch
from tests.helpers import cuda_trace

H200, A100 = gpus.gpu("H200"), gpus.gpu("A100")


def _sizes(events) -> list[tuple[str, int | str]]:
    return [(e.kind, e.size if e.kind == "alloc" else e.key) for e in events]


def test_gpt_smalls_token_embedding_backward_as_the_h200_ran_it(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", "13.0")  # the H200's torch 2.11.0+cu130: CCCL 3's look-back sizes
    # 8 x 1024 int64 tokens into a 50,304 x 768 fp32 table: n = 8,192 > 3,072, so the indices are sorted.
    grad = torch.empty(8, 1024, 768, device="meta")
    indices = torch.empty(8, 1024, dtype=torch.long, device="meta")
    before, after = embedding_backward_scratch((grad, indices, 50_304, -1, False), {}, H200)
    n8 = 8192 * 8  # one int64 per index: 65,536 B
    # radix sort of 8,192 (int64, int64) pairs over 64 bits on sm90: two onesweep tiles of 384 x 12; bins
    # 8 passes x 256 x 8 B, lookback 2 x 256 x 4 B, the extra keys and values (65,536 B each), counters 8 x 4 B
    # (256 aligned), plus 255: 16,384 + 2,048 + 65,536 + 65,536 + 256 + 255
    assert _sizes(before) == [("alloc", n8), ("alloc", n8), ("alloc", n8), ("alloc", 150_015), ("free", "sort_temp"),
                              ("free", "range")]
    # max_segments = min(8,192, 50,304); partial segments 8,192 // 10 + 8,192 = 9,011; their sums 9,011 x 768 fp32
    # cub's unique_by_key over 8,192 and exclusive sum over 8,192 segments: 1,279 B each (tests/predict/emulate/
    # test_cub.py)
    assert _sizes(after) == [
        ("alloc", n8), ("alloc", 8), ("alloc", n8), ("alloc", 1279), ("free", "unique_temp"),
        ("free", "unique_keys_out"), ("alloc", n8), ("alloc", n8), ("alloc", 1279), ("free", "scan_temp"),
        ("alloc", 8), ("alloc", 9011 * 8), ("alloc", 9011 * 768 * 4), ("free", "grad_weight_per_segment"),
        ("free", "partial_segment_offset"), ("free", "num_of_partial_segments"),
        ("free", "partials_per_segment_offset"), ("free", "partials_per_segment"), ("free", "num_of_segments"),
        ("free", "segment_offsets"), ("free", "orig_indices"), ("free", "sorted_indices")]
    assert 9011 * 8 == 72_088 and 9011 * 768 * 4 == 27_681_792  # the H200 trace's two largest


def test_a_16_bit_gradient_sums_its_segments_in_fp32_and_int32_indices_take_four_bytes():
    # 4,096 bf16 rows of width 1,024 into a 50,000-row table on an A100: 4,096 segments at most, each summed by a
    # block of 1,024 threads: 4,096 blocks, not fewer than 108 SMs x 4, so two passes
    grad = torch.empty(4096, 1024, dtype=torch.bfloat16, device="meta")
    indices = torch.empty(4096, dtype=torch.int32, device="meta")
    before, after = embedding_backward_scratch((grad, indices, 50_000, -1, False), {}, A100)
    assert [e.size for e in before if e.kind == "alloc"][:3] == [4096 * 4] * 3
    sizes = {e.key: e.size for e in after if e.kind == "alloc"}
    assert sizes["partials_per_segment"] == sizes["partials_per_segment_offset"] == 4096 * 4
    assert sizes["partial_segment_offset"] == (409 + 4096) * 4
    assert sizes["grad_weight_per_segment"] == (409 + 4096) * 1024 * 4  # fp32


def test_few_rows_sum_in_one_pass_of_atomic_adds_into_an_fp32_gradient():
    # A 100-row table of width 64: at most 100 segments, one 64-thread block each: 100 blocks < 108 SMs x 4, and
    # 4,096 // 10 + 100 = 509 partial segments > 4 x 100: use_fused_kernel. A map from partial segment to
    # segment (int32: 509 x 4 B) and, the gradient being bf16, an fp32 one to add into (100 x 64 x 4 B), freed
    # before the map; no per-segment sums.
    grad = torch.empty(4096, 64, dtype=torch.bfloat16, device="meta")
    indices = torch.empty(4096, dtype=torch.int32, device="meta")
    _, after = embedding_backward_scratch((grad, indices, 100, -1, False), {}, A100)
    assert _sizes(after)[10:16] == [("alloc", 8), ("alloc", 509 * 4), ("alloc", 509 * 4), ("alloc", 100 * 64 * 4),
                                    ("free", "grad_weight_acc"), ("free", "partial_to_segment_idx")]
    # fp32: no copy; with deterministic algorithms, the two passes again
    _, after = embedding_backward_scratch((grad.float(), indices, 100, -1, False), {}, A100)
    assert ("alloc", 100 * 64 * 4) not in _sizes(after)
    torch.use_deterministic_algorithms(True)
    try:
        _, after = embedding_backward_scratch((grad, indices, 100, -1, False), {}, A100)
    finally:
        torch.use_deterministic_algorithms(False)
    assert ("alloc", 509 * 64 * 4) in _sizes(after)


def test_up_to_3072_indices_take_nothing_but_a_non_contiguous_gradient_is_copied_first():
    indices = torch.empty(3072, dtype=torch.long, device="meta")
    assert embedding_backward_scratch((torch.empty(3072, 16, device="meta"), indices, 10, -1, False), {}, H200) \
        == ([], [])
    grad = torch.empty(16, 3072, device="meta").t()  # (3072, 16), not contiguous
    before, after = embedding_backward_scratch((grad, indices, 10, -1, False), {}, H200)
    assert _sizes(before) == [("alloc", 3072 * 16 * 4)] and _sizes(after) == [("free", "grad")]


def test_the_gradient_is_allocated_between_the_sort_and_the_segments():
    def step():
        table = torch.nn.Embedding(50, 16)
        tokens = torch.zeros(4, 1024, dtype=torch.long)
        table(tokens).sum().backward()

    events = cuda_trace(step, H200)
    n8 = 4096 * 8
    gradient = 50 * 16 * 4  # 3,200 B, the table's size
    # sorted_indices, orig_indices, the arange: the first three index-sized allocations in a row (the tokens are one)
    i = next(k for k in range(len(events)) if events[k:k + 3] == [("alloc", n8)] * 3)
    assert events[i:i + 8] == [("alloc", n8), ("alloc", n8), ("alloc", n8), ("alloc", 83_455), ("free", 83_455),
                               ("free", n8), ("alloc", gradient), ("alloc", n8)]
    # 50 rows of width 16: 50 one-warp blocks per segment pass, fewer than 132 SMs x 4, so the fused pass: a map
    # of 4,096 // 10 + 50 partial segments (int64), no per-segment sums
    assert ("alloc", (409 + 50) * 8) in events[i:] and ("alloc", (409 + 50) * 16 * 4) not in events[i:]
