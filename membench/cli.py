"""The command line. Options are defined once and shared by the subcommands that take them."""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
import threading
from pathlib import Path

from membench.common.errors import UserError
from membench.common.units import parse_bytes
from membench.spec import CHECKS


def _typed(check, parse=int):
    """An argument type: the text read as a number (or by `parse`), then `check`, a membench.spec.Check, whose
    message is the one the Python API gives for the same value (the run-spec options' checks live in the spec)."""

    def convert(text: str):
        try:
            value = parse(text)
            check(value)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text[:40]!r} is not {'an integer' if parse is int else 'a number'}") from None
        except UserError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return value

    return convert


def _checked(field: str, parse=int):
    """The argument type of the run-spec option stored in `field`: the spec's own check (spec.CHECKS)."""
    return _typed(CHECKS[field], parse)


def _path(text: str) -> Path:
    """'' would be Path('.'): results written into whatever folder the command ran in."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path names no file or folder: give one, e.g. results/run1")
    return Path(text)


def _size(text: str) -> int:
    from membench.common.units import parse_bytes

    try:
        return parse_bytes(text)
    except UserError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_workload_options(p: argparse.ArgumentParser, batch: bool | str = True) -> None:
    """What runs: the options every subcommand that builds a training step takes. batch: a help text instead of
    True declares --batch-size with no default (fit: only for --by world-size)."""
    from membench.spec import DEFAULT_BATCH_SIZE, DEFAULT_TECHNIQUES, DEFAULT_WORKLOAD, OPTIMIZERS, RunSpec, default
    from membench.spec import LIBRARY_OPTIMIZERS as LIBRARY  # noqa: I001 - apart, so that spec's edits merge
    from membench.workloads import BUILTIN

    p.add_argument("--workload", default=DEFAULT_WORKLOAD,
                   help=f"{', '.join(BUILTIN)}, hf:NAME[,key=value...] (a Hugging Face model from its config, "
                        f"needs the [hf] extra), or package.module:factory, imported from the working directory "
                        f"(default: {DEFAULT_WORKLOAD})")
    if batch:
        default_batch = DEFAULT_BATCH_SIZE if batch is True else None
        p.add_argument("--batch-size", type=_checked("batch_size"), default=default_batch,
                       help=f"samples per optimizer step (default {DEFAULT_BATCH_SIZE})" if batch is True else batch)
    p.add_argument("--techniques", default=None,
                   help=f"comma-separated; '+' stacks techniques in one run (default {DEFAULT_TECHNIQUES}, without "
                        "those the workload cannot take); the baseline always runs. See `membench techniques`.")
    accum, lr, seed = (default(RunSpec, name) for name in ("accum_steps", "lr", "seed"))
    p.add_argument("--accum-steps", type=_checked("accum_steps"), default=accum,
                   help=f"micro-batches for accum (default {accum})")
    p.add_argument("--optimizer", default=None,
                   help=f"{', '.join(OPTIMIZERS)}, or package.module:factory (a torch.optim.Optimizer built from the "
                        "parameters; called with lr= if it takes it) (default: the workload's choice, else adam); "
                        f"from bitsandbytes or torchao (membench[finetune]): {', '.join(LIBRARY)}")
    p.add_argument("--seq-len", type=_checked("seq_len"), default=None,
                   help="tokens per sample for text workloads (gpt-*, hf:*) (default: the workload's)")
    p.add_argument("--lr", type=_checked("lr", float), default=lr,
                   help=f"the optimizer's learning rate (default {lr:g})")
    p.add_argument("--seed", type=_checked("seed"), default=seed,
                   help=f"seeds the model's weights and the batches, so runs compare like for like (default {seed})")
    from membench.spec import ZERO_GRAD

    loop = p.add_argument_group("training loop", "the choices of your own loop that change memory")
    loop.add_argument("--zero-grad", choices=ZERO_GRAD, default=default(RunSpec, "zero_grad"),
                      help="after the step: none frees the gradients (zero_grad(set_to_none=True), torch's default "
                           "since 2.0); zeros keeps them allocated as zeros between steps (set_to_none=False, the "
                           "default before 2.0, and the Hugging Face Trainer's on older transformers) (default none)")
    loop.add_argument("--clip-grad-norm", type=_checked("clip_grad_norm", float), default=None, metavar="MAX_NORM",
                      help="clip the gradients' total 2-norm to MAX_NORM before the step "
                           "(torch.nn.utils.clip_grad_norm_; unscaled first under amp-fp16) (default: no clipping)")
    loop.add_argument("--inference", action="store_true",
                      help="the forward alone: eval mode, torch.inference_mode, no backward, no optimizer "
                           "(default techniques: the baseline only)")
    add_sharding_options(p)
    add_adapter_options(p)
    add_compile_options(p)


def add_adapter_options(p: argparse.ArgumentParser) -> None:
    from membench.spec import DTYPES, QUANT_TYPES, RunSpec, default

    group = p.add_argument_group("adapters", "lora and qlora: peft's LoraConfig and bitsandbytes' 4-bit base weights")
    rank, alpha = default(RunSpec, "lora_rank"), default(RunSpec, "lora_alpha")
    group.add_argument("--lora-rank", type=_checked("lora_rank"), default=rank,
                       help=f"the adapters' rank r (default {rank}, peft's)")
    group.add_argument("--lora-alpha", type=_checked("lora_alpha", float), default=alpha,
                       help=f"lora_alpha: the update is scaled by alpha / r (default {alpha:g}, peft's)")
    group.add_argument("--lora-dropout", type=_checked("lora_dropout", float), default=default(RunSpec, "lora_dropout"),
                       help="dropout on the adapters' input (default 0, peft's)")
    group.add_argument("--lora-targets", default=None, metavar="NAME,...",
                       help="the linear layers given adapters, by name (q_proj,v_proj) or all-linear (default: peft's "
                            "modules for the model type, else every linear layer of the blocks)")
    group.add_argument("--base-dtype", choices=DTYPES, default=None,
                       help="the dtype the frozen base weights are kept in (default: the stack's, fp32 unless bf16)")
    group.add_argument("--quant-type", choices=QUANT_TYPES, default=default(RunSpec, "quant_type"),
                       help="qlora: bitsandbytes' 4-bit format (default nf4)")
    group.add_argument("--double-quant", action=argparse.BooleanOptionalAction,
                       default=default(RunSpec, "double_quant"),
                       help="qlora: quantize the absmax too (bnb_4bit_use_double_quant) (default: on)")
    group.add_argument("--compute-dtype", choices=DTYPES, default=default(RunSpec, "compute_dtype"),
                       help="qlora: the dtype each 4-bit matmul dequantizes to and computes in "
                            "(bnb_4bit_compute_dtype) (default bf16)")


def add_compile_options(p: argparse.ArgumentParser) -> None:
    from membench.spec import RunSpec, default
    from membench.techniques.compile import MODES

    group = p.add_argument_group("compile", "the compile technique: torch.compile's own options")
    group.add_argument("--compile-mode", choices=MODES, default=default(RunSpec, "compile_mode"),
                       help="torch.compile's mode (default default; reduce-overhead runs CUDA graphs, which keep a "
                            "private memory pool)")
    group.add_argument("--compile-options", default=None, metavar="KEY=VALUE,...",
                       help="Inductor options passed through to torch.compile(options=...), on top of the mode's, "
                            "e.g. epilogue_fusion=False (default: none)")


def _table_format(text: str) -> str:
    from tabulate import tabulate_formats

    if text not in tabulate_formats:
        raise argparse.ArgumentTypeError(f"--format {text}: not a table format; use one of "
                                         f"{', '.join(sorted(tabulate_formats))}")
    return text


def _reshard(text: str) -> bool | int:
    word = text.strip().lower()
    if word in ("true", "false"):
        return word == "true"
    if word.isdigit():
        return _checked("reshard_after_forward")(word)
    raise argparse.ArgumentTypeError(f"{text[:40]!r} is not true, false or a world size to reshard to")


def _mesh(text: str):
    """--mesh read once, here, into a membench.spec.mesh.Mesh (a RunSpec keeps its text)."""
    from membench.spec.mesh import parse_mesh

    try:
        return parse_mesh(text)
    except UserError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_sharding_options(p: argparse.ArgumentParser) -> None:
    from membench.spec import DTYPES

    group = p.add_argument_group("sharding", "fsdp, fsdp-offload and tp: the mesh and FSDP2's own options")
    group.add_argument("--mesh", type=_mesh, default=None, metavar="DIM=SIZE,...",
                       help="the device mesh by torchtitan's dimension names: dp_shard (FSDP), dp_replicate (HSDP "
                            "with dp_shard), tp (the tp technique), e.g. dp_replicate=2,dp_shard=4 or dp_shard=4,tp=2; "
                            "its size is the number of ranks (default: dp_shard over every rank)")
    group.add_argument("--param-dtype", choices=DTYPES, default=None,
                       help="FSDP2's MixedPrecisionPolicy param_dtype: the dtype parameters are all-gathered and "
                            "computed in (default: their own, fp32)")
    group.add_argument("--reduce-dtype", choices=DTYPES, default=None,
                       help="MixedPrecisionPolicy reduce_dtype: the dtype gradients are reduce-scattered in "
                            "(default: the param dtype)")
    group.add_argument("--reshard-after-forward", type=_reshard, default=None, metavar="true|false|N",
                       help="free each block's gathered parameters after its forward (true), keep them for "
                            "backward (false), or keep them sharded over N ranks (a divisor of dp_shard) (default: "
                            "fully_shard's, true for blocks)")


def _gpu(text: str):
    """--gpu read once, here, into a membench.spec.gpu.Gpu (a RunSpec keeps its name)."""
    from membench.spec.gpu import gpu

    try:
        return gpu(text)
    except UserError as exc:
        raise argparse.ArgumentTypeError(str(exc).replace("unknown --gpu", "unknown GPU")) from None


def add_target_options(p: argparse.ArgumentParser) -> None:
    """Where the numbers of a prediction are for (computed on this machine's CPU either way)."""
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                   help="the device predicted for (default cuda; cpu: what the exact CPU tracker would measure)")
    from membench.spec.gpu import DEFAULT_GPU, GIVEN, GPUS

    p.add_argument("--gpu", default=None, type=_gpu, metavar="NAME",
                   help=f"the GPU a --device cuda prediction is for: its cuBLAS workspace and compute capability "
                         f"(default: this machine's GPU where torch sees one of these, else {DEFAULT_GPU}; valid: "
                         f"{', '.join(GPUS)}; or {GIVEN})")
    p.add_argument("--world-size", type=_checked("world_size"), default=None,
                   help=f"ranks a distributed technique (FSDP) is predicted for, in one process (default: --mesh's "
                        f"size, else 1; at most {CHECKS['world_size'].high})")
    p.add_argument("--warmup", type=_checked("warmup"), default=1,
                   help="steps before the predicted one: 0 predicts a first step (the optimizer creates its state "
                        "inside it); 1 or more, the steady state (default 1)")
    p.add_argument("--timeout", type=_checked("timeout_s", float), default=1800.0,
                   help="seconds for the whole command: loading the workload's code and every prediction, in a "
                        "child process (default 1800; at least 30 s: Python and torch start first)")
    p.add_argument("--explain", action="store_true",
                   help="after the answer, list everything a prediction cannot see (each record's cannot_see)")
    p.add_argument("--jobs", type=_checked("jobs"), default=None,
                   help="techniques predicted (or fitted) at once, each in a process of its own (default: this "
                        "machine's cores; 1: one after another, in one process)")


