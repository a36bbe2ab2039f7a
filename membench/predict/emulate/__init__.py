"""A CUDA GPU as a prediction on the CPU sees it: each module follows one part of torch's CUDA code (named in its
docstring, with the torch version it was checked on) and changes what the fake-tensor step allocates to match.

- `fake`: fake tensors (materializing a model, scalars they cannot know, outputs seen before).
- `autocast`: CUDA's autocast policy; `sdpa`: fused attention; `dropout`: dropout's one-byte mask.
- `kernels`: one hook around every op for cuBLAS workspaces, kernel scratch (`reductions`; nn.Embedding's backward
  in `embedding`, cub's storage in `cub`) and backward's in-place paths (`inplace_backward`).
"""
