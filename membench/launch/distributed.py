"""The process group of a run that torchrun started: set up from torchrun's environment, torn down at the end.

torchrun does the launching and the rendezvous; this module only joins the group it describes (gloo on CPU,
nccl on CUDA) and gathers per-rank results on rank 0.

When one rank fails, the others must not wait for it in a collective until the group's timeout:
- where every rank reaches the same point with no collective pending (after the equivalence check's reference
  pass, which each rank trains alone), `agree` is a status check: every rank learns who failed and raises;
- anywhere else (an OOM inside a step: the others are already inside that step's collectives) the failed rank
  writes its record and `leave`s with a non-zero exit; torchrun's agent then stops the other ranks
  (torch/distributed/elastic/agent/server/api.py, SimpleElasticAgent._invoke_run: a FAILED worker group with no
  restarts left is stopped), and the launcher makes the run's result from every rank's record (`merge_ranks`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import os
import sys
from pathlib import Path

# torch is imported inside the functions a rank calls: the launcher's side (merge_ranks) starts without it.


def launched_by_torchrun() -> bool:
    return "WORLD_SIZE" in os.environ and "RANK" in os.environ


@contextlib.contextmanager
def process_group(device: str):
    """Join torchrun's process group for the duration of one run; a no-op for a plain process."""
    import torch
    import torch.distributed as dist

    if not launched_by_torchrun() or dist.is_initialized():
        yield
        return
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if device == "cuda" else "gloo", timeout=datetime.timedelta(minutes=10))
    try:
        yield
    finally:
        dist.destroy_process_group()


def rank_world() -> tuple[int, int]:
    import torch.distributed as dist

    return (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)


def data_rank(spec) -> tuple[int, int]:
    """This rank's place among the ranks that split a RunSpec's batch (spec/mesh.py: tp ranks share one)."""
    rank, world = rank_world()
    return spec.mesh_of(world).data_parallel(rank) if world > 1 else (rank, world)


def gather(obj) -> list:
    """Every rank's `obj`, in rank order, on every rank (all ranks must call it)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return [obj]
    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


class PeerFailed(RuntimeError):
    """Another rank failed at a point every rank agreed on (`agree`)."""


def agree(error: BaseException | None, what: str) -> None:
    """A collective status check after work with no collective in it: every rank says whether it failed; a rank
    that failed raises its own error, and every other rank raises PeerFailed naming it, so no rank goes on
    alone into the next collective. All ranks must call it; a plain process just raises its error."""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        if error is not None:
            raise error
        return
    statuses = gather(None if error is None else f"{type(error).__name__}: {str(error).splitlines()[0]}")
    if error is not None:
        raise error
    failed = [(rank, status) for rank, status in enumerate(statuses) if status]
    if failed:
        raise PeerFailed("; ".join(f"rank {rank} failed {what} ({status})" for rank, status in failed))


def leave(code: int = 1) -> None:
    """Exit this rank now, non-zero, without tearing the process group down (with collectives still pending on
    the other ranks, NCCL's teardown can wait on them): torchrun sees a failed worker and stops the others."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def rank_record_path(out: Path, rank: int) -> Path:
    """Where rank N > 0 writes its record: beside the run's log in runs/, so results loading never takes it for
    a run of its own."""
    return out.parent / "runs" / f"{out.name.removesuffix('.json')}.rank{rank}.json"


def merge_ranks(out: Path, since: float, rank0_here: bool = True):
    """The run's record from its ranks' records written since `since` (rank 0's is the run's result file), when
    a rank failed or rank 0 left none (it was stopped after another rank failed); None when rank 0's record
    stands as it is. A failed rank's status is the run's (an OOM first: another rank's error is then most
    likely the failed rank's absence), and every failed rank's error is kept, by rank. rank0_here=False: one
    node of several, where global rank 0 may run elsewhere; without it, the node's record is its first rank's."""
    from membench.results import read_result

    def fresh(path: Path):
        return read_result(path) if path.is_file() and path.stat().st_mtime >= since - 1 else None

    records = {0: fresh(out)}
    pattern = f"{out.name.removesuffix('.json')}.rank"
    for path in sorted(out.parent.joinpath("runs").glob(f"{pattern}*.json")):
        number = path.name.removeprefix(pattern).removesuffix(".json")
        if number.isdigit():
            records[int(number)] = fresh(path)
    present = {rank: r for rank, r in sorted(records.items()) if r is not None}
    failed = {rank: r for rank, r in present.items() if r.status in ("oom", "error")}
    # A rank whose equivalence check failed inside a collective left at once (worker.Worker.leave_group): its
    # measurements stand, the check's verdict is the run's, whatever the other ranks' records say.
    left = {rank: r for rank, r in present.items() if rank not in failed and r.equivalence is not None
            and r.equivalence.verdict == "failed"}
    if not present or (records[0] is not None and not failed and not left):
        return None
    first = min(failed, key=lambda rank: (failed[rank].status != "oom", rank)) if failed else min(present)
    base = records[0] or present[first]
    merged = dataclasses.replace(base, path=None)
    if failed:
        merged.status = failed[first].status
        merged.error = "; ".join(f"rank {rank}: {failed[rank].error}" for rank in
                                 sorted(failed, key=lambda r: (r != first, r)))
        merged.memory = base.memory or failed[first].memory
        merged.oom_snapshot = base.oom_snapshot or failed[first].oom_snapshot
    elif left:
        detail = "; ".join(f"rank {rank}: {r.equivalence.detail}" for rank, r in left.items())
        merged.equivalence = dataclasses.replace(left[min(left)].equivalence, detail=detail)
    if records[0] is None and rank0_here:
        stopped = "rank 0 left no record (stopped after another rank failed)"
        if failed:
            merged.error = f"{merged.error}; {stopped}"
        else:  # the run's measurements stand (another rank's): the check says what did not finish
            merged.equivalence.detail += f"; {stopped}"
    return merged
