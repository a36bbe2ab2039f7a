"""Sharded training's options (--mesh, --param-dtype, --reduce-dtype, --reshard-after-forward) and what each rank
of a prediction holds, against shard sizes derived by hand (CPU; fake process groups)."""

from __future__ import annotations

import pytest

from membench import cli
from membench.common.errors import UserError
from membench.predict.run import predict_memory, predict_traced
from membench.spec import Job, RunSpec
from membench.techniques.mesh import Mesh, check_reshard_after_forward, parse_mesh

MLP = "tests.workloads:mlp"  # Linear(192, 64) and Linear(64, 10), fully_shard on the root alone (no blocks)
STEP = 4  # bytes of each Adam step count (a float32 scalar per parameter)


def test_a_mesh_is_spelled_one_way_and_lays_ranks_out_as_torchtitan():
    mesh = parse_mesh(" tp=2, dp_shard=4 ,dp_replicate=2")
    assert (mesh, mesh.size, mesh.text) == (Mesh(2, 4, 2), 16, "dp_replicate=2,dp_shard=4,tp=2")
    assert parse_mesh(None, 8) == Mesh(dp_shard=8) and parse_mesh("dp_shard=1").text == "dp_shard=1"
    # row-major over (dp_replicate, dp_shard, tp): tp innermost, the ranks of one node
    assert [tuple(mesh.coordinates(r).values()) for r in (0, 1, 2, 9, 15)] == [
        (0, 0, 0), (0, 0, 1), (0, 1, 0), (1, 0, 1), (1, 3, 1)]


@pytest.mark.parametrize("text, message", [
    ("pp=2", "'pp=2' is not NAME=SIZE pairs"), ("dp_shard=0", "'dp_shard=0' is not"),
    ("dp_shard=2,dp_shard=2", "dp_shard is given twice"), ("dp_shard", "is not NAME=SIZE")])
def test_a_bad_mesh_is_one_line_naming_the_valid_dimensions(text, message):
    with pytest.raises(UserError, match=message) as error:
        parse_mesh(text)
    assert "dp_replicate, dp_shard, tp" in str(error.value) or "twice" in message


def test_a_tp_dimension_is_refused_until_a_technique_uses_it():
    with pytest.raises(UserError, match=r"--mesh dp_shard=4,tp=2: tensor parallelism \(tp\) is not supported yet; "
                                        r"valid dimensions: dp_replicate, dp_shard"):
        RunSpec(MLP, 4, ("fsdp",), nproc_per_node=8, mesh="dp_shard=4,tp=2").validated()


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