def _add_memory_budget(p: argparse.ArgumentParser) -> None:
    p.add_argument("--memory-budget", type=_checked("memory_budget", parse_bytes), default=None,
                   help="e.g. 16GiB: runs above it end as OOM (CUDA: a memory fraction; CPU: the exact tracker; "
                        "predict: the memory the caching allocator may have)")


def add_run_options(p: argparse.ArgumentParser) -> None:
    from membench.spec import LaunchSpec, MeasureSpec, RunSpec, default

    add_workload_options(p)
    steps, warmup, min_time = (default(MeasureSpec, name) for name in ("steps", "warmup", "min_time_s"))
    timeout, nproc = default(LaunchSpec, "timeout_s"), default(RunSpec, "nproc_per_node")
    p.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"),
                   help="where to train: cuda, cpu (exact tracker), or auto: cuda when torch sees a GPU (default)")
    _add_memory_budget(p)
    p.add_argument("--steps", type=_checked("steps"), default=steps,
                   help=f"timed steps after warm-up (default {steps})")
    p.add_argument("--warmup", type=_checked("warmup"), default=warmup, help=f"untimed steps first (default {warmup})")
    p.add_argument("--min-time", type=_checked("min_time_s", float), default=min_time, dest="min_time",
                   help="keep timing past --steps until this many seconds were timed (at most 20x --steps): "
                        f"more steps, a narrower confidence interval (default {min_time:g})")
    p.add_argument("--no-check", action="store_true", help="skip the numerical-equivalence check")
    p.add_argument("--timeout", type=_checked("timeout_s", float), default=timeout,
                   help=f"seconds per run (default {timeout:g})")
    p.add_argument("--peak-tflops", type=_checked("peak_flops", float), default=None,
                   help="the device's peak TFLOP/s for MFU, where membench does not know it")
    p.add_argument("--out", type=_path, default=None,
                   help="results directory (default results/<machine>/<workload>-bs<N>)")
    p.add_argument("--resume", action="store_true", help="skip runs already finished in --out")
    p.add_argument("--nproc-per-node", type=_checked("nproc_per_node"), default=nproc,
                   help=f"processes (GPUs) per node: >1 runs every technique through torchrun (default {nproc}; "
                        "fsdp always runs through torchrun)")
    p.add_argument("--torchrun-args", default=default(LaunchSpec, "torchrun_args"),
                   help="extra torchrun arguments for several nodes, e.g. \"--nnodes=2 --node-rank=0 "
                        "--rdzv-endpoint=host0:29500\" (default: --standalone)")
    _add_node_options(p)
    p.add_argument("--goal", default="lowest-peak", help=GOAL_HELP)
    p.add_argument("--timeline", action=argparse.BooleanOptionalAction, default=default(MeasureSpec, "timeline"),
                   help="after the measured step, record a categorised memory timeline in a few extra untimed steps "
                        "(CUDA: also a snapshot for pytorch.org/memory_viz) (default: on)")
    p.add_argument("--predict", action=argparse.BooleanOptionalAction, default=default(MeasureSpec, "predict"),
                   help="after each run, predict it on fake tensors for the device it ran on and print the "
                        "prediction beside the measurement, with where they part ways (default: on)")


