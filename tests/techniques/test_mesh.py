"""Sharded training's options (--mesh, --param-dtype, --reduce-dtype, --reshard-after-forward) and what each rank
of a prediction holds, against shard sizes derived by hand (CPU; fake process groups)."""

from __future__ import annotations

import re

import pytest

from membench import cli
from membench.common.errors import UserError
from membench.predict.run import predict_memory, predict_traced
from membench.spec import Job, RunSpec
from membench.techniques.mesh import Mesh, check_reshard_after_forward, parse_mesh

MLP = "tests.workloads:mlp"  # Linear(192, 64) and Linear(64, 10), fully_shard on the root alone (no blocks)
STEP = 4  # bytes of each Adam step count (a float32 scalar per parameter)
LLAMA = ("hf:llama,num_hidden_layers=1,hidden_size=64,num_attention_heads=4,num_key_value_heads=2,"
         "intermediate_size=128,vocab_size=256,head=causal-lm")  # head_dim 16; embedding and LM head untied


def test_a_mesh_is_spelled_one_way_and_lays_ranks_out_as_torchtitan():
    mesh = parse_mesh(" tp=2, dp_shard=4 ,dp_replicate=2")
    assert (mesh, mesh.size, mesh.text) == (Mesh(2, 4, 2), 16, "dp_replicate=2,dp_shard=4,tp=2")
    assert parse_mesh(None, 8) == Mesh(dp_shard=8) and parse_mesh("dp_shard=1").text == "dp_shard=1"
    # row-major over (dp_replicate, dp_shard, tp): tp innermost, the ranks of one node
    assert [tuple(mesh.coordinates(r).values()) for r in (0, 1, 2, 9, 15)] == [
        (0, 0, 0), (0, 0, 1), (0, 1, 0), (1, 0, 1), (1, 3, 1)]


@pytest.mark.parametrize("text, message", [
    ("pp=2", r"pp \(pipeline parallelism\) is not supported"), ("cp=2", r"cp \(context parallelism\) is not"),
    ("dp_shard=0", "'dp_shard=0': a size is an integer of 1 or more"), ("tp=x", "'tp=x': a size is an integer"),
    ("dpshard=2", "'dpshard' is not a mesh dimension; NAME=SIZE pairs"),
    ("dp_shard=2,dp_shard=2", "dp_shard is given twice"), ("dp_shard", "is not NAME=SIZE")])
def test_a_bad_mesh_is_one_line_naming_the_valid_dimensions(text, message):
    with pytest.raises(UserError, match=message) as error:
        parse_mesh(text)
    assert "dp_replicate, dp_shard, tp" in str(error.value) or "twice" in message


@pytest.mark.parametrize("techniques, mesh, message", [
    ("fsdp", "dp_shard=4,tp=2", r"--mesh dp_shard=4,tp=2 has a tp dimension, which only the tp technique shards over: "
                                r"use fsdp\+tp, or a mesh without tp"),
    ("tp", "dp_shard=8", r"technique tp needs a tp dimension of 2 or more in --mesh \(e.g. --mesh tp=2"),
    ("tp", "dp_shard=4,tp=2", r"--mesh dp_shard=4,tp=2: the data-parallel ranks need fsdp to shard over them "
                              r"\(--techniques fsdp\+tp\), or --mesh tp=2 alone"),
])
def test_a_mesh_and_a_stack_that_do_not_go_together_are_one_line(techniques, mesh, message, capsys):
    assert cli.main(["predict", "--workload", "gpt-tiny", "--techniques", techniques, "--mesh", mesh]) == 2
    err = capsys.readouterr().err
    assert re.search(message, err) and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("workload, message", [
    ("gpt-tiny", r"technique tp applies torchtitan's plan for Llama-style blocks .* and this model has no "
                 r"model.layers / lm_head"),
    ("hf:llama,num_hidden_layers=1,hidden_size=96,num_attention_heads=6,num_key_value_heads=3,intermediate_size=128,"
     "vocab_size=256", r"technique tp: tp=2 does not divide the model's num_key_value_heads \(3\); valid tp sizes "
                       r"divide every one of num_attention_heads=6, num_key_value_heads=3, intermediate_size=128"),
    (LLAMA + ",tie_word_embeddings=true", r"technique tp: this model's LM head shares the embedding's weight "
                                           r"\(tie_word_embeddings\), which torchtitan's plan shards two ways"),
])
def test_tp_on_a_model_it_cannot_shard_is_one_line(workload, message, capsys):
    assert cli.main(["predict", "--workload", workload, "--techniques", "tp", "--mesh", "tp=2",
                     "--seq-len", "8"]) == 2
    captured = capsys.readouterr()
    assert re.search(message, captured.out + captured.err), captured


def test_reshard_after_forward_takes_a_proper_divisor_of_the_shard_dimension():
    for fine in (True, False, None, 2, 4):
        check_reshard_after_forward(fine, Mesh(dp_shard=8))
    for bad in (1, 8, 3, 16):
        with pytest.raises(UserError, match=r"a divisor of dp_shard=8 other than 1 and itself \(2, 4\)"):
            check_reshard_after_forward(bad, Mesh(dp_shard=8))


