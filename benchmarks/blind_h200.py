"""The first GPU run's predictions, made blind: the H200 acceptance run's records of each run's prediction beside
its measurement, as the first committed version of results/gpu-acceptance/NVIDIA-H200_torch2.11.0.json holds them.
No rule had yet been taken from a GPU when they were made, so these figures are held out; the rules written from
those runs' traces afterwards are checked on the same runs by validate_gpu_runs.py (fitted on).

    python benchmarks/blind_h200.py [FILE] [--write-doc]

FILE: an acceptance results file; default: the first committed version of the H200's, read with `git show`.
--write-doc: also write the table into docs/accuracy.md's section of this script.
Exit status: 0 printed; 1 the file cannot be read (a clone without history: name FILE).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from tabulate import tabulate

sys.path.insert(0, str(Path(__file__).resolve().parent))
import doc_section  # noqa: E402 - this script's folder, put on the path above

ROOT = Path(__file__).resolve().parents[1]
ACCEPTANCE = "results/gpu-acceptance/NVIDIA-H200_torch2.11.0.json"
KEY = "benchmarks/blind_h200.py --write-doc"
HEADERS = ["acceptance case: run", "measured alloc B", "predicted B", "error", "measured reserved B", "predicted B",
           "error"]


def first_version() -> tuple[dict, str]:
    """The acceptance file as first committed, and that commit's short hash and date."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout

    commit, day = git("log", "--diff-filter=A", "--format=%h %cs", "--", ACCEPTANCE).split()[-2:]
    return json.loads(git("show", f"{commit}:{ACCEPTANCE}")), f"first committed at {commit}, {day}"


def rows(data: dict) -> list[tuple[str, dict, dict]]:
    """(case: run, measured figures, prediction) of every run measured beside a prediction that finished."""
    found = []
    for check in data["checks"]:
        figures = check.get("figures")
        for run, value in (figures.items() if isinstance(figures, dict) else ()):
            p = value.get("prediction") if isinstance(value, dict) else None
            # cudaMallocAsync is not the caching allocator predictions follow (validate_gpu_runs.py leaves it out too)
            if isinstance(p, dict) and p.get("status") == "ok" and check["name"] != "cudaMallocAsync":
                found.append((f"{check['name'].removeprefix('predicted vs measured: ')}: {run}", value, p))
    return found


def _pct(error: float | None) -> str:
    return "" if error is None else f"{error:+.2%}"


def summary(found: list[tuple[str, dict, dict]], what: str) -> str:
    alloc = [p["allocated_error"] for _, _, p in found]
    res = [p["reserved_error"] for _, _, p in found if p.get("reserved_error") is not None]
    return (f"{len(found)} predictions made blind beside their runs ({what}): peak allocated exact on "
            f"{sum(e == 0 for e in alloc)}, within 1% on {sum(abs(e) <= 0.01 for e in alloc)}, worst "
            f"{_pct(max(alloc, key=abs))}; peak reserved exact on {sum(e == 0 for e in res)}, within 1% on "
            f"{sum(abs(e) <= 0.01 for e in res)}, worst {_pct(max(res, key=abs))}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", nargs="?", type=Path)
    parser.add_argument("--write-doc", action="store_true")
    args = parser.parse_args(argv)
    try:
        data, what = (json.loads(args.file.read_text()), str(args.file)) if args.file else first_version()
        found = rows(data)
    except (OSError, ValueError, KeyError, TypeError, subprocess.CalledProcessError) as exc:
        print(f"blind_h200: cannot read the acceptance file ({type(exc).__name__}: {str(exc)[:200]}); "
              "in a clone without history, name the file", file=sys.stderr)
        return 1
    env = data.get("environment", {})
    machine = (f"{env.get('device_name')}, driver {env.get('driver_version')}, torch {env.get('torch')}, membench "
               f"{str(env.get('git_commit'))[:7]}; {what}")

    def show() -> int:
        print(tabulate([[name, f"{m['peak_allocated_bytes']:,}", f"{p['predicted_peak_allocated_bytes']:,}",
                         _pct(p["allocated_error"]), f"{m['peak_reserved_bytes']:,}",
                         f"{p['predicted_peak_reserved_bytes']:,}", _pct(p.get("reserved_error"))]
                        for name, m, p in found], headers=HEADERS, disable_numparse=True))
        print(f"\n{summary(found, machine)}")
        return 0

    return doc_section.run_and_write(show, doc_section.ACCURACY, KEY, machine) if args.write_doc else show()


if __name__ == "__main__":
    sys.exit(main())
