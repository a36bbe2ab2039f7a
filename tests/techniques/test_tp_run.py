"""Tensor parallelism (tp) through the real launcher and torchrun on CPU (gloo): the same model trained, each rank's
measured memory equal to the prediction's on a fake process group, to the byte."""

from __future__ import annotations

import pytest

from membench.cli import main
from membench.predict.run import predict_memory
from membench.results import read_result
from membench.spec import Job, RunSpec

pytestmark = pytest.mark.slow  # torchrun starts 2 and 4 processes, each importing torch (about a minute here)

LLAMA = ("hf:llama,num_hidden_layers=1,hidden_size=64,num_attention_heads=4,num_key_value_heads=2,"
         "intermediate_size=128,vocab_size=256,head=causal-lm")


def _run(out, techniques: str, mesh: str, ranks: int) -> None:
    code = main(["run", "--device", "cpu", "--workload", LLAMA, "--batch-size", "2", "--seq-len", "8",
                 "--techniques", techniques, "--mesh", mesh, "--nproc-per-node", str(ranks), "--steps", "1",
                 "--warmup", "1", "--out", str(out)])
    assert code == 0, [p.read_text()[-3000:] for p in (out / "runs").glob("*.log")]


@pytest.mark.parametrize("techniques, mesh, ranks", [("tp,fsdp+tp", "tp=2", 2), ("fsdp+tp", "dp_shard=2,tp=2", 4)])
def test_tp_trains_the_same_model_and_measures_what_its_prediction_says(tmp_path, techniques, mesh, ranks):
    _run(tmp_path, techniques, mesh, ranks)
    base = read_result(tmp_path / "baseline.json")
    for name in techniques.split(","):
        result = read_result(tmp_path / f"{name}.json")
        assert result.status == "ok" and result.world_size == ranks
        assert [r.rank for r in result.ranks] == list(range(ranks))
        eq = result.equivalence
        assert eq.verdict == "equivalent", eq
        data_ranks = ranks // 2  # the two ranks of a tp group train on one batch
        assert (f"{data_ranks} ranks against one process at batch {2 * data_ranks}" in eq.compared) == (data_ranks > 1)
        # samples per step: the data-parallel ranks' batches, not every rank's
        assert result.timing.samples_per_s == pytest.approx(2 * data_ranks / result.timing.median_s)
        predicted = predict_memory(Job(RunSpec(LLAMA, 2, tuple(name.split("+")), nproc_per_node=ranks, mesh=mesh,
                                               seq_len=8)), round_to=1)
        state = ("parameters", "gradients", "optimizer_state")
        for rank in result.ranks:  # every rank holds the same here: the sizes divide by tp and by dp_shard
            measured = rank.breakdown_at_peak
            assert rank.peak_phase == predicted.peak_phase
            assert {k: measured[k] for k in state} == {k: predicted.breakdown_at_peak[k] for k in state}
            # The peak, to the byte in most runs here; when gloo's worker threads finish a collective decides when
            # its buffers are freed, and about one run in three under load peaked higher, in temporaries (5,888 or
            # 6,144 B more, 1.2% of the peak): allowed up to 8 KiB. A rank's
            # inputs are its slice of the whole batch, which on CPU is a view keeping the whole batch's storage
            # (2 x 128 B here where the data-parallel ranks split it); a GPU run copies the slice to the device, as
            # the prediction counts it.
            kept = (data_ranks - 1) * predicted.breakdown_at_peak["inputs"]
            assert measured["inputs"] == predicted.breakdown_at_peak["inputs"] + kept
            extra = rank.peak_allocated_bytes - kept - predicted.peak_allocated_bytes
            assert 0 <= extra <= 8192, (measured, predicted.breakdown_at_peak)
        assert predicted.peak_allocated_bytes < base.memory.peak_allocated_bytes
