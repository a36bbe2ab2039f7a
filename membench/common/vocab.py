"""The vocabulary of results: what a byte of memory is for (categories), when it was allocated (phases), how a run
ended (status), whether it trains the same model (verdicts) and how closely it must (numerics).

Each is a `Literal`: a result file is read through common/typedjson.py, which refuses any other value with one
line naming the file and the field. Trackers, the worker and the equivalence check write these names; reports read
them.
"""

from typing import Literal, get_args

Category = Literal["parameters", "gradients", "optimizer_state", "activations", "recomputed_activations",
                   "temporaries", "inputs", "other"]
PARAMS: Category = "parameters"  # parameters and buffers
GRADS: Category = "gradients"
OPTIMIZER: Category = "optimizer_state"
ACTIVATIONS: Category = "activations"  # allocated in forward (saved for backward, or forward temporaries)
TEMPORARIES: Category = "temporaries"  # allocated in backward or the optimizer step and not kept
# Activations a checkpointed block computes again in backward (ckpt, sac): what recomputation costs in memory.
RECOMPUTED: Category = "recomputed_activations"
INPUTS: Category = "inputs"
OTHER: Category = "other"

# Every tracked byte has exactly one category; this is their order in tables and charts.
CATEGORIES: tuple[Category, ...] = (PARAMS, GRADS, OPTIMIZER, ACTIVATIONS, RECOMPUTED, TEMPORARIES, INPUTS, OTHER)

# The phases of one training step, in order, and the category of what is allocated in each.
Phase = Literal["setup", "inputs", "forward", "backward", "optimizer"]
PHASE_CATEGORY: dict[Phase, Category] = {"setup": OTHER, "inputs": INPUTS, "forward": ACTIVATIONS,
                                         "backward": TEMPORARIES, "optimizer": TEMPORARIES}

# How a run ended. A run that measured what it could and would measure the same again is finished: --resume keeps
# it, and the sweep's exit code counts it as done (a diverged loss or an OOM is the technique's result, not a
# failure of the sweep).
Status = Literal["ok", "oom", "diverged", "error", "timeout"]
STATUSES: tuple[Status, ...] = get_args(Status)
FINISHED: tuple[Status, ...] = ("ok", "oom", "diverged")

# The equivalence check's verdict: the baseline is the reference; bitwise and equivalent train the same model;
# precision changes the numbers on purpose; failed: the check itself did not finish (the run's numbers stand).
Verdict = Literal["reference", "bitwise", "equivalent", "not-equivalent", "precision", "failed"]
SAME_MODEL: tuple[Verdict, ...] = ("bitwise", "equivalent")

# What a technique costs in step time, in four classes, cheapest first (techniques/base.py says what each means).
Cost = Literal["none", "low", "medium", "high"]
COSTS: tuple[Cost, ...] = get_args(Cost)

# How closely a technique stack must match the baseline (techniques/base.py says what each means).
Numerics = Literal["exact", "rounding", "batch-split", "precision"]