def _add_node_options(p: argparse.ArgumentParser) -> None:
    """torchrun's multi-node options, passed through (spec/nodes.py checks them; docs/run.md, "Several nodes")."""
    from membench.spec import default
    from membench.spec.nodes import Nodes

    group = p.add_argument_group("several nodes", "torchrun's options of the same names: run the same command on "
                                 "every node; node K writes OUT/nodeK, and `membench report OUT` merges them")
    group.add_argument("--nnodes", type=int, default=default(Nodes, "nnodes"), help="how many nodes (default 1)")
    group.add_argument("--node-rank", type=int, default=default(Nodes, "node_rank"), help="this node's, 0 to N-1")
    group.add_argument("--rdzv-endpoint", default="", metavar="HOST:PORT",
                       help="where the nodes meet: a host every node reaches (usually the first node) and a free port")
    group.add_argument("--rdzv-backend", default="", help="torchrun's rendezvous backend (default: c10d with "
                       "--rdzv-endpoint, static with --master-addr)")
    group.add_argument("--rdzv-id", default="", help="the job's id, the same on every node (default: membench)")
    group.add_argument("--master-addr", default="", help="static rendezvous: the host of node rank 0")
    group.add_argument("--master-port", type=int, default=None, help="static rendezvous: its port (default 29500)")


