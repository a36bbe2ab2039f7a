"""Predictions before and after a change, field by field: a refactoring must leave every one byte-identical.

    python benchmarks/compare_records.py run OUT [--only TEXT] [--tables] [--truth DIR] [--gpu-runs ARCHIVE]
    python benchmarks/compare_records.py compare BEFORE AFTER [--keep-cannot-see]

`run` runs a fixed list of `membench predict` and `membench fit` commands (CASES: gpt-tiny, vit-tiny and small
hf:gpt2 and hf:llama shapes; baseline, ckpt, accum, opt-in-bwd, amp, bf16, sac, fsdp on two ranks, gradient
clipping; the default H100, an H200 and a T4 for their attention kernels; a CPU target) with this checkout's
membench, each into OUT/<case>/ (the records, and the command's output with its timings masked). With --tables it
also keeps the validation scripts' tables (benchmarks/validate_predictions.py, benchmarks/validate_gpu_runs.py on
--gpu-runs) in OUT/tables/.

`compare` reads two such folders and prints every field that differs: each record's JSON compared value by value
(not its start time, wall time or commit; nor, unless --keep-cannot-see, the limitations it lists, which are prose),
each output file line by line. Exit 0 when they agree, 1 on any difference (or a file only one side has), 2 on bad
arguments.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TINY_GPT2 = "hf:gpt2,n_layer=2,n_embd=64,n_head=2,vocab_size=256,n_positions=128"
TINY_LLAMA = ("hf:llama,num_hidden_layers=2,hidden_size=64,num_attention_heads=2,num_key_value_heads=1,"
              "intermediate_size=128,vocab_size=256")
ALL = "accum,ckpt,opt-in-bwd,amp-bf16,amp-fp16,bf16,sac"

# (case, membench arguments): every `predict` runs baseline too.
CASES = [
    ("gpt-tiny", ["predict", "--workload", "gpt-tiny", "--batch-size", "8", "--techniques", ALL]),
    ("gpt-tiny-clip", ["predict", "--workload", "gpt-tiny", "--batch-size", "8", "--clip-grad-norm", "1.0",
                       "--techniques", "amp-fp16,bf16,ckpt"]),
    ("gpt-tiny-h200", ["predict", "--workload", "gpt-tiny", "--batch-size", "8", "--gpu", "H200",
                       "--techniques", "amp-bf16,ckpt"]),
    ("gpt-tiny-t4", ["predict", "--workload", "gpt-tiny", "--batch-size", "8", "--gpu", "T4",
                     "--techniques", "amp-fp16,ckpt"]),
    ("gpt-tiny-cpu", ["predict", "--workload", "gpt-tiny", "--batch-size", "8", "--device", "cpu",
                      "--techniques", "ckpt,accum,amp-bf16"]),
    ("gpt-tiny-warmup0", ["predict", "--workload", "gpt-tiny", "--batch-size", "8", "--warmup", "0",
                          "--techniques", "ckpt"]),
    ("gpt-tiny-fsdp", ["predict", "--workload", "gpt-tiny", "--batch-size", "8", "--world-size", "2",
                       "--techniques", "fsdp,fsdp+amp-bf16"]),
    ("gpt-tiny-fsdp-clip", ["predict", "--workload", "gpt-tiny", "--batch-size", "8", "--world-size", "2",
                            "--clip-grad-norm", "1.0", "--techniques", "fsdp"]),
    ("vit-tiny", ["predict", "--workload", "vit-tiny", "--batch-size", "8", "--techniques", ALL]),
    ("vit-tiny-t4", ["predict", "--workload", "vit-tiny", "--batch-size", "8", "--gpu", "T4", "--clip-grad-norm",
                     "1.0", "--techniques", "amp-fp16,ckpt"]),
    ("gpt2", ["predict", "--workload", TINY_GPT2, "--batch-size", "4", "--seq-len", "64", "--techniques", ALL]),
    ("gpt2-t4", ["predict", "--workload", TINY_GPT2, "--batch-size", "4", "--seq-len", "64", "--gpu", "T4",
                 "--clip-grad-norm", "1.0", "--techniques", "amp-fp16,amp-bf16"]),
    ("llama", ["predict", "--workload", TINY_LLAMA, "--batch-size", "4", "--seq-len", "64", "--techniques", ALL]),
    ("llama-h200", ["predict", "--workload", TINY_LLAMA, "--batch-size", "4", "--seq-len", "64", "--gpu", "H200",
                    "--clip-grad-norm", "1.0", "--techniques", "amp-bf16,bf16,sac"]),
    ("llama-t4", ["predict", "--workload", TINY_LLAMA, "--batch-size", "4", "--seq-len", "64", "--gpu", "T4",
                  "--techniques", "amp-fp16,ckpt"]),
    ("llama-fsdp", ["predict", "--workload", TINY_LLAMA, "--batch-size", "4", "--seq-len", "64", "--world-size",
                    "2", "--techniques", "fsdp,fsdp+ckpt"]),
    ("fit-gpt-tiny", ["fit", "--workload", "gpt-tiny", "--budget", "200MiB", "--techniques", "ckpt,amp-bf16"]),
    ("fit-llama", ["fit", "--workload", TINY_LLAMA, "--seq-len", "64", "--budget", "64MiB",
                   "--techniques", "ckpt"]),
]
IGNORED = {"started", "wall_s", "git_commit"}
_SECONDS = re.compile(r"\b\d+(\.\d+)? s\b")  # "(1.5 s)": a command's timings


def _masked(text: str, out: Path) -> str:
    """Timings and the output folder masked: the rest must be the same."""
    text = text.replace(str(out), "<out>")
    return "\n".join(_SECONDS.sub("<s> s", line) for line in text.splitlines()) + "\n"


def _run(argv: list[str], out: Path, name: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=os.environ)
    (out / name).write_text(_masked(proc.stdout, out) + f"exit {proc.returncode}\n")
    if proc.returncode:
        (out / (name + ".stderr")).write_text(proc.stderr)
    print(f"{out.name}/{name}: exit {proc.returncode}", flush=True)


def _mask_seconds_column(path: Path) -> None:
    """The tables' last column, the seconds each prediction took ("predict s"), masked."""
    # right-aligned: the spaces before it vary with the number's width, so they go too
    path.write_text(re.sub(r"  +(\d+(\.\d+)?|<s>)\n", "  <s>\n", path.read_text()))


