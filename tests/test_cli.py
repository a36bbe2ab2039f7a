"""A user's mistake gets one clear line and exit code 2, never a traceback."""

import subprocess
import sys

import pytest
import torch

CASES = [
    (["run", "--techniques", "accum,foo"], "unknown technique 'foo'; valid: baseline, accum"),
    (["run", "--workload", "resnet9000"], "unknown workload 'resnet9000'; valid: vit-tiny"),
    (["run", "--workload", "vit-tiny", "--batch-size", "6"], "--batch-size 6 is not divisible by --accum-steps 4"),
    (["run", "--steps", "0"], "'0' must be a positive integer"),
    (["run", "--batch-size", "-3"], "'-3' must be a positive integer"),
    (["run", "--techniques", "accum+opt-in-bwd"],
     "cannot combine accum with opt-in-bwd in 'accum+opt-in-bwd': a step per"),
    (["run", "--workload", "tests.workloads:nope"], "has no callable 'nope'"),
    (["run", "--workload", "no_such_module:f"], "cannot import workload module 'no_such_module'"),
    (["run", "--workload", "tests.workloads:not_a_workload"], "must return membench.workloads.Workload"),
    (["run", "--memory-budget", "lots"], "cannot read 'lots' as a size"),
    (["report", "does/not/exist"], "does not exist"),
]


def run(args):
    return subprocess.run([sys.executable, "-m", "membench", *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("args,message", CASES)
def test_bad_input_is_one_line_and_exit_2(args, message):
    proc = run(args)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert message in lines[0]
    assert "Traceback" not in proc.stderr


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
