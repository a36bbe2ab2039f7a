"""Prediction: a CUDA GPU's memory for a training step, on a machine without one.

- `run`: one prediction, the real step on fake tensors under the storage tracker, its allocations replayed through
  the caching-allocator simulator (`membench.allocator`) for reserved memory.
- `steady`: the warm-up step written from the measured one instead of run.
- `fit`: the largest batch within a memory budget, from a few predictions.
- `gpus`: what of a GPU changes memory beyond the table's figures (cuBLAS workspaces), the default target, and
  whether the installed torch has code for the card (the table itself: `membench.spec.gpu`).
- `emulate/`: what a GPU does that the CPU's kernels do not (autocast's casts, fused attention, dropout's mask,
  cuBLAS workspaces, kernel scratch, backward's in-place paths), and answers fake tensors cannot give.

Nothing is imported here: `membench.predict.gpus` is read without torch.
"""
