"""`membench run` across nodes: torchrun's multi-node options passed through, one folder per node, one merged
result per run (docs/run.md, "Several nodes")."""

from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from membench.cli import main
from membench.common.errors import UserError
from membench.launch.process import command_for
from membench.results import Environment, RankSummary, RunRecord, load_dir, write_record
from membench.spec import LaunchSpec
from membench.spec.nodes import Nodes
from membench.techniques import resolve
from tests.helpers import spec

TINY = ["--device", "cpu", "--workload", "tests.workloads:mlp", "--batch-size", "4", "--techniques", "fsdp",
        "--no-check", "--no-timeline", "--no-predict", "--steps", "1", "--warmup", "0"]


@pytest.mark.parametrize(("args", "said"), [
    (["--nnodes", "2", "--node-rank", "2", "--rdzv-endpoint", "h:29500"], "--node-rank must be from 0 to 1"),
    (["--nnodes", "0"], "--nnodes must be an integer, 1 or more, got 0"),
    (["--nnodes", "2", "--rdzv-endpoint", "node0"], "--rdzv-endpoint 'node0' must be HOST:PORT"),
    (["--nnodes", "2", "--rdzv-endpoint", "node0:"], "--rdzv-endpoint 'node0:' must be HOST:PORT"),
    (["--nnodes", "2"], "--nnodes 2: the nodes need a place to meet"),
    (["--nnodes", "2", "--rdzv-endpoint", "h:1", "--rdzv-backend", "zk"], "--rdzv-backend 'zk' is not one"),
    (["--nnodes", "2", "--master-addr", "h", "--master-port", "70000"], "--master-port must be a port"),
])
def test_bad_node_options_are_one_line_exit_2(args, said, tmp_path, capsys):
    assert main(["run", *TINY, "--out", str(tmp_path / "out"), *args]) == 2
    err = capsys.readouterr().err
    assert said in err and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()  # refused before anything ran


def _command(nodes: Nodes, techniques=("fsdp",), torchrun_args: str = "") -> list[str]:
    job = dataclasses.replace(spec("gpt-tiny", techniques), launch=LaunchSpec(torchrun_args=torchrun_args,
                                                                              nodes=nodes).validated())
    command = command_for(job, resolve(job.run), Path("s.json"), Path("o.json"))
    return command[command.index("torch.distributed.run") + 1:command.index("-m", 3)]


def test_the_options_become_torchruns_own():
    """torch/distributed/run.py's spellings; each run of the sweep meets under an id of its own."""
    c10d = Nodes(nnodes=2, node_rank=1, rdzv_endpoint="node0:29500", rdzv_id="job7")
    assert _command(c10d) == ["--nproc-per-node=1", "--nnodes=2", "--node-rank=1", "--rdzv-backend=c10d",
                              "--rdzv-endpoint=node0:29500", "--rdzv-id=job7-fsdp"]
    # The baseline is a single-device run, on each node alone, as on one node (plan.py).
    job = dataclasses.replace(spec("gpt-tiny"), launch=LaunchSpec(nodes=c10d))
    assert "torch.distributed.run" not in command_for(job, resolve(job.run), Path("s.json"), Path("o.json"))
    static = Nodes(nnodes=2, node_rank=0, master_addr="node0", master_port=29400)
    assert _command(static, torchrun_args="--max-restarts=0") == [
        "--nproc-per-node=1", "--nnodes=2", "--node-rank=0", "--master-addr=node0", "--master-port=29400",
        "--max-restarts=0"]
    assert _command(Nodes()) == ["--nproc-per-node=1", "--standalone"]  # one node: as before
    # What membench passes, torchrun's own parser takes (the check --torchrun-args gets).
    LaunchSpec(torchrun_args=" ".join(_command(c10d)[1:])).validated()


def test_bad_nodes_from_the_api_are_user_errors():
    with pytest.raises(UserError, match="--rdzv-endpoint '\\[::1\\]' must be HOST:PORT"):
        Nodes(nnodes=2, rdzv_endpoint="[::1]").validated()
    assert Nodes(nnodes=2, rdzv_endpoint="[::1]:29500").validated()


def _record(node: int, rank: int, status: str = "ok", error: str | None = None) -> RunRecord:
    job = dataclasses.replace(spec("gpt-tiny", ("fsdp",)), launch=LaunchSpec(nodes=Nodes(
        nnodes=2, node_rank=node, rdzv_endpoint="h:1")))
    both = [RankSummary(rank=0, peak_allocated_bytes=100), RankSummary(rank=1, peak_allocated_bytes=101)]
    return RunRecord(name="fsdp", status=status, spec=job, env=Environment(device="cpu"), rank=rank, error=error,
                     ranks=both if status == "ok" else [RankSummary(rank=rank, peak_allocated_bytes=100 + rank)])


