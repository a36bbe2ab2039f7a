"""nn.Linear's bias as a plain CUDA run adds it, on CPU fake tensors.

`linear` (aten/src/ATen/native/Linear.cpp, torch 2.14) adds the bias inside the kernel (addmm) for a 2-D input and
for a contiguous one, which it flattens to 2-D. Any other input (the transposed [L, B, E] query that
nn.MultiheadAttention hands its in-projection, torchvision's ViT's included) goes through `matmul`, and the bias is
then added in place, `output.add_(bias)`, unless the bias is "tensor-subclass-like"
(aten/src/ATen/TensorSubclassLikeUtils.h), when it is added out of place. Every tensor is one while a dispatch mode
is active, so a prediction (fake tensors, the storage tracker) made a second output-sized tensor for a moment at
each such layer where the GPU makes none (vit-small's traces in results/gpu-traces/, torch 2.11: per
in-projection, the input's copy, the product and the packed projection's contiguous copy, and no second product).
Which cached blocks later requests split depends on it, and so the peak allocated.

While a CUDA prediction runs (`CudaLinear`), `aten::linear` runs that code as a plain run does (the branches of
torch 2.14; the environment's TORCH_LINEAR_FLATTEN_3D=1 too), the bias added in place on the matmul path. It is
registered at the dispatcher, replacing the op's CompositeImplicitAutograd kernel
(private.composite_kernel_replaced), so it also holds in backward, where checkpointing recomputes the forward. """

from __future__ import annotations

import math
import os

import torch

from membench.predict.emulate.registry import Emulation, emulation


def _flatten_nd_linear(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    sizes = input.shape
    result = torch.addmm(bias, input.reshape(math.prod(sizes[:-1]), sizes[-1]), weight.t())
    return result.view(*sizes[:-1], result.shape[1])


def _linear(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    if input.dim() == 0 or weight.dim() == 0:
        raise RuntimeError(f"both arguments to linear need to be at least 1D, but they are {input.dim()}D and "
                           f"{weight.dim()}D")
    if bias is not None:
        if input.dim() == 2:
            return torch.addmm(bias, input, weight.t())
        if input.is_contiguous() and (input.dim() == 3 or (input.layout == torch.strided
                                                            and weight.layout == torch.strided and bias.dim() == 1)):
            return _flatten_nd_linear(input, weight, bias)
        if os.environ.get("TORCH_LINEAR_FLATTEN_3D") == "1" and input.dim() == 3:
            return _flatten_nd_linear(input.contiguous(), weight, bias)
    output = torch.matmul(input, weight.t())
    if bias is not None:
        output.add_(bias)  # a plain run's path; out of place only for tensor-subclass-like biases
    return output


@emulation
class CudaLinear(Emulation):
    """aten::linear adds a bias on its matmul path in place, as a plain run does."""

    composite = "linear"

    def kernel(self, input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return _linear(input, weight, bias)