def run(out: Path, only: str | None, tables: bool, gpu_runs: list[Path], truth: Path | None) -> int:
    for case, args in CASES:
        if only and only not in case:
            continue
        folder = out / case
        extra = ["--jobs", "1"] + (["--out", str(folder)] if args[0] == "predict" else [])
        _run([sys.executable, "-m", "membench", *args, *extra], folder, "stdout.txt")
    if tables and (not only or only in "validate_predictions"):
        # its CS336 table imports the course's model code, which needs einx; without it, the Hugging Face table only
        hf_only = ["--hf-only"] if importlib.util.find_spec("einx") is None else []
        _run([sys.executable, str(ROOT / "benchmarks" / "validate_predictions.py"), *hf_only,
              *(["--truth", str(truth)] if truth else [])], out / "tables", "validate_predictions.txt")
        _mask_seconds_column(out / "tables" / "validate_predictions.txt")
    if tables and gpu_runs and (not only or only in "validate_gpu_runs"):
        _run([sys.executable, str(ROOT / "benchmarks" / "validate_gpu_runs.py"), *map(str, gpu_runs), "--jobs", "1"],
             out / "tables", "validate_gpu_runs.txt")
        _mask_seconds_column(out / "tables" / "validate_gpu_runs.txt")
    return 0


def _differences(before, after, where: str, ignored: set[str]):
    if isinstance(before, dict) and isinstance(after, dict):
        for key in sorted(set(before) | set(after)):
            if key in ignored:
                continue
            if key not in before or key not in after:
                yield f"{where}.{key}: {before.get(key, '(absent)')!r} -> {after.get(key, '(absent)')!r}"
            else:
                yield from _differences(before[key], after[key], f"{where}.{key}", ignored)
    elif isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        for i, (b, a) in enumerate(zip(before, after)):
            yield from _differences(b, a, f"{where}[{i}]", ignored)
    elif before != after or type(before) is not type(after):
        yield f"{where}: {before!r} -> {after!r}"


def compare(before: Path, after: Path, keep_cannot_see: bool) -> int:
    ignored = IGNORED if keep_cannot_see else IGNORED | {"cannot_see"}
    files = lambda root: {p.relative_to(root) for p in root.rglob("*")  # noqa: E731
                          if p.is_file() and p.name != ".membench.lock"}  # the lock holds a process id
    b_files, a_files = files(before), files(after)
    found = [f"{path}: only in {before if path in b_files else after}" for path in sorted(b_files ^ a_files)]
    same = 0
    for path in sorted(b_files & a_files):
        b_text, a_text = (before / path).read_text(), (after / path).read_text()
        if path.suffix == ".json":
            diffs = list(_differences(json.loads(b_text), json.loads(a_text), str(path), ignored))
        else:
            b_lines, a_lines = b_text.splitlines(), a_text.splitlines()
            diffs = [f"{path}:{i + 1}: {b!r} -> {a!r}" for i, (b, a) in enumerate(zip(b_lines, a_lines)) if b != a]
            if len(b_lines) != len(a_lines):
                diffs.append(f"{path}: {len(b_lines)} lines -> {len(a_lines)}")
        found += diffs
        same += not diffs
    for line in found:
        print(line)
    print(f"{same} of {len(b_files | a_files)} files identical; {len(found)} difference(s)")
    return 1 if found else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    r = commands.add_parser("run", help="run the cases into a folder")
    r.add_argument("out", type=Path)
    r.add_argument("--only", help="only the cases (and tables: validate_predictions, validate_gpu_runs) whose name "
                   "contains this text")
    r.add_argument("--tables", action="store_true", help="also the validation scripts' tables")
    r.add_argument("--gpu-runs", type=Path, action="append", default=[],
                   help="an archive for validate_gpu_runs.py (results/gpu-runs/*.tar.xz; repeatable)")
    r.add_argument("--truth", type=Path, help="validate_predictions.py's --truth (../shared/gpu-truth)")
    c = commands.add_parser("compare", help="compare two folders that `run` wrote")
    c.add_argument("before", type=Path)
    c.add_argument("after", type=Path)
    c.add_argument("--keep-cannot-see", action="store_true", help="compare the records' cannot_see lists too")
    args = parser.parse_args(argv)
    if args.command == "run":
        return run(args.out, args.only, args.tables, args.gpu_runs, args.truth)
    for folder in (args.before, args.after):
        if not folder.is_dir():
            parser.error(f"{folder}: not a folder (give two folders `run` wrote)")
    return compare(args.before, args.after, args.keep_cannot_see)


if __name__ == "__main__":
    sys.exit(main())
