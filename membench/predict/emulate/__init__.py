"""A CUDA GPU as a prediction on the CPU sees it: each module follows one part of torch's CUDA code (named in its
docstring, with the torch version it was checked on) and changes what the fake-tensor step allocates to match.

- `registry`: the `Emulation` protocol and `@emulation`: each module below that changes an op registers one class
  (the ops it acts on; a rewrite before the op, an effect or scratch after it, or a composite kernel it replaces).
- `kernels`: `CudaKernels`, the storage tracker's one hook for a CUDA prediction, its op table built from the
  registry; `cuda_gpu`, the device a prediction runs on (composite kernels, CUDA's autocast policy in `autocast`).
- `fake`: fake tensors (materializing a model, scalars they cannot know, outputs seen before); `values`: the values
  a prediction reads, answered and named.
"""
