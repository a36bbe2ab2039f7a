"""Check membench's predicted step time against published throughput tables, never tuned to them.

    python benchmarks/validate_time.py [--software today|1.10|1.9]

The Hugging Face performance doc behind the project's first seed (transformers "Efficient Training on a Single GPU",
first published with v4.18 as "Performance and Scalability"; the seed quotes its first three rows): the Trainer on
bert-large-uncased, sequence classification, sequence length 512, 512 samples, one V100 16 GB (the doc's
nvidia-smi: driver 460.91.03, CUDA 11.2), January 2022 software (benchmarks/software_2022.py: torch 1.10 or 1.9,
transformers 4.18). Its seven rows' samples/s: the doc's English original and its translations (docs/source/{zh,ko,
ja}/perf_train_gpu_one.md print the same numbers). Each row is predicted as `membench predict` does (the same
settings as benchmarks/validate_predictions.py's memory check), as that software ran, and printed beside the
published figure: the absolute error, and the cost against the table's own baseline row (batch 4), published and
predicted.

The doc's samples/s is the Trainer's `train_samples_per_second`: 512 samples over the whole `train()`, which also
holds the first step's start-up (cuBLAS and CUDA context warm-up) and the data loader; a prediction is of one
steady step. The gate: the seed's three rows (batch 4; batch 1 with 4 accumulation steps; and with gradient
checkpointing) must be within 20% in samples/s, and accumulation's and checkpointing's costs against batch 4 within
5 percentage points of the published ones. Exit 0 when they are, 1 when not. No other table is checked yet.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's membench, run from anywhere
sys.path.insert(0, str(Path(__file__).resolve().parent))

from tabulate import tabulate  # noqa: E402
from validate_predictions import HF_ROWS, HF_WORKLOAD  # noqa: E402

# samples/s of each row of HF_ROWS, in its order (the doc: "Time" and "Samples/second" under each configuration).
HF_SAMPLES_PER_S = {
    "batch 4": 8.86,
    "batch 1, accumulation 4": 7.75,
    "+ gradient checkpointing": 5.99,
    "batch 4, fp16": 18.64,
    "batch 1, accum 4, ckpt, fp16": 10.09,
    "batch 4, Adafactor": 7.96,
    "batch 1, accum 4, ckpt, fp16, Adafactor": 9.06,
}
GATED = ("batch 4", "batch 1, accumulation 4", "+ gradient checkpointing")  # the seed's rows
BASELINE = "batch 4"
BATCH = 4  # samples a step, in every row (accumulation splits them)
MAX_THROUGHPUT_ERROR = 0.20
MAX_COST_ERROR_PP = 5.0


def predicted_time(techniques: str, optimizer: str):
    """The PredictedTime of one row, as validate_predictions.hf_rows plans it (batch 4 in all; accum splits it)."""
    from membench.api import plan
    from membench.predict.run import predict_traced

    [*_, job] = plan(HF_WORKLOAD, techniques, BATCH, device="cpu", target_device="cuda", seq_len=512,
                     optimizer=optimizer, accum_steps=4, zero_grad="zeros", clip_grad_norm=1.0, gpu="V100",
                     check=False, timeline=False, in_process=True)
    return predict_traced(job).time


def rows(software: str) -> tuple[list[list], bool]:
    """Each published row beside its prediction, and whether the gate passed."""
    from software_2022 import early_2022

    context = contextlib.nullcontext if software == "today" else lambda: early_2022(software)
    predicted = {}
    for setting, techniques, optimizer, _ in HF_ROWS:
        started = time.perf_counter()
        with context():
            predicted[setting] = (predicted_time(techniques, optimizer), time.perf_counter() - started)
    base_published = HF_SAMPLES_PER_S[BASELINE]
    base_predicted = BATCH / predicted[BASELINE][0].step_s  # the record's throughput is in tokens (seq 512)
    table, ok = [], True
    for setting, *_ in HF_ROWS:
        published = HF_SAMPLES_PER_S[setting]
        t, seconds = predicted[setting]
        samples = BATCH / t.step_s
        error = samples / published - 1
        cost_published = base_published / published - 1
        cost_predicted = base_predicted / samples - 1
        cost_error_pp = (cost_predicted - cost_published) * 100
        gated = setting in GATED
        passed = abs(error) <= MAX_THROUGHPUT_ERROR and (setting == BASELINE or abs(cost_error_pp) <= MAX_COST_ERROR_PP)
        ok &= passed or not gated
        table.append([setting, published, f"{samples:.2f}", f"{BATCH / t.high_s:.2f}-{BATCH / t.low_s:.2f}",
                      f"{error:+.1%}", f"{cost_published:+.1%}", f"{cost_predicted:+.1%}", f"{cost_error_pp:+.1f}",
                      _top(t), ("pass" if passed else "FAIL") if gated else "-", f"{seconds:.0f}"])
    return table, ok


def _top(t) -> str:
    """The three largest parts of the predicted step, in ms."""
    parts = sorted(t.by_class_s.items(), key=lambda kv: -kv[1])[:3]
    return ", ".join(f"{name} {seconds * 1e3:.0f}" for name, seconds in parts)


HEADERS = ["Trainer setting", "published samples/s", "predicted", "range", "error", "cost vs batch 4 (published)",
           "(predicted)", "cost error (pp)", "largest parts (ms)", "gate", "predict s"]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--software", choices=("today", "1.10", "1.9"), default="1.10",
                        help="predict as today's torch and transformers train, or as the doc's January 2022 "
                             "software did (software_2022.py; default 1.10)")
    args = parser.parse_args(argv)
    import torch

    table, ok = rows(args.software)
    print(f"Hugging Face single-GPU doc, bert-large seq 512 on a V100 16 GB: published samples/s vs predicted "
          f"(membench on torch {torch.__version__}, predicting as {args.software}; predictions, no GPU ran)")
    print(tabulate(table, headers=HEADERS))
    print(f"gate (the seed's rows): samples/s within {MAX_THROUGHPUT_ERROR:.0%}, costs within "
          f"{MAX_COST_ERROR_PP:.0f} pp: {'pass' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
