"""A user's mistake gets one clear line and exit code 2, never a traceback."""

import json
import os
import subprocess
import sys

import pytest
import torch

from tests.helpers import cli, probe_in_process

CASES = [
    (["run", "--techniques", "accum,foo"], "unknown technique 'foo'; valid: baseline, accum"),
    (["run", "--workload", "resnet9000"], "unknown workload 'resnet9000'; valid: vit-tiny"),
    (["run", "--workload", "vit-tiny", "--batch-size", "6", "--techniques", "accum"],
     "--batch-size 6 is not divisible by --accum-steps 4"),
    (["run", "--steps", "0"], "--steps must be an integer from 1 to 2147483647, got 0"),
    (["run", "--batch-size", "-3"], "--batch-size must be an integer from 1 to 2147483647, got -3"),
    (["run", "--techniques", "accum+opt-in-bwd"],
     "cannot combine accum with opt-in-bwd in 'accum+opt-in-bwd': a step per"),
    (["run", "--workload", "tests.workloads:nope"], "has no callable 'nope'"),
    (["run", "--workload", "no_such_module:f"], "cannot import workload module 'no_such_module'"),
    (["run", "--workload", "tests.workloads:not_a_workload"], "must return membench.workloads.Workload"),
    (["run", "--memory-budget", "lots"], "cannot read 'lots' as a size"),
    (["report", "does/not/exist"], "does not exist"),
    # Workload names: package.module:factory, checked before anything is imported.
    (["run", "--workload", ":"], "is not package.module:factory"),
    (["run", "--workload", ".x:f"], "is not package.module:factory"),
    (["run", "--workload", "../../etc:passwd"], "is not package.module:factory"),
    (["run", "--workload", "a" + ".a" * 3000 + ":f"], "characters) is not package.module:factory"),
    (["run", "--workload", "a" * 190 + ":f"], "cannot import workload module"),
    # Numbers: finite, in range.
    (["run", "--timeout", "nan"],
     "--timeout must be a positive number of seconds, at most 31622400 (366 days), got nan"),
    (["run", "--lr", "nan"], "--lr must be a finite positive number, got nan"),
    (["run", "--lr", "1e400"], "--lr must be a finite positive number, got inf"),
    (["run", "--warmup", "-1"], "--warmup must be an integer from 0 to 2147483647, got -1"),
    (["run", "--memory-budget", "9" * 400], "is too large to be a size in bytes"),
    (["run", "--torchrun-args", "'"], "cannot split \"'\" into arguments: No closing quotation"),
    (["check", "x", "--baseline", "y", "--rule", "peak_allocated:1e400%"], "the limit must be a finite number"),
    (["check", "x", "--baseline", "y", "--rule", "peak_allocated:" + "9" * 400], "too large to be a size"),
    (["check", "x", "--baseline", "y", "--rule", "step_time:" + "9" * 400], "too large to be a number"),
    (["run", "--out", "x" * 300, "--workload", "vit-tiny", "--batch-size", "4"], "File name too long"),
    # "cannot create the folder ...", not "workload 'vit-tiny' raised OSError"
    (["predict", "--out", "x" * 300, "--workload", "vit-tiny", "--batch-size", "4"],
     "/" + "x" * 300 + ": File name too long"),
]


SHARDING_CASES = [
    (["predict", "--workload", "gpt-tiny", "--batch-size", "2", "--techniques", "ckpt", "--mesh", "dp_shard=2"],
     "--mesh shape sharded training: add a sharding technique to --techniques (fsdp, "),
    (["predict", "--workload", "gpt-tiny", "--batch-size", "2", "--techniques", "ckpt,opt-in-bwd", "--param-dtype",
      "bf16", "--reshard-after-forward", "false"], "--param-dtype, --reshard-after-forward shape sharded training"),
    (["run", "--workload", "gpt-tiny", "--batch-size", "2", "--device", "cpu", "--reduce-dtype", "fp32"],
     "--reduce-dtype shape sharded training"),
]


@pytest.mark.parametrize("args,message", SHARDING_CASES)
def test_sharding_options_without_a_sharding_technique_are_refused(monkeypatch, args, message):
    with probe_in_process(monkeypatch):
        one_line_and_exit_2(args, message)


def run(args):
    return cli(*args)


@pytest.mark.parametrize("args,message", CASES)
def test_bad_input_is_one_line_and_exit_2(monkeypatch, args, message):
    with probe_in_process(monkeypatch):
        one_line_and_exit_2(args, message)


def one_line_and_exit_2(args, message):
    proc = run(args)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert message in lines[0]
    assert "Traceback" not in proc.stderr


FAST = ["--workload", "vit-tiny", "--batch-size", "2", "--techniques", "baseline", "--steps", "1", "--warmup", "1",
        "--no-check", "--no-timeline"]


def _file(tmp_path):
    (tmp_path / "a-file").write_text("")
    return str(tmp_path / "a-file")


def _results(tmp_path):
    """A minimal result folder, for commands that read one."""
    (tmp_path / "r").mkdir(exist_ok=True)
    (tmp_path / "r" / "baseline.json").write_text(json.dumps({
        "schema_version": 2, "name": "baseline", "status": "ok", "env": {"device": "cpu"},
        "spec": {"run": {"workload": "vit-tiny", "batch_size": 1}}}))
    return str(tmp_path / "r")


def _folder_for_a_result(tmp_path):
    (tmp_path / "out" / "baseline.json").mkdir(parents=True)
    return str(tmp_path / "out")


