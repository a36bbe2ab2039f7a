"""fit --by world-size (predict/fit/world.py): the fewest ranks whose per-rank peak is within the budget."""

from __future__ import annotations

import pytest

from membench.predict.fit.world import smallest_world, world_answer, world_sizes_to_try
from membench.spec import Job, RunSpec

JOB = Job(RunSpec("gpt-tiny", 1, ("fsdp",), device="cuda", gpu="H100"))


def _sharded(world: int) -> int:
    """A per-rank peak by hand: 100 B on every rank plus 800 B sharded over the ranks."""
    return 100 + 800 // world


def test_doubling_then_every_count_below_a_node():
    """Within 210 B: 800 / w <= 110 needs w >= 7.3, so 8 ranks (200 B). Tried: 1, 2, 4 (300 B, over), 8 (fits),
    then 6 (233 B) and 7 (214 B), both over."""
    tried = []
    fit = smallest_world(JOB, 210, lambda job: _sharded(job.run.nproc_per_node), True,
                         lambda world, peak: tried.append(world))
    assert (fit.world_size, fit.peak, fit.over_world, fit.over_peak) == (8, 200, 7, 214)
    assert tried == [1, 2, 4, 8, 6, 7] and fit.predictions == 6


def test_multiples_of_eight_above_a_node():
    """Within 130 B: w >= 26.7; between 16 (150 B, over) and 32 (125 B) only 24 (133 B, over) is tried: 32."""
    fit = smallest_world(JOB, 130, lambda job: _sharded(job.run.nproc_per_node), True)
    assert (fit.world_size, fit.over_world) == (32, 24)
    assert world_sizes_to_try(16, 32) == [24] and world_sizes_to_try(4, 8) == [5, 6, 7]


def test_none_fits_and_not_distributed():
    fit = smallest_world(JOB, 50, lambda job: _sharded(job.run.nproc_per_node), True)
    assert (fit.world_size, fit.over_world) == (0, 1024)
    alone = smallest_world(JOB, 1000, lambda job: 900, False)
    assert (alone.world_size, alone.predictions, alone.distributed) == (1, 1, False)
    assert world_answer([fit], 50) == ("within 50 B per rank (whole device): fsdp does not fit at 1024 ranks "
                                       "(50 B over).")
    assert "keeps everything on every rank: fits (100 B to spare)" in world_answer([alone], 1000)


@pytest.mark.slow  # a dozen predictions of a 2-layer llama
def test_fit_by_world_size_end_to_end(capsys):
    """The answer's world size fits and the largest tried below it does not, each checked by a prediction of its
    own (predict/fit/world.rank_peak of predict's record)."""
    from membench.cli import main
    from membench.predict.fit.world import rank_peak
    from membench.predict.run import predict

    workload = ("hf:llama,num_hidden_layers=2,hidden_size=1024,intermediate_size=4096,num_attention_heads=8,"
                "num_key_value_heads=2,vocab_size=32000")
    budget = 2_500_000_000
    assert main(["fit", "--workload", workload, "--techniques", "fsdp", "--batch-size", "1", "--seq-len", "256",
                 "--by", "world-size", "--budget", str(budget), "--jobs", "1"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("fsdp "))
    world, over = int(line.split()[1]), int(line.split()[4].rstrip(":"))
    at = lambda w: rank_peak(predict(Job(RunSpec(workload, 1, ("fsdp",), device="cuda", gpu="H100", seq_len=256,  # noqa: E731
                                                 nproc_per_node=w))))
    assert at(world) <= budget < at(over) and over < world
