"""The whole-device estimate per rank: reserved + CUDA context + NCCL's buffers, each part derived by hand."""

from types import SimpleNamespace

import pytest

from membench.allocator.events import TraceEvent
from membench.predict.device import (
    CUDA_CONTEXT_BYTES,
    DeviceEstimate,
    DevicePart,
    communicators,
    device_lines,
    fits_on,
    nccl_bytes,
    on_card,
    whole_device,
)
from membench.predict.gpus import gpu
from membench.results.schema import OnCard
from membench.spec import Job, RunSpec
from membench.techniques.mesh import Mesh, parse_mesh

# One connection on one channel: Simple 4 MiB + LL 8 x 512 x 8 x 16 B + LL128 120 x 640 x 8 x 8 B (NCCL src/init.cc)
CONNECTION = 4_194_304 + 524_288 + 4_915_200


def test_a_rank_holds_one_communicator_per_group_it_talks_in():
    assert communicators(Mesh()) == 0  # one rank: nothing to communicate
    assert communicators(parse_mesh("dp_shard=8")) == 1  # the default group is the mesh's only dimension
    # HSDP: the default group, the replicate group and the shard group
    assert communicators(parse_mesh("dp_replicate=2,dp_shard=4")) == 3
    assert nccl_bytes(parse_mesh("dp_shard=8")) == 16 * CONNECTION == 154_140_672


def test_the_estimate_adds_its_parts_and_says_how_each_is_known():
    estimate = whole_device(10 * 2**30, parse_mesh("dp_replicate=2,dp_shard=4"))
    assert [(p.name, p.how) for p in estimate.parts] == [
        ("reserved", "simulated"), ("CUDA context", "estimated"), ("NCCL buffers (3 communicators)", "estimated")]
    assert estimate.total == 10 * 2**30 + CUDA_CONTEXT_BYTES + 3 * 16 * CONNECTION
    assert [p.name for p in whole_device(1, Mesh()).parts] == ["reserved", "CUDA context"]


def test_it_fits_up_to_the_gpus_nominal_memory_and_says_the_margin():
    def of(total):
        return DeviceEstimate((DevicePart("reserved", total, "simulated", "-"),))

    edge, over = fits_on(of(80 * 10**9), 80 * 10**9), fits_on(of(80 * 10**9 + 1), 80 * 10**9)
    assert (edge.fits, edge.margin_bytes, over.fits, over.margin_bytes) == (True, 0, False, -1)


def test_predicts_lines_name_each_part_the_fit_and_the_sources():
    def record(name, techniques, reserved):
        run = RunSpec("tests.workloads:mlp", 8, techniques, device="cuda", nproc_per_node=8)
        return SimpleNamespace(name=name, spec=Job(run), memory=SimpleNamespace(peak_reserved_bytes=reserved,
                                                                                    on_card=None), ranks=None)

    lines = device_lines([record("baseline", (), 2**30), record("fsdp", ("fsdp",), 90 * 10**9)], gpu("H100"))
    assert lines[1] == ("  baseline: 1.75 GiB = reserved 1.00 GiB (simulated) + CUDA context 766.81 MiB (estimated); "
                        "fits on H100 (80 GB): yes, margin 72.76 GiB")  # 80e9 - 2**30 - 804,061,184 B
    # 90e9 + 804,061,184 + 154,140,672 B = 84.71 GiB, 10,958,201,856 B = 10.21 GiB more than 80 GB
    assert lines[2] == ("  fsdp: 84.71 GiB = reserved 83.82 GiB (simulated) + CUDA context 766.81 MiB (estimated) + "
                        "NCCL buffers (1 communicator) 147.00 MiB (estimated); fits on H100 (80 GB): no, margin "
                        "-10.21 GiB")
    assert [line.split(":")[0] for line in lines[3:]] == ["  CUDA context", "  NCCL buffers"]