def test_predict_takes_its_world_size_from_the_mesh_and_refuses_a_different_one(capsys):
    assert cli.main(["predict", "--workload", MLP, "--techniques", "fsdp", "--world-size", "4", "--mesh",
                     "dp_shard=2"]) == 2
    assert "--mesh 'dp_shard=2' has 2 ranks (2), but the run has 4" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["predict", "--workload", MLP, "--reshard-after-forward", "maybe"])
    assert "'maybe' is not true, false or a world size" in capsys.readouterr().err


def _held(mesh: str, **options) -> dict[str, int]:
    """What rank 0 holds after a step, gradients kept (--zero-grad zeros), as the exact CPU tracker counts it."""
    job = Job(RunSpec(MLP, 4, ("fsdp",), nproc_per_node=parse_mesh(mesh).size, mesh=mesh, zero_grad="zeros",
                      **options))
    held = predict_memory(job, round_to=1).current_breakdown
    return {k: held[k] for k in ("parameters", "gradients", "optimizer_state")}


def test_fsdp_and_hsdp_shard_parameters_gradients_and_optimizer_state_as_derived_by_hand():
    # dp_shard=2: each weight and bias split on dim 0 (torch.chunk): [32, 192], [32], [5, 64], [5] in fp32
    half = (32 * 192 + 32 + 5 * 64 + 5) * 4
    assert half == 26004
    expected = {"parameters": half, "gradients": half, "optimizer_state": 2 * half + 4 * STEP}
    assert _held("dp_shard=2") == expected
    # HSDP: sharded within a group of 2, replicated across 2 groups: each rank holds what dp_shard=2 holds
    assert _held("dp_replicate=2,dp_shard=2") == expected
    # dp_shard=4: rank 0's chunks are [16, 192], [16], and ceil(10 / 4) = 3 rows of the second layer
    quarter = (16 * 192 + 16 + 3 * 64 + 3) * 4
    assert _held("dp_shard=4") == {"parameters": quarter, "gradients": quarter,
                                   "optimizer_state": 2 * quarter + 4 * STEP}


def _streamed(param_dtype, reduce_dtype) -> dict[str, list[int]]:
    """The sizes a CUDA prediction's measured step allocates on FSDP2's streams (mlp at world size 2)."""
    traced = predict_traced(Job(RunSpec(MLP, 4, ("fsdp",), nproc_per_node=2, device="cuda", param_dtype=param_dtype,
                                        reduce_dtype=reduce_dtype)))
    step = traced.events[traced.measured_from:]
    return {"copy-in": [e[2] for e in step if e[3:] == (1,)], "reduce-scatter": [e[2] for e in step if e[3:] == (2,)]}


def test_mixed_precision_changes_what_each_stream_allocates_as_fsdp2s_source_says():
    shard = 32 * 192 + 32 + 5 * 64 + 5  # elements of rank 0's shard: 6501
    # bf16 parameters, fp32 reduction: the shards' bf16 casts (_get_param_all_gather_inputs' foreach copy) and the
    # bf16 all-gather output on the copy-in stream; the reduce-scatter output in fp32, the parameters' own dtype,
    # so no cast after it. (The root is not resharded after forward: one all-gather a step, in forward.)
    assert _streamed("bf16", "fp32") == {"copy-in": [shard * 2, 2 * shard * 2], "reduce-scatter": [shard * 4]}
    # fp32 parameters, bf16 reduction: no cast before the all-gather; the bf16 reduce-scatter output, then its cast
    # to fp32 (_to_dtype_if_needed), both on the reduce-scatter stream
    assert _streamed("fp32", "bf16") == {"copy-in": [2 * shard * 4], "reduce-scatter": [shard * 2, shard * 4]}
    assert _streamed(None, None) == {"copy-in": [2 * shard * 4], "reduce-scatter": [shard * 4]}


def test_the_ranks_whose_shards_differ_are_found_by_torch_chunks_rule():
    from membench.predict.ranks import distinct_ranks, rows_held

    # 10 rows over 4 ranks: chunks of 3, 3, 3 and 1; over 8: 2 x 5 and none for ranks 5, 6 and 7
    assert [rows_held(10, 4, r) for r in range(4)] == [3, 3, 3, 1]
    assert [rows_held(10, 8, r) for r in range(8)] == [2, 2, 2, 2, 2, 0, 0, 0]
    mlp = [64, 64, 10, 10]  # the first dimensions of mlp's weights and biases
    assert distinct_ranks(mlp, Mesh(dp_shard=4)) == [0, 3]
    assert distinct_ranks(mlp, Mesh(dp_shard=8)) == [0, 5]
    assert distinct_ranks(mlp, Mesh(dp_shard=2)) == [0]
    # HSDP: rank 7 is dp_shard 3 of the second replica, as rank 3 of the first
    assert distinct_ranks(mlp, Mesh(dp_replicate=2, dp_shard=4)) == [0, 3]