def _nodes(args) -> dict:
    return dict(nnodes=args.nnodes, node_rank=args.node_rank, rdzv_endpoint=args.rdzv_endpoint,
                rdzv_backend=args.rdzv_backend, rdzv_id=args.rdzv_id, master_addr=args.master_addr,
                master_port=args.master_port)


GOAL_HELP = ("what the recommendation optimises: lowest-peak (default: the lowest peak that trains the same model, "
             "if it saves at least 5%% of the baseline's peak; lowest-peak:min-saving=PCT moves the threshold) "
             "or fits:SIZE, e.g. fits:16GiB (the highest throughput that fits and trains the same model)")


def _model_options(args) -> dict:
    return dict(accum_steps=args.accum_steps, optimizer=args.optimizer, lr=args.lr, seed=args.seed,
                seq_len=args.seq_len, zero_grad=args.zero_grad, clip_grad_norm=args.clip_grad_norm,
                inference=args.inference, mesh=args.mesh.text if args.mesh else None, param_dtype=args.param_dtype,
                reduce_dtype=args.reduce_dtype, reshard_after_forward=args.reshard_after_forward,
                lora_rank=args.lora_rank, lora_alpha=args.lora_alpha, lora_dropout=args.lora_dropout,
                lora_targets=args.lora_targets, base_dtype=args.base_dtype, quant_type=args.quant_type,
                double_quant=args.double_quant, compute_dtype=args.compute_dtype,
                compile_mode=args.compile_mode, compile_options=args.compile_options)


def run_options(args) -> dict:
    """`membench run`'s options as `plan.plan` (and `membench.run_sweep`) take them."""
    return dict(steps=args.steps, warmup=args.warmup, min_time_s=args.min_time, check=not args.no_check,
                timeout_s=args.timeout, timeline=args.timeline, predict=args.predict,
                peak_flops=args.peak_tflops * 1e12 if args.peak_tflops else None,
                nproc_per_node=_ranks_per_node(args), torchrun_args=args.torchrun_args, nodes=_nodes(args),
                memory_budget=args.memory_budget, **_model_options(args))


def _ranks_per_node(args) -> int:
    """--nproc-per-node, or on one node (no --torchrun-args) --mesh's size when that is not given."""
    if args.mesh is None or args.nproc_per_node != 1 or args.torchrun_args or args.nnodes > 1:
        return args.nproc_per_node
    return args.mesh.size


def cmd_run(args) -> int:
    from membench.api import default_out_dir, execute, plan
    from membench.launch.sweep import Interrupted, locked, sigterm_as_interrupt
    from membench.report.live import SweepProgress
    from membench.report.recommend import parse_goal
    from membench.report.terminal import summary
    from membench.results import check_result_paths

    goal = parse_goal(args.goal)
    jobs = plan(args.workload, args.techniques, args.batch_size, args.device, **run_options(args))
    out = args.out or default_out_dir(jobs[0].run)
    if jobs[0].launch.nodes.several:  # one folder per node: each node's sweep locks and archives its own
        out = out / f"node{jobs[0].launch.nodes.node_rank}"
    # The folder is locked and checked before the progress display starts: a refusal is then the only line.
    with locked(out):
        check_result_paths(jobs, out)
        with SweepProgress(jobs, out) as progress, sigterm_as_interrupt():
            try:
                sweep = execute(jobs, out, progress, resume=args.resume)
            except Interrupted as stop:
                progress.console.print(f"{stop}: {len(stop.results)} finished run(s) kept in {out}", markup=False)
                return 143 if stop.terminated else 130  # 128 + the signal's number, as a shell reports it
    print(summary([sweep], goal))
    print(f"\nresults: {out}")
    if any(r.finished for r in sweep.runs):
        from membench.report.write import write_report

        written = write_report(sweep, out / "report", goal)
        print(f"open {written['report.html']}")
    return 0 if all(r.finished for r in sweep.runs) else 1


def cmd_techniques(args) -> int:
    from tabulate import tabulate

    from membench.techniques import REGISTRY, conflicts_of

    rows = [[name, cls.summary, ", ".join(cls.devices), ", ".join(conflicts_of(name)) or "-"]
            for name, cls in REGISTRY.items()]
    print(tabulate(rows, headers=["technique", "trade-off", "devices", "cannot combine with"], tablefmt="simple"))
    return 0