@pytest.mark.slow  # two predictions in a child process: 10 to 30 s on the shared machine
def test_predict_prints_the_whole_device_per_rank_for_an_hsdp_mesh(tmp_path, capsys):
    from membench import cli

    assert cli.main(["predict", "--workload", "tests.workloads:mlp", "--batch-size", "8", "--techniques", "fsdp",
                     "--mesh", "dp_replicate=2,dp_shard=4", "--out", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    fsdp = next(line for line in lines if line.startswith("  fsdp rank 0: "))  # and rank 3: mlp's uneven shards
    assert "+ NCCL buffers (3 communicators) 441.00 MiB (estimated); fits on H100 (80 GB): yes" in fsdp
    assert "WHOLE DEVICE per rank" in lines[lines.index(fsdp) - 2]


MiB = 2**20
ONE_GB_CARD = 10**9 - CUDA_CONTEXT_BYTES  # what the allocator gets of a 1 GB card: 195,938,816 B (186.86 MiB)


def test_a_trace_that_reserves_more_than_the_card_is_replayed_under_it():
    a, b = TraceEvent.alloc("a", 100 * MiB), TraceEvent.alloc("b", 150 * MiB)
    # Unbounded, a's 100 MiB segment stays cached and b takes a new one: 250 MiB reserved, more than the card has.
    # Under it, b's cudaMalloc fails, the allocator releases a's cached segment and retries: 150 MiB at the peak.
    assert (on_card([a, TraceEvent.free("a"), b], None, 250 * MiB, 10**9, Mesh())
            == OnCard(ONE_GB_CARD, 150 * MiB, False))
    # Both live: nothing cached to release, out of memory
    assert on_card([a, b], None, 250 * MiB, 10**9, Mesh()).oom
    # What fits unbounded is not replayed: no cudaMalloc would fail
    assert on_card([a], None, 100 * MiB, 10**9, Mesh()) is None


def test_the_fits_line_follows_the_replay_under_the_card():
    def record(card):
        run = RunSpec("tests.workloads:mlp", 8, (), device="cuda")
        memory = SimpleNamespace(peak_reserved_bytes=90 * 10**9, on_card=card)
        return SimpleNamespace(name="baseline", spec=Job(run), memory=memory, ranks=None)

    capacity = 80 * 10**9 - CUDA_CONTEXT_BYTES
    released = device_lines([record(OnCard(capacity, 70 * 2**30, False))], gpu("H100"))[1]
    # 80e9 - 70 GiB - 804,061,184 B = 4,034,011,136 B
    assert released == ("  baseline: 70.75 GiB = reserved 70.00 GiB (simulated) + CUDA context 766.81 MiB "
                        "(estimated); fits on H100 (80 GB): yes, margin 3.76 GiB, releasing cached blocks "
                        "(unbounded it would reserve 83.82 GiB)")
    oom = device_lines([record(OnCard(capacity, capacity, True))], gpu("H100"))[1]
    assert oom.endswith("fits on H100 (80 GB): no, out of memory even after the allocator releases its cached "
                        "blocks (simulated under 73.76 GiB)")


def test_each_distinct_rank_gets_its_line():
    run = RunSpec("tests.workloads:mlp", 8, ("fsdp",), device="cuda", nproc_per_node=4)
    ranks = [SimpleNamespace(rank=0, peak_reserved_bytes=2**30), SimpleNamespace(rank=3, peak_reserved_bytes=2**29)]
    record = SimpleNamespace(name="fsdp", spec=Job(run), ranks=ranks,
                             memory=SimpleNamespace(peak_reserved_bytes=2**30, on_card=None))
    lines = device_lines([record], gpu("H100"))
    # 2**30 + 804,061,184 + 154,140,672 B = 1.89 GiB; 2**29 + the same = 1,495,072,768 B = 1.39 GiB
    assert [line.split(" = ")[0] for line in lines[1:3]] == ["  fsdp rank 0: 1.89 GiB", "  fsdp rank 3: 1.39 GiB"]
