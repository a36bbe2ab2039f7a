"""Fake tensors and a fake process group: run a real training step with no memory and no GPU behind it.

FakeTensorMode gives every tensor its shape, dtype and storage size but no data, so the storage tracker can count
the bytes a step would allocate. Only here do we touch torch's private fake-tensor and fake-process-group APIs.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from membench import private
from membench.predict.emulate import tracing
from membench.predict.emulate.values import NeedsValues, Values, caller

__all__ = ["NeedsValues", "build_on_meta", "fake_process_group", "fake_tensors", "materialize", "real_tensors"]


class _AnswerScalars(private.TorchDispatchMode):
    """A fake tensor has no value, so `.item()` (and `bool()`, `if t:`, `t.any()` read back) has no answer of its
    own. What a run would read is answered as a GPU run would most likely go, and each answer that is not certain is
    named (predict/emulate/values.py keeps what is known and what was answered)."""

    def __init__(self, mode):
        super().__init__()
        self.values = Values()
        self.outputs = _Outputs(mode)
        self.fsdp_copies = _fsdp_copies()  # registered when FSDP2 is imported, which a distributed run does first
        self.dtensor = private.dtensor_type()  # DTensor where torch.distributed.tensor is imported, else None
        self._passing = None  # (op, args) of a DTensor op this mode passes on to DTensor's dispatch: _through_dtensor

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        """Off while Dynamo compiles and on while compiled code runs (predict/compiled.py): Dynamo compiles only where
        every dispatch mode on the stack says so, so a plain tracker still keeps a compiled model eager."""
        return True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        passing = self._passing
        if passing is not None and func is passing[0] and _same(args, passing[1]):
            self._passing = None
            return NotImplemented  # the op itself, come back through this mode: DTensor's dispatch runs it
        if func is private.PRIM_DEVICE and (device := private.fake_device(args[0])) is not None:
            return device  # as FakeTensorMode answers it (DTensor's dispatch asks it of the local shards)
        if func in private.SCALAR_OPS:
            return self.values.read(args[0])
        if private.writes_values_only(func):
            # An in-place pointwise op (the optimizer's, one tensor or a list at a time) changes values only, which
            # fake tensors do not have, and allocates nothing: FakeTensorMode's meta kernel would only return its
            # first argument (a tenth of a prediction went there). Values a prediction knows follow it.
            self.values.written(func, args, kwargs or {})
            return None if func._schema.name.startswith("aten::_foreach_") else args[0]
        if func.namespace == "profiler":
            # record_function's ops (every optimizer step and zero_grad opens one) take no tensor and make none:
            # run as they are, not through FakeTensorMode's slow path for ops it does not know.
            with private.no_dispatch_modes():
                return func(*args, **(kwargs or {}))
        if func is private.AMP_CHECK_AND_UNSCALE:
            out = func(*args, **(kwargs or {}))
            self.values.finite_check(args[1])
            return out
        kwargs = kwargs or {}
        if func in self.fsdp_copies and not torch.is_inference_mode_enabled():
            out = self.fsdp_copies[func](self.outputs, args, kwargs)
            if out is not _UNLIKE_FSDP:
                return out
        if func in SPLIT_FOREACH and len(args[0]) > SPLIT_FOREACH_AT and not all(
                type(t) is self.outputs.fake for t in args[0]):
            run = (lambda part: self._through_dtensor(func, (part,), {})) if self._of_dtensors(args) else func
            return _split_foreach(run, args[0])
        if func in SPLIT_FOREACH and len(args[0]) > 1 and not kwargs and all(
                type(t) is self.outputs.fake for t in args[0]):
            # Over fake tensors, one call per tensor, each made again by _Outputs where a tensor of its layout was
            # seen before: FakeTensorMode runs a list's op tensor by tensor in Python (50 ms for vit_l_16's 296
            # parameters), and a list is seldom seen twice, where a model has few parameter shapes.
            return [out for t in args[0] for out in self.outputs.call(func, ([t],), {})]
        try:
            if self._of_dtensors(args):
                out = self._through_dtensor(func, args, kwargs)
            else:
                out = self.outputs.call(func, args, kwargs)
        except private.value_dependent_shape_errors() as exc:
            raise NeedsValues(f"{func} at {caller()} makes a tensor whose shape depends on values, which a "
                              f"prediction does not have ({type(exc).__name__})") from None
        self.values.made(func, args, kwargs, out)
        return out

    def _of_dtensors(self, args) -> bool:
        """Whether the op's first argument is a DTensor or a list of them (FSDP2's parameters, their gradients and
        optimizer state)."""
        if self.dtensor is None or not args:
            return False
        first = args[0]
        if type(first) in (list, tuple):
            first = first[0] if first else None
        return type(first) is self.dtensor

    def _through_dtensor(self, func, args, kwargs):
        """A DTensor op run by DTensor's dispatch with this mode on the stack again, so that the ops it runs on the
        local shards come through it too: their outputs made again by _Outputs, in-place updates answered at once.
        Without it they went from DTensor's dispatch straight to FakeTensorMode (this mode and the storage tracker
        are off the stack while their own dispatch runs), each through its slow path: Adam's state (zeros_like)
        and arithmetic (its foreach ops) for every parameter, a seventh of a 70B-shaped FSDP2 prediction. The op
        comes back to this mode first, which passes it on (NotImplemented) to DTensor's dispatch; the tracker
        still sees the op once, above, with the DTensors it returns. tests/predict/emulate/test_fake_outputs.py
        compares a prediction with and without this path."""
        outer, self._passing = self._passing, (func, args)
        try:
            with self:
                return func(*args, **kwargs)
        finally:
            self._passing = outer


def _same(args, passed) -> bool:
    """Whether these are the arguments of the op _through_dtensor passed on, come back: the op's own dispatch is the
    first to reach the mode it pushed (a device asked on the way is another op). Its tensors are the same objects;
    lists are rebuilt and numbers made again (a float may come back as a wrapped scalar), so those are not compared
    by identity."""
    if len(args) != len(passed):
        return False
    for a, b in zip(args, passed):
        if type(a) is type(b) and isinstance(a, torch.Tensor) and a is not b:
            return False
    return True


# Out-of-place foreach ops of one list whose every output is its own input's alone, and allocates nothing else:
# called on part of the list at a time (over fake tensors, one tensor at a time), they make the same outputs in the
# same order. Over DTensors (FSDP2's
# parameters: Adam's square root of its second moments) DTensor's sharding propagation of one call takes time
# quadratic in the list's length (each tensor's strided-shard check walks every argument: 1.6 s of a 70B-shaped
# prediction's 80 layers, for 723 parameters); in parts of SPLIT_FOREACH_AT it is linear.
# tests/predict/emulate/test_fake_outputs.py compares a prediction's records and trace with and without the split.
SPLIT_FOREACH = frozenset({torch.ops.aten._foreach_sqrt.default})
SPLIT_FOREACH_AT = 32


def _split_foreach(func, tensors) -> list:
    return [out for start in range(0, len(tensors), SPLIT_FOREACH_AT)
            for out in func(tensors[start:start + SPLIT_FOREACH_AT])]


def _all_gather_copy_in(outputs, args, kwargs):
    """fsdp::all_gather_copy_in: (the rank's share of the all-gather buffer, the buffer), its Meta kernel's
    all_gather_output.narrow(0, numel * rank, numel) and all_gather_output itself."""
    if kwargs or len(args) != 5:
        return _UNLIKE_FSDP
    buffer, numel, rank = args[1], args[3], args[4]
    if (type(buffer) is not outputs.fake or buffer.constant is not None or buffer.requires_grad
            or buffer.layout is not torch.strided or buffer.dim() != 1 or buffer.stride() != (1,)
            or type(numel) is not int or type(rank) is not int or not 0 <= numel * rank <= buffer.numel() - numel):
        return _UNLIKE_FSDP
    share = private.new_fake_tensor(outputs.mode, (numel,), (1,), buffer.dtype, buffer.fake_device,
                                    buffer.untyped_storage(), buffer.storage_offset() + numel * rank)
    return share, buffer


def _split_with_sizes_copy(outputs, args, kwargs):
    """fsdp::split_with_sizes_copy: nothing, where each `out` already has its split's shape (then its Meta kernel,
    torch.split_with_sizes_copy, resizes none and copies only values)."""
    dim = args[2] if len(args) > 2 else kwargs.get("dim", 0)
    out = kwargs.get("out")
    if len(args) not in (2, 3) or set(kwargs) - {"dim", "out"} or not isinstance(out, (list, tuple)):
        return _UNLIKE_FSDP
    source, sizes = args[0], args[1]
    if type(source) is not outputs.fake or type(dim) is not int or not 0 <= dim < source.dim():
        return _UNLIKE_FSDP
    shape = list(source.shape)
    if len(out) != len(sizes) or sum(sizes) != shape[dim]:
        return _UNLIKE_FSDP
    for t, size in zip(out, sizes):
        shape[dim] = size
        if type(t) is not outputs.fake or list(t.shape) != shape or t.fake_device != source.fake_device:
            return _UNLIKE_FSDP
    return None


def _chunk_cat(outputs, args, kwargs):
    """fsdp::chunk_cat (the reduce-scatter's copy-in): nothing, where `out` already has the shape its Meta kernel,
    torch._chunk_cat along dim 0, gives it: [num_chunks, the sum over the tensors of their first dimension padded
    to a multiple of num_chunks, over num_chunks, times their other dimensions] (torch/_decomp/decompositions.py,
    _pad_chunk); then it resizes nothing, its padded temporaries (and the cast into out's dtype) are the Meta
    kernel's own, not fake tensors, and it copies only values."""
    named = dict(zip(("tensors", "dim", "num_chunks"), args), **kwargs)
    if len(args) > 3 or set(named) != {"tensors", "dim", "num_chunks", "out"}:
        return _UNLIKE_FSDP
    tensors, dim, chunks, out = named["tensors"], named["dim"], named["num_chunks"], named["out"]
    if (dim != 0 or type(chunks) is not int or chunks < 1 or not isinstance(tensors, (list, tuple)) or not tensors
            or type(out) is not outputs.fake):
        return _UNLIKE_FSDP
    dtype = tensors[0].dtype  # one for all (bf16 gradients under mixed precision), cast into out's (fp32 reduction)
    if not torch.can_cast(dtype, out.dtype):
        return _UNLIKE_FSDP
    width = 0
    for t in tensors:
        if (type(t) is not outputs.fake or t.dtype != dtype or t.fake_device != out.fake_device or t.dim() < 1
                or t.numel() == 0):
            return _UNLIKE_FSDP
        rows = -(-t.shape[0] // chunks)  # its first dimension padded to a multiple of num_chunks, per chunk
        width += rows * (t.numel() // t.shape[0])
    return None if tuple(out.shape) == (chunks, width) else _UNLIKE_FSDP


# FSDP2's all-gather copy-in and copy-out and its reduce-scatter copy-in (torch/distributed/fsdp/_fully_shard/
# _fsdp_collectives.py: custom ops) allocate nothing: the copy-in returns a view of the all-gather buffer its caller
# made, and the buffer; the copy-out and chunk_cat write into buffers their callers made to size. On fake tensors
# they copy no values, and FakeTensorMode's path for custom ops (its cache key over every argument, then the Meta
# kernel in Python) took about 1 ms a call, 0.9 s of a 70B-shaped prediction's 80 layers: answered here where the
# arguments are as FSDP2 makes them, sent on to FakeTensorMode otherwise. tests/predict/emulate/test_fake_outputs.py
# compares both ways.
def _fsdp_copies() -> dict:
    answers = {"all_gather_copy_in": _all_gather_copy_in, "split_with_sizes_copy": _split_with_sizes_copy,
               "chunk_cat": _chunk_cat}
    return {op: answers[name] for name, op in private.fsdp_copy_ops().items()}


_UNLIKE_FSDP = object()  # an answer's "not as FSDP2 calls it": FakeTensorMode answers


class _Outputs:
    """The outputs of an op seen before with the same inputs' shapes, strides, dtypes and arguments, made again
    without FakeTensorMode. FakeTensorMode caches them too, but building its cache key (every argument checked and
    hashed, in Python) took half of a prediction's time; this key is a tuple of what decides an output's layout.
    Only ops whose outputs follow from that alone (private.cacheable_op), whose arguments are fake tensors and
    plain values, and whose outputs are new tensors or views of an input, are kept; anything else goes to
    FakeTensorMode every time.

    What is kept is shared by every prediction in the process (_KEPT): a layout names no tensor and no mode, only
    shapes, strides, dtypes and devices, so a process's later predictions (a worker's second technique, fit's
    batch sizes) make outputs again from its first one's instead of asking FakeTensorMode once per key again."""

    def __init__(self, mode):
        self.mode = mode
        self.fake = private.fake_tensor_type()
        self.kept = _KEPT

    def call(self, func, args, kwargs):
        if func is private.LIFT_FRESH and type(args[0]) is torch.Tensor and _fresh(args[0]) and not (
                torch.is_inference_mode_enabled() or args[0].requires_grad):
            # torch.tensor(0.0) under fake mode (an optimizer's step count): FakeTensorMode converts the real
            # tensor, keeping its value as a constant only `.item()` would read, and _AnswerScalars answers that.
            t = args[0]
            return private.new_fake_tensor(self.mode, t.shape, t.stride(), t.dtype, t.device)
        # Under inference_mode, views of tensors made outside it are made differently: left to FakeTensorMode.
        cacheable = private.cacheable_op(func) and not torch.is_inference_mode_enabled()
        key = self._key(func, args, kwargs) if cacheable else None
        kept = self.kept.get(key) if key is not None else None
        if kept is not None:
            outputs = tuple(self._make(spec, args) for spec in kept[1])
            return outputs if kept[0] else outputs[0]
        out = func(*args, **kwargs)
        if key is not None and key not in self.kept:
            self.kept[key] = self._layout(func, args, out)
        return out

    def _key(self, func, args, kwargs):
        parts = [func, torch.get_default_dtype()]  # a factory op without a dtype makes the default one
        for value in (*args, *kwargs.items()):
            part = self._part(value)
            if part is None:
                return None
            parts.append(part)
        return tuple(parts)

    def _part(self, value):
        kind = type(value)
        if kind in _PLAIN:  # the most common arguments first (sizes, dims, dtypes): as the isinstance test below
            return (kind, value)
        if (kind is list or kind is tuple) and all(type(v) is int for v in value):
            return (kind, tuple(value))  # a shape: its ints as they are (any other list's parts are tuples)
        if kind is self.fake:
            if value.layout is not torch.strided or value.constant is not None:
                return None
            return (value.shape, value.stride(), value.storage_offset(), value.dtype, value.fake_device,
                    value.is_conj(), value.is_neg())
        if type(value) is torch.Tensor and value.dim() == 0 and value.layout is torch.strided:
            # A real host scalar (predict/emulate/sdpa.py's mask fill: a tenth of a second per 80 attention calls
            # through FakeTensorMode): FakeTensorMode makes it a fake tensor of its dtype and device, without its
            # value (no constant), before it works out any output; with no fake argument its outputs are constants,
            # which are not kept.
            return (torch.Tensor, value.dtype, value.device, value.requires_grad, value.is_conj(), value.is_neg())
        if value is None or isinstance(value, (bool, int, float, str, torch.dtype, torch.device, torch.layout,
                                               torch.memory_format)):
            return (type(value), value)
        if isinstance(value, (tuple, list)):
            parts = tuple(self._part(v) for v in value)
            return None if any(p is None for p in parts) else (type(value), parts)
        return None  # a generator, a real tensor of elements, a symbolic size: not kept

    def _layout(self, func, args, out):
        """How to make `out` again: (a tuple?, per output (shape, stride, offset, dtype, device, the input it
        views or None)); None where the outputs are not all new tensors of their own or views of an input."""
        outputs = out if isinstance(out, (tuple, list)) else (out,)
        inputs = {id(a.untyped_storage()): i for i, a in enumerate(args) if type(a) is self.fake}
        specs, seen = [], set()
        for t in outputs:
            if type(t) is not self.fake or t.layout is not torch.strided or t.constant is not None:
                return None
            if t.is_conj() or t.is_neg() or t.requires_grad:
                return None
            storage = t.untyped_storage()
            view_of = inputs.get(id(storage))
            if view_of is None:
                if id(storage) in seen or not _fresh(t):  # outputs sharing a new storage are not made again
                    return None
                seen.add(id(storage))
            elif not (func.is_view or func in _VIEWS_UNSEEN_BY_AUTOGRAD):
                return None  # a view op's outputs may all view one input (split: FSDP2 splits every all-gather)
            specs.append((tuple(t.shape), t.stride(), t.storage_offset(), t.dtype, t.fake_device, view_of))
        return (isinstance(out, (tuple, list)), tuple(specs))

    def _make(self, spec, args):
        shape, stride, offset, dtype, device, view_of = spec
        storage = args[view_of].untyped_storage() if view_of is not None else None
        return private.new_fake_tensor(self.mode, shape, stride, dtype, device, storage, offset)


_PLAIN = frozenset({bool, int, float, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format})

# (op, what decides its outputs' layout) -> how to make them again, or None where they are not made again: _Outputs.
_KEPT: dict[tuple, tuple | None] = {}


# Ops whose output shares its input's storage, as a view does, though autograd does not record it as one (a matmul
# of 3-d inputs reshapes its output so: a twentieth of a 70B-shaped prediction's time went to FakeTensorMode's
# Python reshape for it, which its own cache refuses). Below autograd, where _Outputs runs, FakeTensorMode's output is a
# tensor on the input's storage with no view base, as the one made again is (tests/predict/emulate/test_fake_outputs).
_VIEWS_UNSEEN_BY_AUTOGRAD = frozenset({torch.ops.aten._unsafe_view.default})


def _fresh(t: torch.Tensor) -> bool:
    """A tensor that owns exactly the storage empty_strided would give it (offset 0, no spare bytes)."""
    if t.storage_offset() != 0:
        return False
    extent = 0 if 0 in t.shape else 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
    return t.untyped_storage().nbytes() == extent * t.element_size()


@contextlib.contextmanager
def fake_tensors():
    """Every tensor made inside is fake, on its real device (we use cpu: fake cuda fails in backward without a
    GPU and picks other kernels), and real tensors that meet fake ones become fake too. Yields the Values that
    answer reads of their values (its `answered()`: what was answered without knowing)."""
    mode = private.fake_tensor_mode(allow_non_fake_inputs=True)
    answers = _AnswerScalars(mode)
    with mode, answers, tracing.real_to_transformers():
        yield answers.values


def build_on_meta(build) -> nn.Module:
    """Build with no memory at all (torchvision's ViT init is data-dependent, so it cannot run under fake mode)."""
    with torch.device("meta"):
        return build()


def materialize(meta_model: nn.Module) -> nn.Module:
    """Inside fake_tensors(): fake cpu storages of the right sizes for every parameter and buffer.

    Each meta tensor is replaced by a new fake one of its shape, strides and dtype, once: a parameter shared by two
    modules (tied input and output embeddings, as in GPT-2 and BERT) stays one, as transformers' tie_weights()
    makes it after its own meta loading, not two counted twice (with two gradients and two optimizer states).
    Parameters of a subclass (a lazy or quantized one) go through `to_empty`, which keeps their type; made one by
    one through FakeTensorMode's conversion of meta tensors, that was a tenth of a prediction.
    """
    tables = [(getattr(module, kind), name, tensor) for module in meta_model.modules()
              for kind in ("_parameters", "_buffers") for name, tensor in getattr(module, kind).items()
              if tensor is not None]
    plain = all(type(t) in (nn.Parameter, torch.Tensor) for _, _, t in tables)
    if not plain:
        meta_model.to_empty(device="cpu")
    made: dict[int, torch.Tensor] = {}
    for table, name, tensor in tables:
        if id(tensor) not in made:
            new = table[name] if not plain else torch.empty_strided(tensor.shape, tensor.stride(),
                                                                    dtype=tensor.dtype, device="cpu")
            if plain and type(tensor) is nn.Parameter:
                new = nn.Parameter(new, requires_grad=tensor.requires_grad)
            made[id(tensor)] = new
        table[name] = made[id(tensor)]
    return meta_model


def real_tensors():
    """Leave fake mode for a moment (a device mesh needs real rank arithmetic); fake tensors stay fake."""
    return private.unset_fake_temporarily()


@contextlib.contextmanager
def fake_process_group(world_size: int, rank: int = 0):
    """One process plays `rank` of `world_size`: collectives return at once and move no data, but every buffer
    they need is allocated as it would be, so per-rank memory (FSDP shards, all-gather buffers) is predicted."""
    import torch.distributed as dist

    if dist.is_initialized():
        raise RuntimeError("a process group is already initialized; predict in a fresh process")
    dist.init_process_group("fake", store=private.fake_store(), rank=rank, world_size=world_size)
    try:
        with private.fsdp_chunks_on_demand():  # FSDP2 shards making only the chunks it uses (one rank is played)
            yield
    finally:
        dist.destroy_process_group()
