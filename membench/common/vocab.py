"""The vocabulary of results: what a byte of memory is for (categories) and when it was allocated (phases).

Every tracked byte has exactly one category. Trackers write these names; reports read them.
"""

PARAMS = "parameters"  # parameters and buffers
GRADS = "gradients"
OPTIMIZER = "optimizer_state"
ACTIVATIONS = "activations"  # allocated in forward (saved for backward, or forward temporaries)
TEMPORARIES = "temporaries"  # allocated in backward or the optimizer step and not kept
# Activations a checkpointed block computes again in backward (ckpt, sac): what recomputation costs in memory.
RECOMPUTED = "recomputed_activations"
INPUTS = "inputs"
OTHER = "other"

CATEGORIES = (PARAMS, GRADS, OPTIMIZER, ACTIVATIONS, RECOMPUTED, TEMPORARIES, INPUTS, OTHER)

# The phases of one training step, in order, and the category of what is allocated in each.
PHASE_CATEGORY = {"setup": OTHER, "inputs": INPUTS, "forward": ACTIVATIONS, "backward": TEMPORARIES,
                  "optimizer": TEMPORARIES}
