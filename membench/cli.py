"""The command line. Options are defined once and shared by the subcommands that take them."""

from __future__ import annotations

import argparse
import math
import os
import shlex
import sys
from pathlib import Path

from membench.errors import UserError


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive integer")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be zero or a positive integer")
    return value


def _positive_float(text: str) -> float:
    """A finite positive number: 'nan' and '1e400' (inf) parse as floats but mean nothing as a rate or a time."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} must be a finite positive number")
    return value


def _shell_words(text: str) -> str:
    """Extra torchrun arguments, split as a shell would when a run starts: a stray quote is refused now."""
    try:
        shlex.split(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"cannot split {text!r} into arguments: {exc}") from None
    return text


def add_workload_options(p: argparse.ArgumentParser) -> None:
    from membench.api import DEFAULT_TECHNIQUES

    p.add_argument("--workload", default="vit-small",
                   help="vit-tiny, vit-small, vit_b_16, vit_l_16, gpt-tiny, gpt-mini, gpt-small, gpt-medium, "
                        "cnn-bn, or package.module:factory (default: vit-small)")
    p.add_argument("--batch-size", type=_positive_int, default=32, help="samples per optimizer step (default 32)")
    p.add_argument("--techniques", default=DEFAULT_TECHNIQUES,
                   help=f"comma-separated; '+' stacks techniques in one run (default {DEFAULT_TECHNIQUES}); "
                        "the baseline always runs. See `membench techniques`.")
    p.add_argument("--accum-steps", type=_positive_int, default=4, help="micro-batches for accum (default 4)")
    p.add_argument("--optimizer", choices=("adam", "sgd"), default="adam")
    p.add_argument("--lr", type=_positive_float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
    p.add_argument("--memory-budget", default=None,
                   help="e.g. 16GiB: runs above it end as OOM (CUDA: a memory fraction; CPU: the exact tracker)")


def add_run_options(p: argparse.ArgumentParser) -> None:
    add_workload_options(p)
    p.add_argument("--steps", type=_positive_int, default=5, help="timed steps after warm-up (default 5)")
    p.add_argument("--warmup", type=_non_negative_int, default=2, help="untimed steps first (default 2)")
    p.add_argument("--no-check", action="store_true", help="skip the numerical-equivalence check")
    p.add_argument("--timeout", type=_positive_float, default=1800.0, help="seconds per run (default 1800)")
    p.add_argument("--peak-tflops", type=_positive_float, default=None,
                   help="the device's peak TFLOP/s for MFU, where membench does not know it")
    p.add_argument("--out", type=Path, default=None,
                   help="results directory (default results/<machine>/<workload>-bs<N>)")
    p.add_argument("--resume", action="store_true", help="skip runs already finished in --out")
    p.add_argument("--nproc-per-node", type=_positive_int, default=1,
                   help="processes (GPUs) per node: >1 runs every technique through torchrun (default 1; "
                        "fsdp always runs through torchrun)")
    p.add_argument("--torchrun-args", type=_shell_words, default="",
                   help="extra torchrun arguments for several nodes, e.g. \"--nnodes=2 --node-rank=0 "
                        "--rdzv-endpoint=host0:29500\" (default: --standalone)")
    p.add_argument("--timeline", action=argparse.BooleanOptionalAction, default=True,
                   help="after the timed steps, record a categorised memory timeline in a few extra untimed steps "
                        "(CUDA: also a snapshot for pytorch.org/memory_viz) (default: on)")


def _run_options(args) -> dict:
    from membench.units import parse_bytes

    return dict(
        accum_steps=args.accum_steps, optimizer=args.optimizer, lr=args.lr, seed=args.seed,
        memory_budget=parse_bytes(args.memory_budget) if args.memory_budget else None,
    )


def cmd_run(args) -> int:
    from membench.api import default_out_dir, plan
    from membench.launcher import Interrupted, check_result_paths, locked, run_all, sigterm_as_interrupt
    from membench.progress import SweepProgress
    from membench.report.table import render
    from membench.results import FINISHED

    specs = plan(args.workload, args.techniques, args.batch_size, args.device, steps=args.steps,
                 warmup=args.warmup, check=not args.no_check, timeout_s=args.timeout, timeline=args.timeline,
                 peak_flops=args.peak_tflops * 1e12 if args.peak_tflops else None,
                 nproc_per_node=args.nproc_per_node, torchrun_args=args.torchrun_args, **_run_options(args))
    out = args.out or default_out_dir(specs[0])
    # The folder is locked and checked before the progress display starts: a refusal is then the only line.
    with locked(out):
        check_result_paths(specs, out)
        with SweepProgress(specs, out) as progress, sigterm_as_interrupt():
            try:
                results = run_all(specs, out, resume=args.resume, on_start=progress.start, on_done=progress.done,
                                  on_note=progress.note)
            except Interrupted as stop:
                progress.console.print(f"{stop}: {len(stop.results)} finished run(s) kept in {out}", markup=False)
                return 143 if stop.terminated else 130  # 128 + the signal's number, as a shell reports it
    print(render(results))
    print(f"\nresults: {out}")
    return 0 if all(r["status"] in FINISHED for r in results) else 1


def cmd_techniques(args) -> int:
    from tabulate import tabulate

    from membench.techniques import REGISTRY, conflicts_of

    rows = [[name, cls.summary, ", ".join(cls.devices), ", ".join(conflicts_of(name)) or "-"]
            for name, cls in REGISTRY.items()]
    print(tabulate(rows, headers=["technique", "trade-off", "devices", "cannot combine with"], tablefmt="simple"))
    return 0


def cmd_report(args) -> int:
    from membench.report.table import render
    from membench.report.write import ordered, write_report
    from membench.results import load_dir

    results = ordered(load_dir(args.results))
    print(render(results, fmt=args.format))
    if args.no_files:
        return 0
    out = args.out or (args.results if args.results.is_dir() else args.results.parent) / "report"
    written = write_report(results, out)
    print(f"\nwrote {', '.join(sorted(written))} to {out}\nopen {written['report.html']}")
    return 0


def cmd_compare(args) -> int:
    from membench.fsio import atomic_write_text
    from membench.report.compare import render
    from membench.results import load_dir

    text = render(load_dir(args.old), load_dir(args.new), fmt=args.format)
    print(text)
    if args.markdown:
        atomic_write_text(args.markdown, render(load_dir(args.old), load_dir(args.new), fmt="github") + "\n")
        print(f"\nwrote {args.markdown}")
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one line (what was wrong, where to look), exit code 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _predict_specs(args, **options):
    """The same validation as `run`, for a target device that need not be here (predictions run on cpu)."""
    import dataclasses

    from membench.api import plan

    target = "cpu" if args.device == "cpu" else "cuda"
    specs = plan(args.workload, args.techniques, args.batch_size, "cpu", **_run_options(args), **options)
    return [dataclasses.replace(s, device=target) for s in specs]


def cmd_predict(args) -> int:
    from membench.predict import CANNOT_SEE, default_predict_dir, predict_all
    from membench.report.table import render

    specs = _predict_specs(args, warmup=args.warmup, nproc_per_node=args.world_size, check=False, steps=args.steps)
    out = args.out or default_predict_dir(specs[0])
    results = predict_all(specs, out, on_done=lambda s, r: print(f"predicted {s.name}: {r['status']} "
                                                                 f"({r['wall_s']:.1f} s)", file=sys.stderr))
    print(render(results))
    print(f"\nPREDICTED {specs[0].device} memory (no timing); a prediction cannot see: " + "; ".join(CANNOT_SEE))
    print(f"predictions: {out}")
    return 0 if all(r["status"] == "ok" for r in results) else 1


def cmd_check(args) -> int:
    from membench.check import check

    code, report = check(args.baseline, args.current, args.rule, allow_machine_mismatch=args.allow_machine_mismatch,
                         allow_predicted_vs_measured=args.allow_predicted_vs_measured)
    print(report)
    return code


def cmd_fit(args) -> int:
    import torch
    from tabulate import tabulate

    from membench.fit import confirm_on_gpu, largest_batch
    from membench.predict import predict_memory
    from membench.units import fmt_bytes, parse_bytes

    budget = parse_bytes(args.budget)
    specs = _predict_specs(args, nproc_per_node=args.world_size, check=False)
    confirm = specs[0].device == "cuda" and torch.cuda.is_available() and not args.no_confirm
    rows = []
    for spec in specs:
        fit = largest_batch(spec, budget, lambda s: predict_memory(s)["peak_allocated_bytes"], args.max_batch)
        if confirm:
            fit = confirm_on_gpu(spec, fit, budget, args.out or Path("results") / "fit")
        over = f"{fit.over_batch}: {fmt_bytes(fit.over_peak)}" if fit.over_batch else "-"
        rows.append([fit.run, fit.batch, fmt_bytes(fit.peak), over, fit.probes,
                     "-" if fit.confirmed is None else fit.confirmed, fit.note or "-"])
    print(tabulate(rows, headers=["run", "max batch (predicted)", "predicted peak", "first batch over: peak",
                                  "predictions", "max batch (measured)", "note"],
                   tablefmt="simple", disable_numparse=True))
    where = "confirmed on this GPU" if confirm else "not confirmed: no CUDA GPU here" if specs[0].device == "cuda" \
        else "cpu target"
    print(f"\nbudget {fmt_bytes(budget)} ({budget} B) of PREDICTED {specs[0].device} peak allocated; {where}. "
          "Leave headroom for what a prediction cannot see (CUDA context, workspaces, fragmentation).")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="membench", description="GPU memory benchmarks for PyTorch training: "
                                     "every memory-saving technique on one workload, side by side.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    p = sub.add_parser("run", help="measure the baseline and each technique, each in its own process")
    add_run_options(p)
    p.set_defaults(func=cmd_run)
    p = sub.add_parser("techniques", aliases=["list"], help="list the techniques and what each trades")
    p.set_defaults(func=cmd_techniques)
    p = sub.add_parser("report", help="print the comparison table of a results directory and write report.html, "
                                      "report.md, results.csv and charts")
    p.add_argument("results", type=Path)
    p.add_argument("--format", default="simple", help="a tabulate format: simple, github (markdown), ...")
    p.add_argument("--out", type=Path, default=None, help="where to write the report (default RESULTS/report)")
    p.add_argument("--no-files", action="store_true", help="only print the table")
    p.set_defaults(func=cmd_report)
    p = sub.add_parser("compare", help="two result sets side by side (before/after a change), with deltas")
    p.add_argument("old", type=Path)
    p.add_argument("new", type=Path)
    p.add_argument("--format", default="simple", help="a tabulate format: simple, github (markdown), ...")
    p.add_argument("--markdown", type=Path, default=None, help="also write the table as markdown to this file")
    p.set_defaults(func=cmd_compare)


    p = sub.add_parser("predict", help="predict each technique's peak CUDA memory with no GPU (fake tensors)")
    add_run_options(p)
    p.add_argument("--world-size", type=_positive_int, default=1,
                   help="ranks a distributed technique (FSDP) is predicted for, in one process (default 1)")
    p.set_defaults(func=cmd_predict, device="cuda")

    p = sub.add_parser("check", help="compare results against a baseline: exit 0 ok, 1 regression, 2 usage error")
    p.add_argument("current", type=Path, help="results directory (or file) to check")
    p.add_argument("--baseline", type=Path, required=True, help="results directory (or file) to compare against")
    p.add_argument("--rule", action="append", default=[],
                   help="metric:N%% or metric:amount, repeatable, e.g. peak_allocated:5%%, peak_allocated:64MiB, "
                        "step_time:15%%, throughput:10%%")
    p.add_argument("--allow-machine-mismatch", action="store_true",
                   help="compare runs from different machines (device, torch or CUDA version) anyway")
    p.add_argument("--allow-predicted-vs-measured", action="store_true",
                   help="compare predictions with measurements anyway")
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("fit", help="the largest batch per technique under a memory budget, from predictions")
    add_workload_options(p)
    p.add_argument("--budget", required=True, help="memory budget, e.g. 24GiB (GiB = 2**30) or 80GB")
    p.add_argument("--max-batch", type=_positive_int, default=65536, help="stop searching here (default 65536)")
    p.add_argument("--world-size", type=_positive_int, default=1, help="ranks, for distributed techniques")
    p.add_argument("--no-confirm", action="store_true", help="on a GPU, do not confirm predictions with real runs")
    p.add_argument("--out", type=Path, default=None, help="where confirmation runs go (default results/fit)")
    p.set_defaults(func=cmd_fit)
    return parser


def main(argv: list[str] | None = None) -> int:
    from membench.fsio import is_environment_error, user_error

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code = args.func(args)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        # The reader went away (`membench list | head -1`): as the Python docs recommend, point stdout at devnull
        # so that the interpreter's final flush does not fail again, and stop quietly.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except UserError as exc:
        print(f"membench: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        # A full disk or a read-only folder met outside fsio's writers (a log, a folder): still the user's to fix.
        if not is_environment_error(exc):
            raise
        print(f"membench: error: {user_error(exc, 'use', exc.filename or 'a file')}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as stop:
        from membench.lifeline import Terminated

        print("membench: interrupted", file=sys.stderr)
        return 143 if isinstance(stop, Terminated) else 130