def cmd_report(args) -> int:
    from membench.common.fsio import own_dir
    from membench.report.recommend import parse_goal
    from membench.report.terminal import summary
    from membench.report.write import write_report
    from membench.results import load_dir
    from membench.results.sweep import Sweep

    goal = parse_goal(args.goal)
    sweeps = Sweep.group(load_dir(args.results))
    print(summary(sweeps, goal, fmt=args.format))
    if args.no_files:
        return 0
    out = args.out or (args.results if args.results.is_dir() else args.results.parent) / "report"
    if len(sweeps) > 1:
        own_dir(out)
    # One report per sweep, each in a folder its key names (a prediction's and a measurement's never clash): runs
    # of different sweeps never share a baseline.
    used: set[str] = set()
    for sweep in sweeps:
        name = next(n for i in range(len(sweeps) + 1) for n in [sweep.key.folder() + (f"-{i}" if i else "")]
                    if n not in used)
        used.add(name)
        where = out if len(sweeps) == 1 else out / name
        written = write_report(sweep, where, goal)
        print(f"\nwrote {', '.join(sorted(written))} to {where}\nopen {written['report.html']}")
    return 0


def cmd_compare(args) -> int:
    from membench.common.fsio import atomic_write_text, check_text_target
    from membench.gate.compare import render
    from membench.results import load_dir

    if args.markdown:  # refused before anything is read or printed
        check_text_target(args.markdown, "--markdown")
    old, new = load_dir(args.old), load_dir(args.new)
    text = render(old, new, fmt=args.format)
    print(text)
    if args.markdown:
        atomic_write_text(check_text_target(args.markdown, "--markdown"), render(old, new, fmt="github") + "\n")
        print(f"\nwrote {args.markdown}")
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one line (what was wrong, where to look), exit code 2."""

    def error(self, message: str):
        # A checked option's message names the option already (it is the Python API's message too): argparse's
        # "argument --steps: --steps must be ..." would say it twice.
        said = re.match(r"argument (\S+): (\1 .*)", message, re.DOTALL)
        message = said.group(2) if said else message
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _predict_plan(args, batch_size: int) -> dict:
    """What `plan` gets for predict and fit: the same validation as `run`, against the device predicted for
    (predictions are computed on cpu). Planning loads the workload, so it happens in the child process."""
    if args.device == "cuda" and os.environ.get("CUBLAS_WORKSPACE_CONFIG"):
        from membench.predict.gpus import workspace_from_config

        # A workspace no GPU could hold is refused before anything starts; one torch cannot parse is its default,
        # with torch's warning, said where the prediction runs.
        workspace_from_config(os.environ["CUBLAS_WORKSPACE_CONFIG"])
    world = args.world_size
    if args.mesh is not None:
        world = args.mesh.over(world).size
    world = world or 1
    if world > CHECKS["world_size"].high:  # a --mesh of more ranks than a prediction can play
        raise UserError(f"--mesh {args.mesh.text} is {world} ranks, more than a prediction can play: at most "
                        f"{CHECKS['world_size'].high}")
    return dict(workload=args.workload, techniques=args.techniques, batch_size=batch_size,
                target_device=args.device, nproc_per_node=world, check=False, timeline=False,
                warmup=args.warmup, gpu=args.gpu.name if args.device == "cuda" and args.gpu else None,
                **({"memory_budget": args.memory_budget} if getattr(args, "memory_budget", None) else {}),
                **_model_options(args))


def _import_meanwhile(*modules: str) -> threading.Thread:
    """Import what the answer is printed with in a thread of its own while this process waits for the child (a
    tenth of a second the command no longer takes after it); joined before this process imports anything again."""
    thread = threading.Thread(target=lambda: [importlib.import_module(m) for m in modules], daemon=True)
    thread.start()
    return thread


def cmd_predict(args) -> int:
    from membench.launch.probe import call_isolated
    from membench.results import read_result, result_path

    # From loading the user's code to the last prediction, one child process under --timeout does the work, the
    # only one that imports torch: it picks the default folder, locks it, refuses to replace a measurement and
    # archives earlier predictions (child.probe.predict_request). This process reads what it wrote.
    request = {"plan": _predict_plan(args, args.batch_size), "out": str(args.out.absolute()) if args.out else None,
               "jobs": args.jobs}
    printing = _import_meanwhile("membench.predict.verdict", "membench.predict.device", "membench.report.table",
                                 "membench.results.sweep")
    answer = call_isolated("predict", request, args.timeout, f"predicting {args.workload!r}")
    printing.join()
    out = Path(answer["out"])
    results = [read_result(result_path(out, name)) for name in answer["names"]]
    print_predictions(results, args, answer.get("attention"), answer.get("target"))
    if answer.get("arch"):
        print(answer["arch"])
    print(f"predictions: {out}")
    return 0 if all(r.status == "ok" for r in results) else 1


def print_predictions(results: list, args, attention: str | None = None, why: str | None = None) -> None:
    """The answer for the target GPU first, then the table, the whole-device estimates and what was assumed. `why`:
    why the GPU predicted for is that one, where --gpu was not given (plan.plan chose it)."""
    from membench.predict.gpus import predicted_for
    from membench.predict.verdict import answer, assumptions
    from membench.report.table import render
    from membench.results.sweep import Sweep

    # plan.plan chose the GPU where --gpu is not given: the records say which
    target = (predicted_for(results[0].spec.run) if results else args.gpu) if args.device == "cuda" else None
    if target is not None:  # the answer first: does it fit, and the cheapest listed technique that does
        print(answer(results, target) + "\n")
    print(render(Sweep.group(results)))
    sources = [f"  {r.name}: {r.memory.peak_source}" for r in results if r.memory and r.memory.peak_source]
    if sources:  # what the peak is made of, where a prediction can name it (predict/peak_source.py)
        print("\nWHERE THE PEAK COMES FROM:\n" + "\n".join(sources))
    if target is not None:  # each run's whole-device estimate per rank and its sources: what the answer reads
        from membench.predict.device import device_lines
        from membench.predict.fragmentation import lines as fragmented

        lines = device_lines(results, target) + fragmented(results)
        if lines:
            print("\n" + "\n".join(lines))
        _print_time(results)
    print()
    print("\n".join(assumptions(results, target, args.explain, attention, why)))


def _print_time(results: list) -> None:
    """Each run's predicted step time (membench/predict/time/), where the predictions hold one."""
    from membench.predict.time.show import time_lines

    lines = time_lines(results)
    if lines:
        print("\n" + "\n".join(lines))