def test_a_prediction_with_uneven_shards_predicts_each_distinct_rank():
    from membench.predict.run import predict

    record = predict(Job(RunSpec(MLP, 4, ("fsdp",), nproc_per_node=4, zero_grad="zeros")), round_to=1)
    assert [r.rank for r in record.ranks] == [0, 3]
    rank0, rank3 = (r.breakdown_at_peak for r in record.ranks)
    # Rank 0 holds [16, 192], [16], [3, 64], [3]; rank 3 rows 48..63 of the first layer and the last row of the
    # second: [16, 192], [16], [1, 64], [1]. Adam's states follow each rank's own rows; the gradients are views of
    # the reduce-scatter output, padded to the largest chunk on every rank (FSDP2's _fsdp_collectives.py).
    full, last = (16 * 192 + 16 + 3 * 64 + 3) * 4, (16 * 192 + 16 + 1 * 64 + 1) * 4
    assert (rank0["optimizer_state"], rank3["optimizer_state"]) == (2 * full + 4 * STEP, 2 * last + 4 * STEP)
    assert rank0["gradients"] == rank3["gradients"] == full



def _llama_held(mesh: str, techniques: tuple[str, ...]) -> dict[str, int]:
    job = Job(RunSpec(LLAMA, 2, techniques, nproc_per_node=parse_mesh(mesh).size, mesh=mesh, zero_grad="zeros",
                      seq_len=8))
    held = predict_memory(job, round_to=1).current_breakdown
    return {k: held[k] for k in ("parameters", "gradients", "optimizer_state")}


def test_tp_and_fsdp_shard_parameters_gradients_and_optimizer_state_as_derived_by_hand():
    # Full fp32 shapes: embedding [256, 64]; q [64, 64], k and v [32, 64] (2 KV heads of 16), o [64, 64];
    # gate and up [128, 64], down [64, 128]; two block norms, the final norm [64]; LM head [256, 64].
    # tp=2, torchtitan's plan: the embedding row-wise and q/k/v, gate/up and the LM head column-wise, all sharded on
    # dim 0; o and down row-wise, sharded on dim 1 (as DTensors their local tensors are [64, 32] and [64, 64]);
    # the norms replicated (sequence parallel).
    tp_sharded = (128 * 64) + (32 * 64 + 16 * 64 + 16 * 64 + 64 * 32) + (64 * 64 + 64 * 64 + 64 * 64) + 128 * 64
    assert tp_sharded * 2 == 256 * 64 + (64 * 64 + 2 * 32 * 64 + 64 * 64) + 3 * 128 * 64 + 256 * 64
    norms = 3 * 64
    rope = 2 * 8 * 4  # the rotary embedding's buffers, inv_freq and original_inv_freq: head_dim / 2 floats each
    adam_steps = (1 + 9 + 1 + 1) * STEP  # embedding, nine in the block, final norm, LM head
    tp_only = (tp_sharded + norms) * 4
    # The embedding's gradient is whole on every rank: its output gradient arrives sharded on the sequence
    # (Shard(1)), and DTensor's embedding_dense_backward strategies (torch/distributed/tensor/_ops/
    # _embedding_ops.py) take it as it is with the indices sharded the same way, making the weight's gradient a
    # Partial sum of the whole [256, 64], which the gradient keeps as a whole (Replicate) tensor after the step.
    whole_embedding_grad = 128 * 64 * 4
    assert _llama_held("tp=2", ("tp",)) == {"parameters": tp_only + rope, "gradients": tp_only + whole_embedding_grad,
                                             "optimizer_state": 2 * tp_only + adam_steps}
    # fsdp over dp_shard=2 on top: FSDP2 chunks each rank's TP-local tensor on dim 0, the norms included; it
    # redistributes each gradient to its parameter's placement before the reduce-scatter (FSDPParam.
    # _get_grad_inner_tensor), so the embedding's is sharded like the rest.
    both = (tp_sharded + norms) // 2 * 4
    assert _llama_held("dp_shard=2,tp=2", ("fsdp", "tp")) == {"parameters": both + rope, "gradients": both,
                                                             "optimizer_state": 2 * both + adam_steps}


def test_with_tp_the_distinct_ranks_follow_the_tp_local_first_dimensions():
    from membench.predict.emulate import fake
    from membench.predict.ranks import distinct_ranks
    from membench.predict.ranks import model_first_dims as first_dims
    from membench.workloads import load_workload

    model = fake.build_on_meta(load_workload(LLAMA).build_model)
    # embedding, q, k, v (dim 0 halved), o (sharded on dim 1: whole dim 0), gate, up (halved), down, two norms,
    # final norm, LM head (halved)
    assert first_dims(model, 2) == [128, 32, 16, 16, 64, 64, 64, 64, 64, 64, 64, 128]
    # dp_shard=3: 64 rows in chunks of 22 (22, 22, 20), 16 in chunks of 6 (6, 6, 4): the third dp_shard coordinate
    # differs; with tp innermost its first rank is 2 x 2 = 4
    assert distinct_ranks(first_dims(model, 2), Mesh(dp_shard=3, tp=2)) == [0, 4]
    assert distinct_ranks(first_dims(model, 2), Mesh(dp_shard=2, tp=2)) == [0]
