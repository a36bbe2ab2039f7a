"""The compile technique: torch.compile measured exactly on CPU.

Inductor's generated wrapper allocates its buffers outside the dispatcher (empty_strided_cpu); the tracker for a
compiled step hooks them (private.inductor_buffers, trackers/compiled.py). The fast tests check the hook on a
module loaded as Inductor loads its wrappers, and the options; the slow ones compile (minutes on the 2-core build
machine, most of it gcc), with Inductor's cache in one folder per test session.
"""

from __future__ import annotations

import os

import pytest
import torch

from membench import private
from membench.allocator.events import TraceEvent
from membench.cli import main
from membench.common.errors import UserError
from membench.results import read_result, write_record
from membench.techniques import pairing_key, resolve
from membench.techniques.compile import Compile, parse_options
from membench.trackers.compiled import CompiledStorageTracker
from membench.trackers.storage import StorageTracker
from tests.helpers import spec

# A wrapper as Inductor writes one (torch/_inductor/codegen/wrapper.py, write_header: the allocator bound at import;
# a buffer reused in place is the same storage, `del` frees it).
WRAPPER = '''
import torch
empty_strided_cpu = torch._C._dynamo.guards._empty_strided_cpu
reinterpret_tensor = torch._C._dynamo.guards._reinterpret_tensor

def call(args):
    primals_1, = args
    buf0 = empty_strided_cpu((8, 32), (32, 1), torch.float32)
    buf1 = empty_strided_cpu((8, 32), (32, 1), torch.bool)
    buf2 = buf0; del buf0  # reuse
    buf3 = empty_strided_cpu((), (), torch.float32)
    del buf2
    return (buf3, buf1, reinterpret_tensor(primals_1, (32, 8), (1, 32), 0))
'''


@pytest.fixture(scope="session")
def inductor_cache(tmp_path_factory):
    """One Inductor cache per test session (and per xdist worker): compiled once, reused by every test after."""
    folder = tmp_path_factory.mktemp("inductor-cache")
    previous = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(folder)
    yield folder
    if previous is None:
        os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
    else:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = previous


def _events(trace: list[TraceEvent]) -> list[tuple[str, int]]:
    sizes = {}
    out = []
    for e in trace:
        if e.kind == "alloc":
            sizes[e.key] = e.size
        out.append((e.kind, sizes[e.key]))
    return out


def _load(source: str):
    from torch._inductor.codecache import PyCodeCache

    return PyCodeCache.load(source)


def test_buffers_a_generated_wrapper_allocates_are_counted(inductor_cache):
    """By hand: buf0 is 8 x 32 fp32 = 1,024 B, buf1 8 x 32 bool = 256 B, buf3 a 0-d fp32 = 4 B; buf2 is buf0 again
    (no allocation) and frees it when deleted; the returned view of the input allocates nothing. A module loaded
    before the tracker starts and one loaded while it runs are both seen; after it, both allocate unseen again."""
    before = _load(WRAPPER)
    x = torch.randn(8, 32)
    for module in (before, None):
        tracker = CompiledStorageTracker(trace=True)
        with tracker:
            module = module or _load(WRAPPER + "\n# loaded inside\n")
            out = module.call([x])
        assert _events(tracker.trace) == [("alloc", 1024), ("alloc", 256), ("alloc", 4), ("free", 1024)]
        assert tracker.peak.bytes == 1024 + 256 + 4 and tracker.current == 256 + 4
        del out
        assert tracker.current == 0
        assert module.empty_strided_cpu is torch._C._dynamo.guards._empty_strided_cpu  # put back
    plain = StorageTracker(trace=True)
    with plain:
        before.call([x])
    # What the hook is for: no dispatch mode sees buffers only Inductor's own C++ kernels write (one an extern kernel
    # writes with out= reaches the mode then, late).
    assert plain.trace == []