def cmd_check(args) -> int:
    from membench.gate.check import check

    code, report = check(args.baseline, args.current, args.rule, allow_machine_mismatch=args.allow_machine_mismatch,
                         allow_predicted_vs_measured=args.allow_predicted_vs_measured,
                         allow_missing=args.allow_missing)
    print(report)
    return code


def cmd_fit(args) -> int:
    from membench.launch.probe import call_isolated
    from membench.predict.verdict import Fit
    from membench.spec import Job

    budget = parse_bytes(args.budget)
    over = "seq-len" if args.by == "seq-len" else "batch"
    by = args.by if args.by not in (None, "seq-len") else ("reserved" if args.device == "cuda" else "allocated")
    if by in ("reserved", "device", "world-size") and args.device != "cuda":
        raise UserError(f"--by {by} needs --device cuda: reserved memory is the CUDA caching allocator's")
    if by == "world-size" and args.batch_size is None:
        raise UserError("--by world-size needs --batch-size (samples per rank)")
    if args.batch_size is not None and by != "world-size" and over != "seq-len":
        raise UserError("--batch-size is for fit --by world-size (samples per rank) or --by seq-len (the batch the "
                        "sequence length is fitted at): otherwise fit searches the batch itself")
    if by == "world-size":
        return _fit_world_size(args, budget)
    # Planned at --accum-steps samples, a batch every technique takes (accumulation splits it into micro-batches);
    # each technique's search then runs over the multiples of the smallest batch it takes. The child process
    # (the only one that imports torch) plans, searches and says whether this machine has a CUDA GPU.
    if args.objective == "speed" and args.device != "cuda":
        raise UserError("--objective speed needs --device cuda: step time is predicted for a CUDA GPU")
    request = {"plan": _predict_plan(args, args.batch_size or args.accum_steps), "budget": budget, "by": by,
               "over": over, "max_batch": args.max_batch, "jobs": args.jobs, "objective": args.objective}
    printing = _import_meanwhile("tabulate")  # verdict is imported above
    answer = call_isolated("fit", request, args.timeout, f"fitting {args.workload!r}")
    printing.join()
    fits = [Fit(**f) for f in answer["fits"]]
    target = Job.from_dict(answer["jobs"][0]).run.card if answer["jobs"] else args.gpu
    checked = confirmation(args, target, answer.get("local_gpu"), answer.get("target"))
    confirm = checked.startswith("confirmed on this GPU") and over == "batch"  # confirm_on_gpu runs batches
    if confirm:  # real runs on this GPU, each in its own process
        from membench.predict.device import outside_allocator
        from membench.predict.fit import confirm_on_gpu

        jobs = [Job.from_dict(j) for j in answer["jobs"]]  # --by device: the allocator's share of the budget
        fits = [confirm_on_gpu(j, f, budget - (outside_allocator(j.run) if by == "device" else 0),
                               args.out or Path("results") / "fit") for j, f in zip(jobs, fits)]
    print_fits(fits, budget, by, args, checked, answer["cannot_see"], target)
    if answer.get("arch"):
        print(answer["arch"])
    _print_fastest(fits)
    return 0


def _fit_world_size(args, budget: int) -> int:
    """fit --by world-size: the fewest ranks per technique whose whole-device estimate per rank is within the budget."""
    from tabulate import tabulate

    from membench.common.units import fmt_bytes
    from membench.launch.probe import call_isolated
    from membench.predict.fit.world import WorldFit, world_answer

    if args.mesh is not None:
        raise UserError("--by world-size searches the world size of one FSDP dimension: give no --mesh")
    request = {"plan": _predict_plan(args, args.batch_size), "budget": budget, "by": "world-size"}
    answer = call_isolated("fit", request, args.timeout, f"fitting {args.workload!r}")
    fits = [WorldFit(**f) for f in answer["world_fits"]]
    rows = [[f.run, f.world_size or "-", fmt_bytes(f.peak) if f.world_size else "-",
             f"{f.over_world}: {fmt_bytes(f.over_peak)}" if f.over_world and f.over_peak is not None else "-",
             f.predictions] for f in fits]
    print(tabulate(rows, headers=["run", "fewest ranks (predicted)", "per-rank whole device", "most ranks over: peak",
                                  "predictions"], tablefmt="simple", disable_numparse=True))
    print()
    print(world_answer(fits, budget))
    card = args.gpu.name if args.gpu else "the default "
    print(f"PREDICTED (no timing) per rank at --batch-size {args.batch_size} per rank for {card}"
          "GPU: the whole-device estimate (reserved + CUDA context + NCCL buffers); world sizes 1, 2, 4, ... then "
          "bisected between the last over and the first fit (over multiples of 8 where those are more than 8 apart).")
    return 0


