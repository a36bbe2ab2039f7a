"""predict's answer and membench report recommend by one rule (results/choice.py): the same technique for the
same CUDA predictions, named with what it changes where it changes something."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from membench.predict.gpus import gpu
from membench.predict.verdict import answer, capacity
from membench.report.recommend import recommend
from membench.report.words import recommendation_lines
from membench.results import Memory, RunRecord
from membench.results.choice import card_fit, changes, order
from membench.results.schema import OnCard
from membench.results.sweep import Sweep
from membench.spec import Job, RunSpec
from membench.techniques import cost_of, resolve

GiB = 2**30
T4 = gpu("T4")
CONTEXT = 804_061_184  # predict/device.py's CUDA context: the whole-device estimate is reserved + this


def record(name: str, reserved: int) -> RunRecord:
    """A CUDA prediction for a T4 as predict/run.py records one: numerics and cost from the stack, and, where the
    unbounded simulation reserves more than the card less the context, its replay under the card (here: out of
    memory, as a step that does not fit)."""
    techniques = () if name == "baseline" else tuple(name.split("+"))
    spec = RunSpec("gpt-tiny", 4, techniques, "cuda", gpu="T4")
    room = capacity(T4) - CONTEXT  # card_capacity at one rank: no NCCL buffers
    on_card = OnCard(capacity_bytes=room, peak_reserved_bytes=room, oom=True) if reserved > room else None
    memory = Memory(device="cuda", method="prediction", peak_phase="backward", peak_step=0,
                    peak_allocated_bytes=reserved, peak_reserved_bytes=reserved, on_card=on_card)
    return RunRecord(name=name, status="ok", spec=Job(spec), memory=memory, predicted=True, predicted_for="cuda",
                     numerics=resolve(spec).numerics, cost=cost_of(techniques))


def test_predict_and_report_name_the_same_technique_and_say_bf16_changes_the_numerics():
    # 16 GB T4: the baseline and opt-in-bwd are over; bf16 (no step-time cost, changes the numerics) and
    # ckpt+opt-in-bwd+bf16 (medium cost) fit: the cheapest is bf16, named with what it changes.
    records = [record("baseline", 20 * GiB), record("opt-in-bwd", 19 * GiB), record("bf16", 12 * GiB),
               record("ckpt+opt-in-bwd+bf16", 5 * GiB)]
    said = answer(records, T4)
    assert "cheapest listed that fits: bf16 (no step-time cost; changes the numerics, " in said
    rec = recommend(Sweep.group(records)[0])
    assert rec.outcome == "pick" and rec.pick.name == "bf16" and rec.card == "T4"
    assert "pick bf16: the cheapest listed that fits the T4 (no step-time cost; changes the numerics)" in (
        recommendation_lines(rec)[0])


def test_a_baseline_that_fits_is_kept_by_both():
    records = [record("baseline", 10 * GiB), record("bf16", 6 * GiB)]
    assert ": baseline fits, " in answer(records, T4)
    assert recommend(Sweep.group(records)[0]).outcome == "fits-card"


def test_the_rule_prefers_cost_then_changing_nothing_then_fewer_techniques_then_room():
    assert order("none", "precision", 1, 0) < order("low", "exact", 1, 0)  # cost first
    assert order("low", "exact", 1, 0) < order("low", "precision", 1, 0)  # then changing nothing
    assert order("low", "exact", 1, 0) < order("low", "exact", 2, 0)  # then fewer techniques
    assert order("low", "exact", 1, 5) < order("low", "exact", 1, 1)  # then more room
    assert order(None, "exact", 0, 0) > order("high", "exact", 0, 0)  # an older record's unknown cost: last


def test_any_numerics_but_the_same_models_changes_something():
    assert [changes(n) for n in ("exact", "rounding", "batch-split", None)] == [None] * 4
    assert changes("precision") == "the numerics"
    assert changes("adapters") == "adapters"  # a value a newer technique declares: named as it is


def test_a_measurement_has_no_card_fit():
    r = record("baseline", GiB)
    r.predicted = False
    assert card_fit(r) is None


def test_a_prediction_above_the_baseline_says_the_attention_kernel_it_falls_back_to():
    from membench.report.table import notes
    from membench.results.schema import Attention, AttentionSite

    def attention(backend: str, dtype: str, refused: list[str]) -> Attention:
        return Attention("torch 2.14.1 sdp_utils.cpp on sm75", [AttentionSite(backend, [2, 4, 8, 16], dtype, True,
                                                                                0.0, False, refused)])

    base, bf16 = record("baseline", 10 * GiB), record("bf16", 11 * GiB)
    base.memory.attention = attention("efficient", "float32", ["flash: needs sm80-sm121"])
    bf16.memory.attention = attention("math", "bfloat16", ["flash: needs sm80-sm121", "efficient: dtype bfloat16"])
    said = notes(Sweep.group([base, bf16])[0])
    assert ("bf16: predicted above the baseline (allocated and reserved): its attention runs the math kernel (flash: "
            "needs sm80-sm121; efficient: dtype bfloat16; torch 2.14.1 sdp_utils.cpp on sm75), where the baseline's "
            "runs efficient") in said
    bf16.memory.attention = base.memory.attention  # the same kernels: no reason the record knows, no note
    assert not [n for n in notes(Sweep.group([base, bf16])[0]) if n.startswith("bf16:")]


@pytest.mark.slow
def test_predict_and_report_on_hf_llama_agree(tmp_path):
    """issue 46's case: predict on hf:llama with bf16 among the techniques prints the fits line first, saying what
    the pick changes, and `membench report` on the same folder recommends the same technique."""
    out = tmp_path / "p"
    command = [sys.executable, "-m", "membench", "predict", "--workload", "hf:llama", "--techniques",
               "opt-in-bwd,bf16,ckpt+opt-in-bwd+bf16", "--out", str(out)]
    predicted = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert predicted.returncode == 0, predicted.stderr[-2000:]
    first = predicted.stdout.splitlines()[0]
    pick = re.search(r"cheapest listed that fits: (\S+) \(.*changes the numerics", first).group(1)
    reported = subprocess.run([sys.executable, "-m", "membench", "report", str(out), "--no-files"],
                              capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert reported.returncode == 0, reported.stderr[-2000:]
    assert f"pick {pick}: the cheapest listed that fits the H100 (" in reported.stdout