def test_compile_options_are_parsed_and_merged_with_the_mode():
    assert parse_options(None) == {} and parse_options("") == {}
    assert parse_options("epilogue_fusion=False, max_autotune=True,cpp.threads=2,x=abc") == {
        "epilogue_fusion": False, "max_autotune": True, "cpp.threads": 2, "x": "abc"}
    with pytest.raises(UserError, match=r"^--compile-options takes key=value pairs .* got 'nope'$"):
        parse_options("a=1,nope")
    plain = Compile(spec(techniques=("compile",)).run)
    assert plain.compile_arguments() == {"mode": "default"}
    tuned = Compile(spec(techniques=("compile",), compile_mode="max-autotune-no-cudagraphs",
                         compile_options="epilogue_fusion=False").run)
    # torch.compile takes a mode or options: the mode's own options, updated by the user's
    assert tuned.compile_arguments() == {"options": {**private.mode_options("max-autotune-no-cudagraphs"),
                                                     "epilogue_fusion": False}}


def test_the_stack_says_it_compiles_and_its_options_pair_only_compiled_runs():
    assert resolve(spec(techniques=("compile", "ckpt")).run).compiles
    assert not resolve(spec(techniques=("ckpt",)).run).compiles
    eager = spec(techniques=("ckpt",), compile_mode="reduce-overhead").run
    assert pairing_key(eager).compile_mode == "default"  # never read without compile
    assert pairing_key(spec(techniques=("compile",), compile_mode="reduce-overhead").run).compile_mode == \
        "reduce-overhead"


@pytest.mark.parametrize("args, message", [
    (["--techniques", "compile", "--compile-options", "no_such_option=1"],
     "membench: error: --compile-options: 'no_such_option' is not an option of Inductor (torch._inductor."
     "list_options() names them)"),
    (["--techniques", "compile", "--warmup", "0"],
     "membench: error: compile compiles in its first step: it needs --warmup 1 or more, so that the measured steps "
     "run the compiled code"),
    (["--techniques", "compile+fsdp"],
     "membench: error: cannot combine compile with fsdp in 'compile+fsdp': membench compiles single-device stacks "
     "only (sharded and offloaded steps are not measured compiled here)"),
])
def test_what_cannot_run_compiled_is_refused_in_one_line(capsys, tmp_path, args, message):
    assert main(["run", "--device", "cpu", "--workload", "gpt-tiny", "--out", str(tmp_path), *args]) == 2
    assert capsys.readouterr().err.strip() == message


# --- slow: these compile -------------------------------------------------------------------------------------------
def _relu_sum(x, w):
    return (x @ w).relu().sum()


@pytest.mark.slow
def test_a_fused_kernels_buffers_match_a_hand_count(inductor_cache):
    """(x @ w).relu().sum() with x 8 x 16 and w 16 x 32 (fp32, w trained). By hand, eager: mm's output 8 x 32 x 4 =
    1,024 B, relu's 1,024 B (kept: relu's backward reads its result), then mm's output is freed (nothing holds it
    once relu has returned) before sum's 4 B: peak 2,048 B, 1,028 B held after forward. Compiled (Inductor, CPU):
    mm runs as an extern kernel into a 1,024 B buffer; one fused kernel (relu, sum and relu's backward mask) writes
    the 4 B sum and the 8 x 32 bool mask (256 B) that the partitioner saves for backward instead of relu's fp32
    output; mm's buffer is freed at the wrapper's return: peak 1,284 B, 260 B held after forward."""
    x, w = torch.randn(8, 16), torch.randn(16, 32, requires_grad=True)
    compiled = torch.compile(_relu_sum)
    compiled(x, w).backward()  # compiled outside the tracker (the tracker is off while compiling anyway)
    for fn, trace, peak, held in ((_relu_sum, [1024, 1024, 4], 2048, 1028), (compiled, [1024, 4, 256], 1284, 260)):
        tracker = CompiledStorageTracker(trace=True)
        with tracker:
            loss = fn(x, w)
        assert [e.size for e in tracker.trace if e.kind == "alloc"] == trace
        assert (tracker.peak.bytes, tracker.current) == (peak, held)
        del loss


# --- predicted: AOTAutograd's partition, run op by op (predict/compiled.py) ------------------------------------------
def _mlp():
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))


def _mlp_batch(n, generator):
    return torch.randn(n, 16, generator=generator), torch.randint(0, 4, (n,), generator=generator)