def _print_fastest(fits: list) -> None:
    """fit --objective speed: the fastest technique and batch that fit, by predicted throughput."""
    from membench.predict.time.show import fastest_lines

    lines = fastest_lines(fits)
    if lines:
        print("\n" + "\n".join(lines))




def print_fits(fits: list, budget: int, by: str, args, checked: str, cannot_see: list[str], target) -> None:
    """The table of largest batches, how they were searched, then the answer first among the conclusions."""
    from tabulate import tabulate

    from membench.common.units import ByteFormat
    from membench.predict.verdict import fit_answer, fit_assumptions

    # One unit for the table, with enough decimals that peaks either side of the budget never print the same.
    fmt = ByteFormat([budget] + [v for f in fits for v in (f.peak, f.over_peak if f.over_batch else None)])
    rows = [[f.run, f.batch, fmt.with_unit(f.peak), f"{f.over_batch}: {fmt.with_unit(f.over_peak)}"
             if f.over_batch else "-", f.probes, f.simulations, "-" if f.confirmed is None else f.confirmed,
             f.note or "-"] for f in fits]
    word = fits[0].over if fits else "batch"
    print(tabulate(rows, headers=["run", f"max {word} (predicted)", f"predicted peak {by}", f"first {word} over: peak",
                                  "predictions", "simulated", f"max {word} (measured)", "note"],
                   tablefmt="simple", disable_numparse=True))
    methods = sorted({f.method for f in fits if f.batch})
    if methods:
        print("searched " + "; ".join(methods) + " (predictions: full predictions made; simulated: batches "
              "evaluated from derived allocations through the allocator simulator)")
    card = target if args.device == "cuda" else None
    print()
    print(fit_answer(fits, budget, by, card))
    print("\n".join(fit_assumptions(card, by, checked, cannot_see, args.explain)))


def confirmation(args, target, local: str | None, why: str | None) -> str:
    """Whether the fits are confirmed with real runs, and if not why not: only on the card they were predicted for
    (`local`: the name torch gives this machine's GPU, asked by the child; `why`: why `target`, a Gpu, was chosen)."""
    from membench.spec.gpu import find

    if args.device != "cuda":
        return "cpu target"
    here = find(local) if local is not None else None  # a card the table does not know: never the one predicted for
    checked = ("not confirmed (no CUDA GPU here)" if local is None else "not confirmed (--no-confirm)"
               if args.no_confirm else "confirmed on this GPU" if here is not None and here == target
               else f"not confirmed: predicted for {target.name}, this machine's GPU is {local}")
    return checked + (f"; {target.name}: {why}" if why else "")


def cmd_replay(args) -> int:
    import json

    from membench.allocator.replay import format_report, report

    result = report(args.snapshot, args.alloc_conf, args.capacity, memory_fraction=args.memory_fraction)
    print(json.dumps(result.to_dict(), indent=2) if args.json else format_report(result))
    return 0


