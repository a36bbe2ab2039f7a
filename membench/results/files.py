"""Result files on disk: written atomically, read with one line per problem, found under a results folder."""

from __future__ import annotations

from pathlib import Path

from membench.errors import UserError
from membench.fsio import atomic_write_text, make_dir
from membench.results.schema import RunRecord

MAX_RESULT_BYTES = 64 * 2**20  # a result file is a few KiB; anything this big is not one


def write_record(path: Path, record: RunRecord) -> None:
    """Write-then-rename (fsio): a reader (or a crash) never sees half a file; a full disk is one UserError."""
    path = Path(path)
    make_dir(path.parent)
    atomic_write_text(path, record.to_json())


def result_path(out_dir: Path, run_name: str) -> Path:
    return Path(out_dir) / f"{run_name}.json"


def read_result(path: Path) -> RunRecord:
    path = Path(path)
    if path.is_dir():
        raise UserError(f"results file {path} is a folder, not a result file")
    try:
        if not path.is_file():
            raise FileNotFoundError
        if path.stat().st_size > MAX_RESULT_BYTES:
            raise UserError(f"results file {path} is too large to be a membench result")
        text = path.read_text()
    except FileNotFoundError:
        raise UserError(f"results file {path} does not exist") from None
    except UnicodeDecodeError:
        raise UserError(f"results file {path} is corrupt (not UTF-8 text)") from None
    except OSError as exc:
        raise UserError(f"cannot read results file {path}: {exc.strerror}") from None
    record = RunRecord.from_json(text, f"results file {path}")
    record.path = path
    return record


def load_dir(path: Path) -> list[RunRecord]:
    """All results under a directory (recursively), or one file."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"results path {path} does not exist")
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*.json") if _is_result_name(p, path))
    results = [read_result(p) for p in files if p.name != "sweep.json"]
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