@pytest.mark.slow
def test_a_compiled_prediction_keeps_the_partitioners_saved_tensors(tmp_path):
    """By hand, for Linear(16, 32) -> GELU -> Linear(32, 4) at batch 8: the second Linear's backward needs its input
    (GELU's output, 8 x 32 fp32 = 1,024 B) for its weight's gradient and its weight (32 x 4 x 4 = 512 B, a parameter:
    an input of the graph) for its input's; GELU's backward needs its input (the first Linear's output, 1,024 B);
    the first Linear's backward needs the batch (8 x 16 x 4 = 512 B, an input) for its weight's gradient and nothing
    for the batch's (it needs none). The partitioner saves exactly these; the transposes are recomputed."""
    from membench import api
    from membench.predict.compiled import APPROXIMATED
    from membench.predict.run import predict

    key = api.register(_mlp, _mlp_batch, name="mlp-compiled")
    record = predict(spec(key, ("compile",), batch_size=8))
    assert record.status == "ok", record.error
    saved = sorted((s.shape, s.dtype, s.bytes, s.name.startswith("primals_")) for s in record.compiled.saved)
    assert saved == [([4, 32], "float32", 512, True), ([8, 16], "float32", 512, True),
                     ([8, 32], "float32", 1024, False), ([8, 32], "float32", 1024, False)]
    assert APPROXIMATED in record.assumed and record.compiled.approximated == APPROXIMATED
    write_record(tmp_path / "mlp.json", record)
    assert read_result(tmp_path / "mlp.json").compiled == record.compiled  # kept in the record as written


@pytest.mark.slow
def test_a_compiled_cpu_run_is_exact_and_repeatable(inductor_cache, tmp_path):
    """`membench run --techniques compile,compile+ckpt` in its worker processes, and the same steps measured again
    in this process: the same bytes (the storage tracker counts storages, not time); no compilation falls after the
    warm-up, none breaks the graph, and the compiled step (compiled in the check too: equivalence._RandomOps lets
    it) trains the baseline's model up to the rounding of sums Inductor orders otherwise (checked with SGD)."""
    from membench.measure import Session
    from membench.results import load_dir
    from membench.step import batches
    from membench.trackers.memory import CpuMeter
    from membench.workloads import load_workload

    assert main(["run", "--device", "cpu", "--workload", "gpt-tiny", "--batch-size", "4", "--techniques",
                 "compile,compile+ckpt", "--steps", "1", "--no-timeline", "--no-predict", "--out", str(tmp_path)]) == 0
    records = {r.name: r for r in load_dir(tmp_path)}
    for name in ("compile", "compile+ckpt"):
        record = records[name]
        assert record.status == "ok" and record.memory.method == "storage-tracker, Inductor's buffers hooked"
        assert (record.compiled.after_warmup, record.compiled.graph_breaks, record.compiled.recompiles) == (0, 0, 0)
        assert record.compiled.compilations >= 1 and record.equivalence.verdict == "equivalent"
        run = record.spec.run
        workload = load_workload(run.workload)
        stack = resolve(run)
        session = Session(run, stack, workload, CpuMeter(compiled=True), batches(workload, run))
        session.build()
        session.warm_up(record.spec.measure.warmup)
        again = session.measure(1)[0]
        session.release()
        assert again.peak_allocated_bytes == record.memory.peak_allocated_bytes, name
        assert again.breakdown_at_peak == record.memory.breakdown_at_peak, name
    assert records["compile"].memory.peak_allocated_bytes != records["baseline"].memory.peak_allocated_bytes


def test_the_report_says_what_was_compiled_and_the_cuda_graph_pool():
    from membench.report.table import compiled_note
    from membench.results import Compiled, RunRecord
    from membench.trackers.compilations import CUDA_GRAPH_POOL

    job = spec(techniques=("compile",), compile_mode="reduce-overhead", device="cpu")
    record = RunRecord(name="compile", status="ok", spec=job, compiled=Compiled(
        mode="reduce-overhead", compilations=3, graph_breaks=1, recompiles=0, after_warmup=1,
        memory_note=CUDA_GRAPH_POOL))
    assert compiled_note(record) == (
        "compile: torch.compile mode reduce-overhead: 3 compilation(s), 1 graph break(s), 0 recompile(s); 1 compiled "
        f"after the warm-up, inside the measured or timed steps; {CUDA_GRAPH_POOL}")