def test_a_runs_node_records_merge_into_global_rank_0s(tmp_path):
    # c10d put global rank 0 on node 1 (it orders ranks by host and pid, not by --node-rank).
    write_record(tmp_path / "node0" / "fsdp.json", _record(node=0, rank=1))
    write_record(tmp_path / "node1" / "fsdp.json", _record(node=1, rank=0))
    (run,) = load_dir(tmp_path)
    assert run.rank == 0 and run.path == tmp_path / "node1" / "fsdp.json"
    assert [(s.rank, s.peak_allocated_bytes) for s in run.ranks] == [(0, 100), (1, 101)]
    # Node 0 ran out of memory; rank 0 only saw its peer go: the run is an OOM, with both nodes' errors.
    write_record(tmp_path / "node0" / "fsdp.json", _record(node=0, rank=1, status="oom", error="planted"))
    write_record(tmp_path / "node1" / "fsdp.json", _record(node=1, rank=0, status="error", error="peer closed"))
    (run,) = load_dir(tmp_path)
    assert run.status == "oom"
    assert run.error == "node 0 (rank 1): planted; node 1 (rank 0): peer closed"
    assert [(s.rank, s.peak_allocated_bytes) for s in run.ranks] == [(0, 100), (1, 101)]
    assert len(load_dir(tmp_path / "node0")) == 1  # one node's folder alone still reads


def test_a_single_device_run_on_each_node_reads_as_node_0s(tmp_path):
    """The baseline is not a torchrun job: each node measured it alone (record.rank None); one result, node 0's,
    and a node where it failed says so."""
    for node in (1, 0):
        record = dataclasses.replace(_record(node=node, rank=0), name="baseline", rank=None, ranks=None,
                                     status="oom" if node == 1 else "ok", error="planted" if node == 1 else None)
        record.spec = dataclasses.replace(record.spec, run=dataclasses.replace(record.spec.run, techniques=()))
        write_record(tmp_path / f"node{node}" / "baseline.json", record)
    (run,) = load_dir(tmp_path)
    assert run.path.parent.name == "node0" and run.ranks is None
    assert (run.status, run.error) == ("oom", "node 1: planted")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_nodes_on_this_machine_equal_one_node_rank_for_rank(tmp_path):
    """Two torchrun agents on this machine as two nodes (gloo, c10d rendezvous on 127.0.0.1, one process each)
    against one node of two processes: the same two ranks, so the same figures, rank for rank (the exact CPU
    tracker's counts are deterministic; times are not compared)."""
    port = _free_port()
    nodes = [subprocess.Popen([sys.executable, "-m", "membench", "run", *TINY, "--out", str(tmp_path / "two"),
                               "--nnodes", "2", "--node-rank", str(k), "--rdzv-endpoint", f"127.0.0.1:{port}"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=dict(os.environ))
             for k in (0, 1)]
    outputs = [node.communicate(timeout=900)[0] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], outputs
    assert main(["run", *TINY, "--out", str(tmp_path / "one"), "--nproc-per-node", "2"]) == 0
    two, one = ({r.name: r for r in load_dir(tmp_path / where)} for where in ("two", "one"))
    assert sorted(two) == sorted(one) == ["baseline", "fsdp"]

    def figures(record: RunRecord) -> list[tuple]:
        # The breakdown's total, not its split: which category 26004 bytes at fsdp's peak have (a gradient yet, or
        # still a temporary) differed between two one-node runs of 2 processes here too, with the same total.
        return [(s.rank, s.peak_allocated_bytes, s.peak_phase, s.build_peak_bytes, sum(s.breakdown_at_peak.values()))
                for s in record.ranks]

    for name in one:
        assert two[name].status == one[name].status == "ok"
        assert two[name].memory.peak_allocated_bytes == one[name].memory.peak_allocated_bytes  # rank 0's
    # The baseline ran on each node alone (a single-device run, as on one node): the report keeps node 0's.
    assert two["baseline"].world_size is None and two["baseline"].path.parent.name == "node0"
    assert two["fsdp"].world_size == one["fsdp"].world_size == 2
    assert figures(two["fsdp"]) == figures(one["fsdp"])
