"""What a dispatch mode changes in torch's own backward code, and how the storage tracker undoes it.

torch's backward formulas take a different path for "tensor-subclass-like" tensors (aten/src/ATen/
TensorSubclassLikeUtils.h), and every tensor is one while any TorchDispatchMode is active: the storage tracker is
one, and fake tensors carry the Python key besides. Where the path differs in memory, a prediction (or a
measurement under the tracker) would count memory that a plain run never allocates:

- gather's backward (`gather_backward`) and that of max/min/median/kthvalue/mode along a dim
  (`value_selecting_reduction_backward`) make a zero-filled tensor and scatter the gradient into it. A plain run
  scatters in place; a subclass-like one calls the out-of-place `scatter_add` / `scatter`, which allocates a
  second tensor of the input's size while the first is alive. Seen on a real GPU trace (CS336 "medium", context
  256: the cross-entropy's gather over 4 x 256 x 10,000 fp32 logits): the out-of-place copy put the prediction's
  peak 40,960,000 bytes above the GPU's.

`FreshZeros` makes the tracker run the in-place op there instead: in backward, when an out-of-place op of
`INPLACE` gets as `self` the zero-filled tensor the latest zeros factory made and nothing else has used, the tensor
is private to the formula, so writing into it is what the plain run does. Only fake tensors are rewritten: their
values do not exist, so nothing a real run computes can change.
"""

from __future__ import annotations

import weakref

import torch

from membench.trackers.private import in_backward, is_fake

aten = torch.ops.aten
ZERO_FACTORIES = frozenset({aten.new_zeros.default, aten.zeros.default, aten.zeros_like.default})
# The out-of-place ops those formulas call on their zero-filled tensor, and the in-place op a plain run calls.
INPLACE = {
    aten.scatter_add.default: aten.scatter_add_.default,
    aten.scatter.src: aten.scatter_.src,
    aten.scatter.value: aten.scatter_.value,
    aten.index_add.default: aten.index_add_.default,
    aten.index_put.default: aten.index_put_.default,
}


class FreshZeros:
    """Remembers the zero-filled tensor a backward formula just made; see the module's docstring."""

    def __init__(self):
        self._fresh = None  # weakref to it: a strong one would keep it alive, and its memory counted, too long

    def rewrite(self, func, args):
        """The op to run in place of `func` (itself, unless it is a formula's out-of-place write into fresh zeros)."""
        if self._fresh is None:
            return func
        fresh = self._fresh()
        if func in INPLACE and args and args[0] is fresh and in_backward():
            self._fresh = None
            return INPLACE[func]
        if fresh is None or any(a is fresh for a in args):  # used by another op first: no longer private
            self._fresh = None
        return func

    def made(self, func, out) -> None:
        """After each op: remember a zero-filled fake tensor made in backward."""
        if func in ZERO_FACTORIES and isinstance(out, torch.Tensor) and is_fake(out) and in_backward():
            self._fresh = weakref.ref(out)
