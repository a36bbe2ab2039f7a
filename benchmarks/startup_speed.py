"""How long whole commands take, wall clock, side by side with starting Python and importing torch.

    python benchmarks/startup_speed.py [--rounds 10] [--skip-predict] [--with-70b] [--write-doc]

Each round runs every command once, one after another (rounds interleave them, so a change of load in the machine
touches all of them alike); the table gives each command's median and range over the rounds, and its median against
`python -c "import torch"` measured in the same rounds. The load average (1, 5, 15 minutes) is printed before and
after: CPU timings on a shared machine swing several-fold with it, so compare ratios, not seconds.
membench's own modules are byte-compiled first (as a wheel's install or a first run leaves them), so that no
process timed compiles them.

The commands: `python -c pass`; `python -c "import torch"`; `membench --version`; `membench replay --help`;
`membench techniques`; and three vit_l_16 predictions for an H100 (`membench predict --workload vit_l_16
--batch-size 1 --techniques opt-in-bwd,foreach-off`), into a temporary folder; with --with-70b, also the two
predictions (baseline, fsdp) of a Llama-2-70B shape at 64 ranks that docs/predict.md describes.

Then, unless --skip-predict, where the prediction command's seconds go: the imports as its child makes them
(torch, then torch._dynamo and torchvision, with the cycle collector off), median over the rounds, and each
prediction's own seconds as the last round's records give them (`wall_s`: two run at a time on two cores).
"""

from __future__ import annotations

import argparse
import compileall
import importlib.util
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tabulate import tabulate


def membench_script() -> str:
    """The console script of this interpreter's environment (what a user types), else `python -m membench`."""
    script = Path(sys.executable).parent / "membench"
    return str(script) if script.exists() else shutil.which("membench") or ""


def commands(out: Path, predict: bool, shape_70b: bool = False) -> dict[str, list[str]]:
    mb = [membench_script()] if membench_script() else [sys.executable, "-m", "membench"]
    table = {
        "python -c pass": [sys.executable, "-c", "pass"],
        'python -c "import torch"': [sys.executable, "-c", "import torch"],
        "membench --version": [*mb, "--version"],
        "membench replay --help": [*mb, "replay", "--help"],
        "membench techniques": [*mb, "techniques"],
    }
    if predict:
        table["membench predict vit_l_16 (3 predictions)"] = [
            *mb, "predict", "--workload", "vit_l_16", "--batch-size", "1", "--techniques", "opt-in-bwd,foreach-off",
            "--out", str(out / "vit_l_16")]
    if shape_70b:  # predict_70b.py's shape and run, as the command a user types (issue 31's goal: 15 s wall)
        from predict_70b import GOAL_LAYERS, SHAPE  # this script's folder is on the path when it runs

        table["membench predict 70B shape, 64 ranks (2 predictions)"] = [
            *mb, "predict", "--workload", f"{SHAPE},num_hidden_layers={GOAL_LAYERS}", "--batch-size", "1",
            "--seq-len", "4096", "--techniques", "fsdp", "--world-size", "64", "--param-dtype", "bf16",
            "--reduce-dtype", "fp32", "--gpu", "H100",
            "--out", str(out / "70b")]
    return table


def timed(command: list[str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    return elapsed


IMPORTS = """
import gc, time
gc.disable()  # as predict's child imports them (membench/child/probe.py)
start = time.perf_counter()
import torch
middle = time.perf_counter()
import torch._dynamo.config, torchvision.models
print(middle - start, time.perf_counter() - middle)
"""


def imports() -> tuple[float, float]:
    """Seconds to import torch, then torch._dynamo and torchvision, in a fresh process."""
    done = subprocess.run([sys.executable, "-c", IMPORTS], capture_output=True, text=True, check=True)
    first, second = done.stdout.split()
    return float(first), float(second)


def breakdown(split: list[tuple[float, float]], out: Path) -> list[str]:
    """Where the prediction command's seconds go (see the module docstring)."""
    walls = {p.stem: json.loads(p.read_text())["wall_s"] for p in sorted(out.glob("*.json"))}
    return [f"imports as predict's child makes them (median of {len(split)}): torch "
            f"{statistics.median(s[0] for s in split):.2f} s; torch._dynamo, torchvision "
            f"{statistics.median(s[1] for s in split):.2f} s",
            "predictions, last round (two at a time): " + ", ".join(f"{name} {wall:.2f} s"
                                                                    for name, wall in walls.items())]


def byte_compiled() -> str:
    """membench's modules compiled to bytecode first, as pip does when it installs a wheel and as Python does at a
    first run: an editable install under PYTHONDONTWRITEBYTECODE=1 (this machine's environment) would otherwise
    compile them again in every process (0.15-0.2 s of the prediction command on the 2-core x86_64 machine)."""
    folder = importlib.util.find_spec("membench").submodule_search_locations[0]
    compileall.compile_dir(folder, quiet=1)
    return (f"membench's modules byte-compiled before timing (PYTHONDONTWRITEBYTECODE="
            f"{os.environ.get('PYTHONDONTWRITEBYTECODE', 'unset')} here)")


def load() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--skip-predict", action="store_true", help="leave out the vit_l_16 predictions")
    parser.add_argument("--with-70b", action="store_true",
                        help="add the 70B shape's baseline and fsdp at 64 ranks (about 15 s a round)")
    args = parser.parse_args(argv)
    import torch  # for the versions line only, after the parent's own start-up no longer matters

    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; Python "
          f"{platform.python_version()}, torch {torch.__version__}")
    print(byte_compiled())
    print(f"load average before (1/5/15 min): {load()}")
    with tempfile.TemporaryDirectory(prefix="membench-startup-") as tmp:
        table = commands(Path(tmp), not args.skip_predict, args.with_70b)
        times: dict[str, list[float]] = {name: [] for name in table}
        split = []
        for _ in range(args.rounds):
            for name, command in table.items():
                times[name].append(timed(command))
            if not args.skip_predict:
                split.append(imports())
        print(f"load average after (1/5/15 min): {load()}")
        where = breakdown(split, Path(tmp) / "vit_l_16") if not args.skip_predict else []
    torch_median = statistics.median(times['python -c "import torch"'])
    rows = [[name, f"{statistics.median(t):.3f}", f"{min(t):.3f} - {max(t):.3f}",
             f"{statistics.median(t) / torch_median:.2f}"] for name, t in times.items()]
    print(tabulate(rows, headers=["command", f"median s ({args.rounds} rounds)", "range s",
                                  'median / import torch'], tablefmt="simple", disable_numparse=True))
    print("\n".join(where))
    return 0


def write_doc(argv: list[str]) -> int:
    """`--write-doc`: run as asked and write what it printed into docs/performance.md's section of this script."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import doc_section

    rest = [a for a in argv if a != "--write-doc"]
    return doc_section.run_and_write(lambda: main(rest), doc_section.PERFORMANCE,
                                     "benchmarks/startup_speed.py --write-doc")


if __name__ == "__main__":
    sys.exit(write_doc(sys.argv[1:]) if "--write-doc" in sys.argv else main(sys.argv[1:]))
