"""`--torchrun-args` read by torchrun's own parser before anything runs: a flag it does not know is one line,
exit 2, instead of a worker that exits with code 2 and no reason part way through a sweep. A worker that dies
before writing its result has the last line of its log in the result's error."""

from __future__ import annotations

import json
import os
import sys

import pytest

from membench.cli import main
from membench.common.errors import UserError
from membench.spec import LaunchSpec
from membench.workloads import Workload
from tests.workloads import mlp


@pytest.mark.parametrize(("args", "said"), [
    ("--bogus-flag", "--torchrun-args: torchrun does not know '--bogus-flag' (see torchrun --help)"),
    ("--nnodes=2 --bogus=1", "torchrun does not know '--bogus=1'"),
    ("--nnodes", "--torchrun-args '--nnodes': torchrun: error: the following arguments are required"),
])
def test_flags_torchrun_does_not_know_are_one_line(args, said):
    with pytest.raises(UserError) as exc:
        LaunchSpec(torchrun_args=args).validated()
    assert said in str(exc.value) and "\n" not in str(exc.value)


def test_torchruns_own_flags_pass():
    assert LaunchSpec(torchrun_args="--nnodes=2 --node-rank=0 --rdzv-endpoint=host0:29500").validated()


def test_the_cli_refuses_them_before_anything_runs(tmp_path, capsys):
    assert main(["run", "--device", "cpu", "--workload", "tests.workloads:mlp", "--batch-size", "4", "--techniques",
                 "fsdp", "--no-check", "--torchrun-args=--bogus-flag", "--out", str(tmp_path / "out")]) == 2
    assert "torchrun does not know '--bogus-flag'" in capsys.readouterr().err
    assert not (tmp_path / "out" / "baseline.json").exists()


def exits_in_loss() -> Workload:
    def loss(model, batch):
        print("planted: the reason this worker gives up", file=sys.stderr, flush=True)
        os._exit(3)

    return Workload(build_model=mlp().build_model, make_batch=mlp().make_batch, loss_fn=loss)


@pytest.mark.slow
def test_a_worker_that_dies_without_a_result_says_the_last_line_of_its_log(tmp_path):
    assert main(["run", "--device", "cpu", "--workload", "tests.launch.test_torchrun_args:exits_in_loss",
                 "--batch-size", "4", "--techniques", "baseline", "--no-check", "--steps", "1", "--warmup", "0",
                 "--out", str(tmp_path)]) == 1
    error = json.loads((tmp_path / "baseline.json").read_text())["error"]
    assert error == ("worker exited with code 3 before writing a result; its log ends: planted: the reason this "
                     "worker gives up")
