"""What a byte of memory is for. Every tracked byte has exactly one category."""

PARAMS = "parameters"  # parameters and buffers
GRADS = "gradients"
OPTIMIZER = "optimizer_state"
ACTIVATIONS = "activations"  # allocated in forward (saved for backward, or forward temporaries)
TEMPORARIES = "temporaries"  # allocated in backward or the optimizer step and not kept
INPUTS = "inputs"
OTHER = "other"

CATEGORIES = (PARAMS, GRADS, OPTIMIZER, ACTIVATIONS, TEMPORARIES, INPUTS, OTHER)

# The phases of one training step, in order; allocations are categorised by the phase they happen in.
PHASES = ("setup", "inputs", "forward", "backward", "optimizer")
PHASE_CATEGORY = {"setup": OTHER, "inputs": INPUTS, "forward": ACTIVATIONS, "backward": TEMPORARIES,
                  "optimizer": TEMPORARIES}
