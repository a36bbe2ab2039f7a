"""Result files on disk: written atomically, read with one line per problem, found under a results folder."""

from __future__ import annotations

import itertools
import os
import re
from datetime import datetime, timezone
from pathlib import Path

from membench.common.errors import UserError
from membench.common.fsio import atomic_write_text, make_dir, own_dir
from membench.common.typedjson import read_json_file
from membench.results.nodes import merge_nodes
from membench.results.schema import RunRecord
from membench.spec import Job

MAX_RESULT_BYTES = 64 * 2**20  # a result file is a few KiB; anything this big is not one


def write_record(path: Path, record: RunRecord) -> None:
    """Write-then-rename (fsio): a reader (or a crash) never sees half a file; a full disk is one UserError."""
    path = Path(path)
    make_dir(path.parent)
    atomic_write_text(path, record.to_json())


def result_path(out_dir: Path, run_name: str) -> Path:
    return Path(out_dir) / f"{run_name}.json"


def read_result(path: Path) -> RunRecord:
    where = f"results file {path}"
    record = RunRecord.from_dict(read_json_file(path, where, MAX_RESULT_BYTES, "a membench result"), where)
    record.path = Path(path)
    return record


def load_dir(path: Path) -> list[RunRecord]:
    """All results under a directory (recursively), or one file."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"results path {path} does not exist")
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*.json") if _is_result_name(p, path))
    results = merge_nodes([read_result(p) for p in files if p.name != "sweep.json"])  # a run across nodes: one
    if not results:
        raise UserError(f"no membench results under {path}")
    return results


def _is_result_name(p: Path, root: Path) -> bool:
    """Result files, not the files beside them: run specs (runs/), archived results (previous/), timelines."""
    parts = p.relative_to(root).parts
    return not (p.name.startswith(".") or p.name.endswith((".spec.json", ".timeline.json"))
                or "runs" in parts[:-1] or "previous" in parts[:-1] or "report" in parts[:-1])


def is_finished(path: Path) -> bool:
    """A run counts as done for --resume when it measured something: ok, a deterministic OOM, a diverged loss."""
    try:
        return read_result(path).finished
    except UserError:
        return False


def check_result_paths(jobs: list[Job], out_dir: Path) -> None:
    """Before anything runs: a folder where a result goes would fail its run only after it ran."""
    for job in jobs:
        path = result_path(out_dir, job.name)
        if path.exists() and not path.is_file():
            raise UserError(f"{path} is not a result file (a folder or a device is in its place): move it away "
                            "or choose another --out")


# A run's files beside its result: <run>.json, <run>.timeline.json, <run>.snapshot.pickle, <run>.oom.pickle, and
# the same off rank 0 as <run>.rank<N>.* (worker.stem).
_RUN_FILE = r"(\.rank\d+)?\.(json|timeline\.json|snapshot\.pickle|oom\.pickle)"


def run_files(out_dir: Path, name: str) -> list[Path]:
    pattern = re.compile(re.escape(name) + _RUN_FILE)
    return sorted(p for p in Path(out_dir).iterdir() if pattern.fullmatch(p.name) and not p.is_dir())


def archive(out_dir: Path, name: str) -> Path | None:
    """Never lose a measurement: an earlier run's files (result, timeline, snapshots, and its log) move together
    to previous/<run>.<UTC time of its result, to the microsecond>-<n>/ instead of being overwritten. Together,
    the archived result's relative file names still point at its own timeline and snapshots; <n> keeps two
    archives of the same microsecond apart (the folder is created exclusively)."""
    files = run_files(out_dir, name)
    if not files:
        return None
    result = result_path(out_dir, name)
    stamp = datetime.fromtimestamp((result if result in files else files[0]).stat().st_mtime, timezone.utc)
    previous = own_dir(Path(out_dir) / "previous")
    for n in itertools.count():
        folder = previous / f"{name}.{stamp:%Y%m%dT%H%M%S.%fZ}-{n}"
        try:
            folder.mkdir()
            break
        except FileExistsError:
            continue
    log = Path(out_dir) / "runs" / f"{name}.log"
    for path in files + ([log] if log.is_file() and not log.is_symlink() else []):
        os.replace(path, folder / path.name)
    return folder