EXAMPLES = """examples:
  membench run --device cpu --workload vit-tiny --batch-size 4     measure every technique, write report/report.html
  membench report results                                          the table and recommendation of earlier runs
  membench predict --workload gpt-tiny --batch-size 2              predict CUDA peaks with no GPU
  membench compare before/ after/                                  two result sets side by side
  membench check --baseline results/ci-baseline current/           a CI gate on peak memory
  membench COMMAND --help                                          each command's options"""


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="membench", description="GPU memory benchmarks for PyTorch training: "
                                     "every memory-saving technique on one workload, side by side.",
                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EXAMPLES)
    from membench import __version__

    parser.add_argument("--version", action="version", version=f"membench {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _add_measure_commands(sub)
    _add_predict_command(sub)
    _add_check_command(sub)
    _add_fit_and_replay_commands(sub)
    return parser


def _add_measure_commands(sub) -> None:
    """run, techniques, report, compare: the commands that measure and read measurements."""
    p = sub.add_parser("run", help="measure the baseline and each technique, each in its own process")
    add_run_options(p)
    p.set_defaults(func=cmd_run)
    p = sub.add_parser("techniques", aliases=["list"], help="list the techniques and what each trades")
    p.set_defaults(func=cmd_techniques)
    p = sub.add_parser("report", help="print the comparison table of a results directory and write report.html, "
                                      "report.md, results.csv and charts")
    p.add_argument("results", type=_path, help="a folder of results: what `membench run --out` wrote, such as results")
    p.add_argument("--format", default="simple", type=_table_format,
                   help="a tabulate format: simple, github (markdown), ...")
    p.add_argument("--out", type=_path, default=None, help="where to write the report (default RESULTS/report)")
    p.add_argument("--no-files", action="store_true", help="only print the table")
    p.add_argument("--goal", default="lowest-peak", help=GOAL_HELP)
    p.set_defaults(func=cmd_report)
    p = sub.add_parser("compare", help="two result sets side by side (before/after a change), with deltas")
    p.add_argument("old", type=_path, help="the results before the change (a folder of results)")
    p.add_argument("new", type=_path, help="the results after it; runs are paired by name and workload")
    p.add_argument("--format", default="simple", type=_table_format,
                   help="a tabulate format: simple, github (markdown), ...")
    p.add_argument("--markdown", type=_path, default=None, help="also write the table as markdown to this file")
    p.set_defaults(func=cmd_compare)


def _add_predict_command(sub) -> None:
    """predict: a GPU's memory without one."""
    p = sub.add_parser("predict", help="predict each technique's peak CUDA memory with no GPU (fake tensors)")
    add_workload_options(p)
    add_target_options(p)
    _add_memory_budget(p)
    p.add_argument("--out", type=_path, default=None,
                   help="where predictions go (default results/predicted/<machine>/<device>-<workload>-bs<N>)")
    p.set_defaults(func=cmd_predict)


def _add_check_command(sub) -> None:
    """check: the CI gate."""
    p = sub.add_parser("check", help="compare results against a baseline: exit 0 ok, 1 regression, 2 usage error")
    p.add_argument("current", type=_path, help="results directory (or file) to check")
    p.add_argument("--baseline", type=_path, required=True, help="results directory (or file) to compare against")
    p.add_argument("--rule", action="append", default=[],
                   help="metric:N%% or metric:amount, repeatable, e.g. peak_allocated:5%%, peak_allocated:64MiB, "
                        "step_time:15%%, throughput:10%%")
    p.add_argument("--allow-machine-mismatch", action="store_true",
                   help="compare runs from different machines (device, torch or CUDA version) anyway")
    p.add_argument("--allow-predicted-vs-measured", action="store_true",
                   help="compare predictions with measurements anyway")
    p.add_argument("--allow-missing", action="store_true",
                   help="pass when baseline runs are missing from CURRENT, or a current run measured no memory "
                        "(default: that is a failure, exit 1)")
    p.set_defaults(func=cmd_check)


def _add_fit_and_replay_commands(sub) -> None:
    """fit and replay: the largest batch under a budget; a snapshot through the allocator simulator."""
    p = sub.add_parser("fit", help="the largest batch per technique under a memory budget, from predictions")
    add_workload_options(p, batch="with --by world-size: samples per rank; with --by seq-len: the batch the sequence "
                                  "length is fitted at (default --accum-steps); fit searches the batch otherwise")
    add_target_options(p)
    p.add_argument("--budget", required=True, help="memory budget, e.g. 24GiB (GiB = 2**30) or 80GB")
    p.add_argument("--max-batch", type=_checked("max_batch"), default=65536,
                   help="stop searching here (default 65536)")
    p.add_argument("--by", choices=("reserved", "allocated", "device", "world-size", "seq-len"), default=None,
                   help="which predicted peak must fit: reserved (what decides CUDA out-of-memory; the default for "
                        "--device cuda, from the allocator simulator), allocated (the default for --device cpu) or "
                        "device (reserved + the CUDA context + NCCL's buffers per rank, as predict's whole-device "
                        "estimate: for a budget of the whole card); world-size: at --batch-size per rank, the "
                        "fewest ranks whose whole device per rank is within the budget; seq-len: the longest "
                        "sequence instead of the largest batch, at --batch-size, by the device's default peak")
    p.add_argument("--no-confirm", action="store_true", help="on a GPU, do not confirm predictions with real runs")
    p.add_argument("--objective", choices=("memory", "speed"), default="memory",
                   help="memory (default): the largest batch per technique; speed: also each one's predicted step "
                        "time at that batch, and the fastest technique and batch that fit (docs/time.md)")
    p.add_argument("--out", type=_path, default=None, help="where confirmation runs go (default results/fit)")
    p.set_defaults(func=cmd_fit)

    p = sub.add_parser("replay", help="replay a CUDA memory snapshot through the caching-allocator simulator: "
                                      "actual vs simulated reserved memory, and what other settings would hold")
    p.add_argument("snapshot", type=_path, help="a torch.cuda.memory._dump_snapshot() pickle (as for memory_viz)")
    p.add_argument("--alloc-conf", action="append", default=[],
                   help="PYTORCH_CUDA_ALLOC_CONF settings to try on the same trace, repeatable, e.g. "
                        "\"expandable_segments:True\" or \"max_split_size_mb:256\"")
    p.add_argument("--capacity", type=_size, default=None,
                   help="device memory for the simulation, e.g. 80GiB (GiB = 2**30): beyond it cudaMalloc fails, "
                        "cached segments are released and retried, then OOM (default: unlimited)")
    p.add_argument("--memory-fraction", type=_checked("memory_fraction", float), default=None,
                   help="as torch.cuda.set_per_process_memory_fraction: reserve at most this share of --capacity; "
                        "garbage_collection_threshold acts only under a fraction, as in PyTorch")
    p.add_argument("--json", action="store_true", help="print one JSON object (bytes) instead of tables")
    p.set_defaults(func=cmd_replay)


def main(argv: list[str] | None = None) -> int:
    from membench.common.fsio import is_environment_error, user_error

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
        from membench.launch.lifeline import Terminated

        print("membench: interrupted", file=sys.stderr)
        return 143 if isinstance(stop, Terminated) else 130
