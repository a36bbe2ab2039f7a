"""What a dispatch mode changes in torch's own backward code, and how the storage tracker undoes it.

torch's backward formulas take a different path for "tensor-subclass-like" tensors (aten/src/ATen/
TensorSubclassLikeUtils.h), and every tensor is one while any TorchDispatchMode is active: the storage tracker is
one, and fake tensors carry the Python key besides. Where the path differs in memory, a prediction (or a
measurement under the tracker) would count memory that a plain run never allocates:

- gather's backward (`gather_backward`) and that of max/min/median/kthvalue/mode along a dim
  (`value_selecting_reduction_backward`) make a zero-filled tensor and scatter the gradient into it. A plain run
  scatters in place; a subclass-like one calls the out-of-place `scatter_add` / `scatter`, which allocates a
  second tensor of the input's size while the first is alive, which the real GPU traces benchmarks/
  validate_predictions.py reads (the cross-entropy's gather over the logits) do not hold.

- The autograd engine sums the gradients that reach one input of a node (InputBuffer::accumulate in
  torch/csrc/autograd/input_buffer.cpp) in place into the first one when it holds that gradient's last reference,
  but out of place when the second is subclass-like: one extra gradient-sized tensor for a moment at every fork in
  the graph (a residual stream, a tensor used twice). Seen on the same traces: the GPU allocates nothing there.

`BackwardPaths` makes the tracker run the in-place op there instead: in backward, when an out-of-place op of
`INPLACE` gets as `self` the zero-filled tensor the latest zeros factory made and nothing else has used, the tensor
is private to the formula, so writing into it is what the plain run does; and when an `add` in backward sums a
gradient made by an earlier node (the engine's buffer; a formula's gradients count whether it returns one tensor or
several, as LayerNorm's and attention's backward do) with another of the same shape and dtype, the first dense
and sharing its storage with no other tensor (a view's base shares it, and the engine then sums out of place too),
with grad mode off, it is the engine's accumulation and runs as `add_`. Two approximations, each one gradient for
a moment: a node that sends two gradients to the same input (x * x) sums them out of place here (the first was
made by the same node), an over-prediction; and a gradient a node passes on unchanged to two inputs whose buffers
both still hold it is summed in place here where the engine would not (that second reference is in C++, out of
Python's sight), an under-prediction. Only fake tensors are
rewritten: their values do not exist, so nothing a real run computes can change; and only in a CUDA prediction
(a registered emulation), as a CPU run is measured by the tracker itself, paths and all.
"""

from __future__ import annotations

import weakref

import torch
from torch.utils.weak import WeakIdKeyDictionary

from membench.predict.emulate.registry import ALL_OPS, Emulation, emulation
from membench.private import current_autograd_node, in_backward, is_fake, storage_use_count

aten = torch.ops.aten
ADD, ADD_ = aten.add.Tensor, aten.add_.Tensor
ZERO_FACTORIES = frozenset({aten.new_zeros.default, aten.zeros.default, aten.zeros_like.default})
# The out-of-place ops those formulas call on their zero-filled tensor, and the in-place op a plain run calls.
INPLACE = {
    aten.scatter_add.default: aten.scatter_add_.default,
    aten.scatter.src: aten.scatter_.src,
    aten.scatter.value: aten.scatter_.value,
    aten.index_add.default: aten.index_add_.default,
    aten.index_put.default: aten.index_put_.default,
}


@emulation
class BackwardPaths(Emulation):
    """Remembers, in backward, the zero-filled tensor a formula just made and which node made each tensor; see the
    module's docstring."""

    ops = ALL_OPS  # any op may use the zero-filled tensor first, and so make it no longer private
    order = 30
    # The engine of torch since pytorch#88339 (November 2022); a prediction of older software's run turns it off.
    engine_sums_in_place = True

    def __init__(self, gpu=None):
        super().__init__(gpu)
        self._fresh = None  # weakref to it: a strong one would keep it alive, and its memory counted, too long
        self._node = None  # the autograd node that ran the latest op in backward (held: its id stays its own)
        self._epoch = 0  # bumped whenever that node changes
        self._born = WeakIdKeyDictionary()  # tensor made in backward -> the epoch it was made in

    def _current_epoch(self) -> int:
        node = current_autograd_node()
        if node is not self._node:
            self._node = node
            self._epoch += 1
        return self._epoch

    def rewrite(self, func, args, kwargs):
        """The op to run in place of `func`: itself, or the in-place op a plain run calls there."""
        if (func is ADD and self.engine_sums_in_place and len(args) == 2 and not kwargs
                and self._is_engine_accumulation(*args)):
            return ADD_
        if self._fresh is None:
            return func
        fresh = self._fresh()
        if func in INPLACE and args and args[0] is fresh and in_backward():
            self._fresh = None
            return INPLACE[func]
        if fresh is None or any(a is fresh for a in args):  # used by another op first: no longer private
            self._fresh = None
        return func

    def _is_engine_accumulation(self, old, new) -> bool:
        if not (isinstance(old, torch.Tensor) and isinstance(new, torch.Tensor)) or torch.is_grad_enabled():
            return False
        born = self._born.get(old)
        return (born is not None and born < self._current_epoch() and old.shape == new.shape
                and old.dtype == new.dtype and old.device == new.device and _dense(old)
                and storage_use_count(old) <= 2)  # its tensor's reference and the one asking: no view shares it

    def after(self, func, args, kwargs, out, tracker) -> None:
        """After each op: in backward, when its fake tensors were made, and the zeros of a formula."""
        # a formula's one gradient, or its several (layer_norm's, conv's, ...)
        made = [t for t in (out if isinstance(out, (tuple, list)) else (out,))
                if isinstance(t, torch.Tensor) and is_fake(t)]
        if not made or not in_backward():
            return
        epoch = self._current_epoch()
        for t in made:
            self._born[t] = epoch
        if func in ZERO_FACTORIES and made[0] is out:
            self._fresh = weakref.ref(out)


def _dense(tensor: torch.Tensor) -> bool:
    """Non-overlapping and dense, in any dim order (the engine's condition; a permuted gradient is one)."""
    if tensor.is_contiguous():
        return True
    expected = 1
    for stride, size in sorted((st, n) for n, st in zip(tensor.shape, tensor.stride()) if n != 1):
        if stride != expected:
            return False
        expected *= size
    return True