PATH_CASES = [
    (lambda t: ["run", *FAST, "--out", _file(t)], "a file of that name is in the way"),
    (lambda t: ["run", *FAST, "--out", _folder_for_a_result(t), "--resume"], "is not a result file"),
    (lambda t: ["run", *FAST, "--out", _folder_for_a_result(t)], "is not a result file"),
    (lambda t: ["compare", _results(t), _results(t), "--markdown", str(t / "missing" / "x.md")],
     "No such file or directory"),
    (lambda t: ["compare", _results(t), _results(t), "--markdown", str(t)], "is a folder"),
    # a measured result in the way of --markdown is never written over (issue 46: it once was)
    (lambda t: ["compare", _results(t), _results(t), "--markdown", str(t / "r" / "baseline.json")],
     "exists and is not a .md/.markdown/.txt file: membench never writes over it"),
    (lambda t: ["report", _results(t), "--format", "zzz"], "--format zzz: not a table format; use one of"),
    (lambda t: ["compare", _results(t), _results(t), "--format", "zzz"], "--format zzz: not a table format"),
    (lambda t: ["report", _results(t), "--out", _file(t)], "a file of that name is in the way"),
    (lambda t: ["predict", "--workload", "vit-tiny", "--batch-size", "2", "--techniques", "baseline", "--out",
                _file(t)], "a file of that name is in the way"),
]


@pytest.mark.parametrize("make_args,message", PATH_CASES)
def test_bad_paths_are_one_line_and_exit_2(tmp_path, make_args, message):
    args = make_args(tmp_path)
    before = (tmp_path / "r" / "baseline.json").read_bytes() if (tmp_path / "r").exists() else None
    one_line_and_exit_2(args, message)
    if before is not None:  # the result the command read is as it was
        assert (tmp_path / "r" / "baseline.json").read_bytes() == before


def test_compare_writes_a_markdown_file_again(tmp_path):
    (tmp_path / "t.md").write_text("an earlier table\n")
    assert cli("compare", _results(tmp_path), _results(tmp_path), "--markdown", str(tmp_path / "t.md")).returncode == 0
    assert (tmp_path / "t.md").read_text().startswith("| run ")


@pytest.mark.parametrize("warmup", ["0", "00", "1"])
def test_warmup_zero_is_accepted_however_written(warmup):
    from membench.cli import build_parser

    args = build_parser().parse_args(["run", "--warmup", warmup])
    assert args.warmup == int(warmup)


def test_a_closed_pipe_is_not_a_traceback():
    """`membench list | head -1`, made deterministic: the reader is gone before membench writes anything."""
    read, write = os.pipe()
    os.close(read)
    try:
        proc = subprocess.run([sys.executable, "-m", "membench", "list"], stdout=write, stderr=subprocess.PIPE,
                              text=True, timeout=120)
    finally:
        os.close(write)
    assert proc.stderr == "" and proc.returncode == 1


def test_cuda_asked_for_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    proc = run(["run", "--device", "cuda"])
    assert proc.returncode == 2 and "no CUDA GPU" in proc.stderr and "Traceback" not in proc.stderr


def test_corrupt_results_file(tmp_path):
    bad = tmp_path / "baseline.json"
    bad.write_text("{not json")
    proc = run(["report", str(bad)])
    assert proc.returncode == 2 and "corrupt" in proc.stderr


def test_techniques_lists_every_technique_with_its_trade_off():
    from membench.techniques import REGISTRY

    proc = run(["techniques"])
    assert proc.returncode == 0
    for name, cls in REGISTRY.items():
        assert name in proc.stdout and cls.summary[:30] in proc.stdout


@pytest.mark.parametrize("args", [["predict", "--resume"], ["predict", "--steps", "3"],
                                  ["predict", "--nproc-per-node", "2"], ["predict", "--peak-tflops", "10"],
                                  ["fit", "--budget", "1GiB", "--memory-budget", "1GiB"]])
def test_subcommands_refuse_options_they_do_not_use(args):
    """predict and fit neither time nor launch runs, and fit searches the batch size: such options are errors,
    not silently ignored."""
    proc = run(args)
    assert proc.returncode == 2 and "unrecognized arguments" in proc.stderr


@pytest.mark.parametrize(("args", "said"), [
    (["fit", "--budget", "1GiB", "--batch-size", "4"], "--batch-size is for fit --by world-size (samples per rank) or "
                                                       "--by seq-len"),
    (["fit", "--budget", "1GiB", "--by", "world-size", "--device", "cuda"], "--by world-size needs --batch-size")])
def test_fit_takes_a_batch_size_only_to_search_the_world_size_or_the_sequence(args, said):
    """fit searches the batch size, unless --by world-size (the ranks at a batch per rank) or --by seq-len (the
    sequence length at a batch)."""
    proc = run(args)
    assert proc.returncode == 2 and said in proc.stderr


def test_help_explains_every_option_and_gives_examples():
    top = cli("--help")
    assert top.returncode == 0 and "examples:" in top.stdout and "membench run --device cpu" in top.stdout
    for command, words in (("run", ("learning rate", "seeds the model", "where to train")),
                           ("report", ("a folder of results",)), ("compare", ("before the change", "after it"))):
        text = " ".join(cli(command, "--help").stdout.split())  # argparse wraps lines
        for w in words:
            assert w in text, f"membench {command} --help lacks {w!r}"
