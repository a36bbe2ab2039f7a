"""Every private (underscore) torch API membench uses, in one place, with the torch versions it was checked on.

A torch upgrade that moves one of these breaks here, not in a dozen modules. "Checked" means this project's test
suite ran green against it: torch 2.14.1 (CI, CPU). The CUDA entries ran on one NVIDIA H200 with torch 2.11.0+cu130
(benchmarks/gpu_acceptance.py's checks and measured runs: results/gpu-acceptance/, results/gpu-runs/).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import sys
import warnings
import weakref

import torch
from torch import nn

# --- dispatch and pytrees: the storage tracker (trackers/storage.py), fake scalars (predict/emulate/fake.py)
# checked: 2.14.1
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass  # noqa: E402,F401
from torch.utils._pytree import tree_flatten  # noqa: E402,F401

# The ops behind Tensor.item(): a fake tensor has no value to give. Under torch.inference_mode, item reaches a
# dispatch mode as aten.item itself, not yet decomposed into _local_scalar_dense. checked: 2.14.1
SCALAR_OPS = (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.item.default)
# GradScaler's inf/nan check: writes into its second argument (found_inf) whether a gradient was inf or nan.
# checked: 2.14.1
AMP_CHECK_AND_UNSCALE = torch.ops.aten._amp_foreach_non_finite_check_and_unscale_.default

# --- the dispatcher's autocast key, for CUDA's autocast policy on CPU fake tensors (predict/emulate/autocast.py) ---
# checked: 2.14.1 (Library.impl over a key that has a kernel replaces it until the library is destroyed)
AUTOCAST_CPU_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)
exclude_dispatch_keys = torch._C._ExcludeDispatchKeyGuard


def ops_with_kernel_for(key: str, namespace: str = "aten") -> list[str]:
    """Ops of a namespace with a kernel of their own at a dispatch key, as "name" or "name.overload"."""
    prefix = f"{namespace}::"
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    return [n[len(prefix):] for n in torch._C._dispatch_get_all_op_names() if n.startswith(prefix) and has(n, key)]


def destroy_library(library) -> None:
    library._destroy()


@contextlib.contextmanager
def composite_kernel_replaced(op_name: str, kernel):
    """While active, aten::`op_name` runs `kernel` as its CompositeImplicitAutograd kernel (at the dispatcher, so
    also in backward, where checkpointing recomputes the forward); torch's own comes back after."""
    library = torch.library.Library("aten", "IMPL")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Overriding a previously registered kernel": that is the point
            library.impl(op_name, kernel, "CompositeImplicitAutograd")
        yield
    finally:
        destroy_library(library)


# checked: 2.14.1 (torch._ops.OpOverload: what torch.ops.aten.NAME.OVERLOAD is)
def is_aten_op(func) -> bool:
    """Whether func is an op of the dispatcher (an OpOverload), not a Python function standing for one."""
    return isinstance(func, torch._ops.OpOverload)


# --- whether an op decomposes (CompositeImplicitAutograd): the storage tracker under inference_mode ----------
# checked: 2.14.1 (OpOverload.decompose runs that kernel)
def per_op(answer):
    """answer(op), worked out once per op: asked before every op of a prediction, and an OpOverload's own hash is
    Python code. Remembered by id, with the op kept, so that an id is never another op's."""
    memo: dict[int, tuple] = {}

    def remembered(op):
        entry = memo.get(id(op))
        if entry is None or entry[0] is not op:
            entry = memo[id(op)] = (op, answer(op))
        return entry[1]

    remembered.__doc__ = answer.__doc__
    return remembered


@per_op
def has_composite_implicit_kernel(op) -> bool:
    return op.namespace == "aten" and torch._C._dispatch_has_kernel_for_dispatch_key(
        op.name(), torch._C.DispatchKey.CompositeImplicitAutograd)


# --- BatchNorm's base class, to tell a model that normalises over the batch (equivalence) ------------------------
# checked: 2.14.1 (nn.modules.batchnorm._BatchNorm, a base of BatchNorm1d/2d/3d, SyncBatchNorm and the lazy ones)
BATCHNORM_BASE = nn.modules.batchnorm._BatchNorm


def has_batchnorm(model: nn.Module) -> bool:
    return any(isinstance(m, BATCHNORM_BASE) for m in model.modules())


# --- modules whose forward torch.compile compiled: a dispatch mode makes Dynamo run them eager, so a prediction and
# the recording pass see the eager model (predict/run.py, measure.py). checked: 2.14.1 and 2.9.1 (OptimizedModule is
# torch.compile(module); `_compiled_call_impl` is set by Module.compile(); `_torchdynamo_orig_callable` marks a
# function or method torch.compile wrapped, e.g. a forward decorated with @torch.compile)
def compiled_modules(model: nn.Module) -> list[str]:
    """The qualified names of the modules whose forward is compiled ('' for the model itself), outermost first; a
    compiled module's own submodules are not named again."""
    from torch._dynamo.eval_frame import OptimizedModule

    found: list[str] = []
    for name, module in model.named_modules():
        if any(name.startswith(f"{outer}.") or outer == "" for outer in found):
            continue
        if (isinstance(module, OptimizedModule) or getattr(module, "_compiled_call_impl", None) is not None
                or hasattr(getattr(module, "forward", None), "_torchdynamo_orig_callable")):
            found.append(name)
    return found


@functools.cache
def dynamo_compiles_under_dispatch_modes() -> bool:
    """Whether Dynamo compiles code called under a dispatch mode (torch 2.4 does) instead of running it eager
    (2.14 does: convert_frame.py skips the frame, for that call only), found by trying it once: a one-op function
    compiled with a backend that only counts. checked: 2.14.1 (False), 2.4.1 (True)"""
    class _Passing(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    graphs = []

    def counting(graph, example_inputs):
        graphs.append(graph)
        return graph.forward

    def double(x):
        return x * 2

    with _Passing():
        torch.compile(double, backend=counting)(torch.ones(1))
    return bool(graphs)


@contextlib.contextmanager
def dynamo_eager():
    """Compiled code runs eager inside, as a prediction says it does. Where Dynamo would compile under the
    prediction's dispatch modes (torch 2.4), its own fake tensors clash with the prediction's, so it is turned off
    (torch._dynamo.config.disable, which also marks the code it meets as skipped for the rest of the process:
    a prediction's process is its own). Elsewhere nothing is changed."""
    if not dynamo_compiles_under_dispatch_modes():
        yield
        return
    import torch._dynamo

    with torch._dynamo.config.patch(disable=True):
        yield


# --- dropout's base class, to switch dropout off for the equivalence check only ---------------------------------
# checked: 2.14.1 (nn.modules.dropout._DropoutNd, a base of Dropout, Dropout1d/2d/3d, AlphaDropout and friends)
DROPOUT_BASE = nn.modules.dropout._DropoutNd


# --- whether autograd is running a backward pass on this thread (trackers/recompute.py) ---------------------------
# -1 outside backward. checked: 2.14.1
def in_backward() -> bool:
    return torch._C._current_graph_task_id() != -1


# The autograd node whose backward is running (None outside backward), and how many references a tensor's storage
# has (its tensors and views, and Python's storage objects): predict/emulate/inplace_backward.py. checked: 2.14.1
def current_autograd_node():
    return torch._C._current_autograd_node()


def storage_use_count(tensor) -> int:
    return torch._C._storage_Use_Count(tensor.untyped_storage()._cdata)


# --- selective activation checkpointing: the ops whose outputs are kept (techniques/sac.py) ----------------------
# Private attention kernels exist only on some builds: each is looked up by name. checked: 2.14.1
def attention_and_matmul_ops() -> set:
    aten = torch.ops.aten
    names = ("mm", "addmm", "bmm", "baddbmm", "_scaled_dot_product_flash_attention",
             "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
             "_scaled_dot_product_flash_attention_for_cpu")
    return {getattr(aten, n).default for n in names if hasattr(aten, n)}


# --- FSDP2 (techniques/fsdp.py, the storage tracker) -------------------------------------------------------------
def fsdp_api():
    """(CPUOffloadPolicy, OffloadPolicy, fully_shard): public since torch 2.6 (the fsdp technique needs 2.9)."""
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard

    return CPUOffloadPolicy, OffloadPolicy, fully_shard


def fsdp_mixed_precision(param_dtype, reduce_dtype):
    """FSDP2's MixedPrecisionPolicy (public since torch 2.6). checked: 2.14.1"""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)


def fsdp_storage_modules() -> list:
    """FSDP2's modules whose alloc_storage/free_storage resize unsharded parameters in place (no dispatch mode sees
    a storage resize). Only when FSDP is already imported: importing it costs a second. checked: 2.14.1"""
    names = ("torch.distributed.fsdp._fully_shard._fsdp_param", "torch.distributed.fsdp._fully_shard._fsdp_param_group")
    return [sys.modules[n] for n in names if n in sys.modules]


def dtensor_type():
    """torch's DTensor class where torch.distributed.tensor is imported (FSDP2 imports it), else None: a prediction
    that shards nothing does not import it (a second). checked: 2.14.1"""
    module = sys.modules.get("torch.distributed.tensor")
    return getattr(module, "DTensor", None)


def fsdp_comm_streams(model) -> dict[str, object]:
    """The streams FSDP2 shares across a model's states (FSDPCommContext, made at the root's lazy init), by their
    attribute names; empty before the first forward or for a model without FSDP. checked: 2.14.1"""
    for module in model.modules():
        get_state = getattr(module, "_get_fsdp_state", None)
        comm = getattr(get_state(), "_comm_ctx", None) if get_state is not None else None
        if comm is not None and hasattr(comm, "all_gather_copy_in_stream"):
            names = ("all_gather_copy_in_stream", "all_gather_stream", "reduce_scatter_stream", "all_reduce_stream")
            return {name: getattr(comm, name) for name in names if hasattr(comm, name)}
    return {}


def fsdp_copy_ops() -> dict[str, object]:
    """FSDP2's all-gather copy-in and copy-out and reduce-scatter copy-in custom ops (_fsdp_collectives.py registers
    them in the `fsdp` namespace), by name: those registered (none before FSDP2 is imported). checked: 2.14.1"""
    ops = getattr(torch.ops, "fsdp", None)
    found = {}
    for name in ("all_gather_copy_in", "split_with_sizes_copy", "chunk_cat"):
        op = getattr(getattr(ops, name, None), "default", None) if ops is not None else None
        if op is not None:
            found[name] = op
    return found


def active_fake_mode():
    """The FakeTensorMode on the dispatch mode stack, or None. checked: 2.14.1"""
    return torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE)


class _ChunksOnDemand:
    """_chunk_with_empty's list of `num_chunks` chunks (torch.chunk's, then empty tensors), each made when asked:
    FSDP2 asks for its own rank's and chunk 0 only, and at 64 ranks a prediction would otherwise make 64 fake views
    of every parameter, twice (a third of a 70B-shaped prediction's time). Views allocate nothing: the trace is the
    same but for the empty padding chunks of ranks FSDP2 never asks for."""

    def __init__(self, tensor, num_chunks: int, dim: int):
        self.tensor, self.num_chunks, self.dim = tensor, num_chunks, dim
        self.rows = tensor.size(dim)
        self.split = -(-self.rows // num_chunks)  # torch.chunk's chunk size
        self.made = -(-self.rows // self.split)  # how many chunks torch.chunk returns

    def __len__(self) -> int:
        return self.num_chunks

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self.num_chunks))]
        if index < 0:
            index += self.num_chunks
        if not 0 <= index < self.num_chunks:
            raise IndexError(index)
        if index >= self.made:
            return self[0].new_empty(0)
        start = index * self.split
        return self.tensor.narrow(self.dim, start, min(self.split, self.rows - start))


@contextlib.contextmanager
def fsdp_chunks_on_demand():
    """FSDP2's sharding makes only the chunks it uses (_ChunksOnDemand), for predictions. checked: 2.14.1
    (_fsdp_param.py imports _chunk_with_empty by name and only indexes the list it returns)"""
    import torch.distributed.fsdp._fully_shard._fsdp_param as fsdp_param

    original = getattr(fsdp_param, "_chunk_with_empty", None)
    if original is None:
        yield
        return

    def on_demand(tensor, num_chunks: int, dim: int):
        if num_chunks <= 1 or tensor.size(dim) == 0:
            return original(tensor, num_chunks, dim)
        return _ChunksOnDemand(tensor, num_chunks, dim)

    fsdp_param._chunk_with_empty = on_demand
    try:
        yield
    finally:
        fsdp_param._chunk_with_empty = original


# --- fake tensors and a fake process group: prediction without memory or GPU (predict/emulate/fake.py) ------------
def fake_tensor_mode(**kwargs):
    from torch._subclasses.fake_tensor import FakeTensorMode  # checked: 2.14.1

    return FakeTensorMode(**kwargs)


def is_fake(tensor) -> bool:
    """A FakeTensor (no data): predict/emulate/inplace_backward.py rewrites ops only on these."""
    return isinstance(tensor, fake_tensor_type())


@per_op
def writes_values_only(op) -> bool:
    """An in-place pointwise op on one tensor (add_, lerp_, ...: it returns its first argument) or on lists of them
    (torch._foreach_add_, ...: it returns nothing): it changes no shape, stride or storage. checked: 2.14.1"""
    schema = op._schema
    first = schema.arguments[0].alias_info if schema.arguments else None
    if first is None or not first.is_write:
        return False
    if schema.name.startswith("aten::_foreach_"):
        return not schema.returns
    return torch.Tag.pointwise in op.tags and schema.name.endswith("_") and len(schema.returns) == 1


@per_op
def cacheable_op(op) -> bool:
    """An aten op whose outputs' shapes, strides and dtypes follow from its inputs' alone: not random, not
    data-dependent, writing into none of its arguments. checked: 2.14.1"""
    if not isinstance(op, torch._ops.OpOverload) or op.namespace != "aten":
        return False
    if any(tag in op.tags for tag in (torch.Tag.dynamic_output_shape, torch.Tag.data_dependent_output,
                                      torch.Tag.inplace_view, torch.Tag.nondeterministic_seeded)):
        return False
    return not any(a.alias_info is not None and a.alias_info.is_write for a in op._schema.arguments)


@per_op
def written_arguments(op) -> tuple[int, ...]:
    """The positions of the arguments an op writes into (x.add_(y): (0,); a foreach op's list too). checked: 2.14.1"""
    if not isinstance(op, torch._ops.OpOverload):
        return ()
    return tuple(i for i, a in enumerate(op._schema.arguments) if a.alias_info is not None and a.alias_info.is_write)


@functools.cache
def value_dependent_shape_errors() -> tuple[type, ...]:
    """FakeTensorMode's errors for an op whose output shape or value it cannot know without data (nonzero,
    masked_select, ...), when it has no shape environment. checked: 2.14.1"""
    from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException

    return DynamicOutputShapeException, DataDependentOutputException


@functools.cache
def fake_tensor_type():
    """torch's FakeTensor class, imported when first asked (it pulls in torch._subclasses). checked: 2.14.1"""
    from torch._subclasses.fake_tensor import FakeTensor

    return FakeTensor


def new_fake_tensor(mode, shape, stride, dtype, device, storage=None, storage_offset: int = 0):
    """A fake tensor as FakeTensorMode's own dispatch cache makes one (fake_tensor.py,
    _get_output_tensor_from_cache_entry): empty on meta, or a view of `storage`.

    FakeTensor.__new__ checks its arguments and sets a dozen attributes through descriptors, the same values every
    time for one mode and device: a prediction makes tens of thousands of outputs, and that was a fifth of each op.
    So the first tensor for a (mode, device) is made by FakeTensor itself, and later ones get what it set (its
    __dict__) on the same C++ wrapping (_make_subclass); tests/predict/emulate/test_fake.py compares the two.
    checked: 2.14.1"""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorConfig

    with torch._C._DisableTorchDispatch():  # explicitly on meta: no mode, no kernel-invocation state needed
        empty = torch.empty_strided(shape, stride, dtype=dtype, device=_META)
        if storage is not None:
            empty.set_(storage, storage_offset, shape, stride)
    known = _FAKE_ATTRIBUTES.get(device)
    if known is None or known[0]() is not mode or FakeTensorConfig.debug:
        made = FakeTensor(mode, empty, device)
        # The mode by weak reference: a finished prediction's mode is not kept alive by the next one's cache. All
        # the attributes in their order, fake_mode's value set for each tensor, so that the order of a tensor's
        # __dict__ is FakeTensor's too.
        _FAKE_ATTRIBUTES[device] = (weakref.ref(mode), {**made.__dict__, "fake_mode": None})
        return made
    made = torch.Tensor._make_subclass(FakeTensor, empty, False, dispatch_device=True,
                                       device_for_backend_keys=device)
    if mode._allow_unsafe_data_ptr_access:
        torch._C._set_warn_deprecated_on_mutable_data_ptr(made)
    else:
        torch._C._set_throw_on_mutable_data_ptr(made)
    attributes = made.__dict__
    attributes.update(known[1])  # in FakeTensor's order, fake_mode among them (None there: the mode is weakly held)
    attributes["fake_mode"] = mode
    return made


# device -> (the mode, weakly; the attributes FakeTensor.__new__ set, in its order, fake_mode None)
_FAKE_ATTRIBUTES: dict[object, tuple[weakref.ref, dict]] = {}
_META = torch.device("meta")


def no_dispatch_modes():
    """Python dispatch modes off for what runs inside (an op with no tensor in or out). checked: 2.14.1"""
    return torch._C._DisableTorchDispatch()


LIFT_FRESH = torch.ops.aten.lift_fresh.default  # torch.tensor(...) under fake mode: a real tensor made fake


def make_adam_state(optimizer) -> bool:
    """Adam's and AdamW's state for every parameter with a gradient, made as their first step makes it, first and
    all of it (Adam._init_group), without the step's arithmetic; False (nothing made) for any other optimizer.
    Older releases' AdamW takes other arguments (2.4's has `amsgrad` third): there, False too, and the warm-up step
    runs instead. checked: 2.14.1"""
    if type(optimizer) not in (torch.optim.Adam, torch.optim.AdamW) or _init_group_arguments(optimizer) != _ADAM_INIT:
        return False
    with torch.no_grad():
        for group in optimizer.param_groups:
            optimizer._init_group(group, [], [], [], [], [], [])
    return True


_ADAM_INIT = ("group", "params_with_grad", "grads", "exp_avgs", "exp_avg_sqs", "max_exp_avg_sqs", "state_steps")


def _init_group_arguments(optimizer) -> tuple[str, ...]:
    return tuple(inspect.signature(optimizer._init_group).parameters)


PRIM_DEVICE = torch.ops.prim.device.default  # a tensor's device, asked through dispatch of a fake tensor


def fake_device(tensor):
    """A fake tensor's device, answered without going down the dispatch modes; None for any other tensor.
    FakeTensorMode answers prim.device with this attribute. checked: 2.14.1"""
    return tensor.fake_device if type(tensor) is fake_tensor_type() else None


def fake_tensor_cache_info():
    """Hits, misses and bypasses of the fake-tensor dispatch cache (shared by every FakeTensorMode in the process)."""
    from torch._subclasses.fake_tensor import FakeTensorMode  # checked: 2.14.1

    return FakeTensorMode.cache_info()


def import_fake_tensor_needs() -> None:
    """Import what FakeTensorMode() imports when first made: torch._dynamo.config, and with it all of torch._dynamo
    (sympy, triton's frontend, FSDP, DTensor). checked: 2.14.1"""
    import torch._dynamo.config  # noqa: F401


def set_fake_tensor_cache(enabled: bool) -> None:
    """Turn the fake-tensor dispatch cache on or off for FakeTensorModes made from now on (on by default)."""
    import torch._dynamo.config  # checked: 2.14.1

    torch._dynamo.config.fake_tensor_cache_enabled = enabled


def unset_fake_temporarily():
    from torch._subclasses.fake_tensor import unset_fake_temporarily as unset  # checked: 2.14.1

    return unset()


def fake_store():
    from torch.testing._internal.distributed.fake_pg import FakeStore  # checked: 2.14.1 (registers backend "fake")

    return FakeStore()


# --- the CUDA caching allocator's history and OOM observer (trackers/cuda.py) -------------------------------------
# torch.cuda.memory._record_memory_history / _snapshot: what pytorch.org/memory_viz reads. Ran on the H200 (torch
# 2.11.0): the runs in results/gpu-runs/ recorded their snapshots through these.
def record_memory_history(**kwargs) -> None:
    torch.cuda.memory._record_memory_history(**kwargs)


def memory_snapshot() -> dict:
    return torch.cuda.memory._snapshot()


def attach_out_of_memory_observer(observer) -> None:
    torch._C._cuda_attach_out_of_memory_observer(observer)


# Labels on the history (torch.cuda.memory._set_memory_metadata: the calling thread's later trace entries carry it as
# user_metadata; _annotate_tensor: an "annotate" entry naming a live block), checked on torch 2.14.1's source (CPU):
# both exist there and are no-ops with backend:cudaMallocAsync. Whether the H200's torch 2.11 had them: not checked.
def history_labels_supported() -> bool:
    memory = torch.cuda.memory
    return (hasattr(memory, "_set_memory_metadata") and hasattr(memory, "_annotate_tensor")
            and memory._memory_metadata_supported())


def set_memory_metadata(text: str) -> None:
    torch.cuda.memory._set_memory_metadata(text)


def annotate_tensor(tensor, text: str) -> None:
    torch.cuda.memory._annotate_tensor(tensor, text)


# --- the end of a backward pass (trackers/modules.py) --------------------------------------------------------------
# The autograd engine runs a queued callback once the current backward finishes: where the module whose backward
# ran last stops owning what is allocated. torch.utils.module_tracker does the same. checked: 2.14.1
def queue_backward_callback(fn) -> None:
    torch.autograd.Variable._execution_engine.queue_callback(fn)


# --- saved-tensor hooks in force (checkpointing's, offloading's): predict/emulate/sdpa.py -----------------------------
# checked: 2.14.1
def saved_tensor_hooks_active() -> bool:
    return torch._C._autograd._top_saved_tensors_default_hooks(False) is not None


# --- capturable optimizers on the CPU that stands for a GPU (predict/run.py) -------------------------------------
# An optimizer made with capturable=True asserts that its parameters are on a device that supports capture
# (torch.optim.optimizer._get_capturable_supported_devices, imported by each optimizer's module); a CUDA prediction's
# parameters are fake CPU tensors standing for CUDA ones. checked: 2.14.1, 2.9.1
@contextlib.contextmanager
def capturable_on_cpu():
    """While active, the CPU counts as a device capturable optimizers support."""
    import torch.optim.optimizer as base

    original = base._get_capturable_supported_devices

    def with_cpu(*args, **kwargs):
        return [*original(*args, **kwargs), "cpu"]

    patched = [m for m in list(sys.modules.values()) if getattr(m, "__name__", "").startswith("torch.optim")
               and getattr(m, "_get_capturable_supported_devices", None) is original]
    for module in patched:
        module._get_capturable_supported_devices = with_cpu
    try:
        yield
    finally:
        for module in patched:
            module._get_capturable_supported_devices = original


# --- clip_grad_norm_'s foreach choice on the CPU that stands for a GPU (predict/run.py) ---------------------------
# clip_grad_norm_(foreach=None) takes _foreach_norm for a device's gradients where
# torch.utils._foreach_utils._has_foreach_support holds: the device supports foreach (the CPU does) and each tensor's
# type is in `_foreach_supported_types` (torch.Tensor; DTensor once torch.distributed.tensor is imported), which
# leaves FakeTensor out: a CUDA prediction would norm each gradient on its own where a CUDA run takes one
# _foreach_norm per device and dtype. checked: 2.14.1
@contextlib.contextmanager
def foreach_takes_fake_tensors():
    """While active, torch's foreach support check counts fake tensors as the plain tensors they stand for."""
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.utils import _foreach_utils

    supported = _foreach_utils._foreach_supported_types
    added = FakeTensor not in supported
    if added:
        supported.append(FakeTensor)
    try:
        yield
    finally:
        if added:
            supported.remove(FakeTensor)


# --- the kernel SDPA picks (benchmarks/gpu_acceptance.py) ------------------------------------------------------------
# checked: 2.14.1 (torch._fused_sdp_choice returns an SDPBackend value)
def sdpa_backend(query, key, value, attn_mask=None, dropout_p: float = 0.0, is_causal: bool = False) -> str:
    """The kernel scaled_dot_product_attention picks for these inputs (torch._fused_sdp_choice, the same choice
    at::scaled_dot_product_attention makes), by torch.nn.attention.SDPBackend's name."""
    from torch.nn.attention import SDPBackend

    choice = torch._fused_sdp_choice(query, key, value, attn_mask, dropout_p, is_causal)
    return next((name for name, b in SDPBackend.__members__.items() if int(b.value) == choice), str(choice))


# checked: 2.14.1, 2.11.0 (at::SDPBackend values, highest priority first); torch 2.4 has no such query: None
def sdp_priority_order() -> list[int] | None:
    """torch's SDPA backend priority order as the process has it (sdpa_kernel(..., set_priority=True) changes it)."""
    query = getattr(torch._C, "_get_sdp_priority_order", None)
    return list(query()) if query is not None else None


@contextlib.contextmanager
def fake_module_moves():
    """Module.to / _apply over fake parameters (peft moves each new adapter to its base layer's device and dtype).
    _apply swaps every FakeTensor parameter for its converted copy (torch.utils.swap_tensors; torch/nn/modules/
    module.py), which refuses a tensor that has a weakref (every nn.Parameter made under FakeTensorMode has one,
    the mode's own) or more than one reference. While active, a fake parameter's data is set instead, as _apply
    moves a real tensor (compute_should_use_set_data): the same new storage, the parameter object kept.
    checked: 2.14.1"""
    swap = torch.utils.swap_tensors

    def swap_or_set(t1, t2):
        if is_fake(t1):
            t1.data = t2.data
            return
        swap(t1, t2)

    torch.utils.swap_tensors = swap_or_set
    try:
        yield
    finally:
        torch.utils.swap_tensors = swap


# --- torch.compile measured on CPU (techniques/compile.py, trackers/compiled.py) --------------------------------
# Inductor's Python wrapper allocates its buffers with torch._C._dynamo.guards._empty_strided_cpu, bound at import
# time as the generated module's global `empty_strided_cpu` (torch/_inductor/codegen/wrapper.py,
# PythonWrapperCodegen.write_header), outside the dispatcher: no dispatch mode sees them. The generated modules are
# loaded through PyCodeCache.load_by_key_path and kept in PyCodeCache.modules (torch/_inductor/codecache.py).
# checked: 2.14.1
INDUCTOR_ALLOCATORS = ("empty_strided_cpu", "empty_strided_cpu_pinned")


@contextlib.contextmanager
def inductor_buffers(seen):
    """While active, seen(tensor) is called with every buffer an Inductor-generated Python wrapper allocates
    through its empty_strided_* globals (those loaded before and those loaded inside); all are put back after."""
    from torch._inductor.codecache import PyCodeCache

    patched: list[tuple[object, str, object]] = []

    def wrap(allocate):
        def allocated(*args, **kwargs):
            tensor = allocate(*args, **kwargs)
            seen(tensor)
            return tensor
        allocated.membench_wraps = allocate
        return allocated

    def patch(module) -> None:
        for name in INDUCTOR_ALLOCATORS:
            allocate = getattr(module, name, None)
            if allocate is not None and not hasattr(allocate, "membench_wraps"):
                patched.append((module, name, allocate))
                setattr(module, name, wrap(allocate))

    load = PyCodeCache.__dict__["load_by_key_path"]

    def load_patched(cls, *args, **kwargs):
        module = load.__func__(cls, *args, **kwargs)
        patch(module)
        return module

    for module in list(PyCodeCache.modules) + list(PyCodeCache.modules_no_attr.values()):
        patch(module)
    PyCodeCache.load_by_key_path = classmethod(load_patched)
    try:
        yield
    finally:
        PyCodeCache.load_by_key_path = load
        for module, name, allocate in reversed(patched):
            setattr(module, name, allocate)


def mode_options(mode: str) -> dict:
    """The Inductor options a torch.compile mode stands for (torch.compile takes a mode or options, never both:
    a mode with options is its options updated). checked: 2.14.1 (torch._inductor.list_mode_options)"""
    from torch._inductor import list_mode_options

    return dict(list_mode_options(mode))


def inductor_option_names() -> set[str]:
    """The options torch.compile(options=...) takes: Inductor's config. checked: 2.14.1"""
    from torch._inductor import list_options

    return set(list_options())


@dataclasses.dataclass(frozen=True)
class CompileCounts:
    """What Dynamo has compiled in this process so far (torch._dynamo.utils: get_compilation_metrics, one entry per
    frame compiled and per backward compiled; counters["graph_break"]). checked: 2.14.1"""

    compilations: int  # frames compiled (a recompiled frame again) and backward graphs compiled
    recompiles: int  # frames compiled again after a guard failed (CompilationMetrics.recompile_reason)
    graph_breaks: int
    seconds: float  # the compilations' own durations, summed (CompilationMetrics.duration_us)
    cache_hits: int  # AOTAutograd's and Inductor's local caches
    cache_misses: int


def compile_counts() -> CompileCounts:
    from torch._dynamo.utils import counters, get_compilation_metrics

    metrics = get_compilation_metrics()
    return CompileCounts(
        compilations=len(metrics),
        recompiles=sum(m.recompile_reason is not None for m in metrics),
        graph_breaks=sum(counters["graph_break"].values()),
        seconds=sum((m.duration_us or 0) for m in metrics) / 1e6,
        cache_hits=sum((m.aotautograd_local_cache_hit_count or 0) + (m.inductor_fx_local_cache_hit_count or 0)
                       for m in metrics),
        cache_misses=sum((m.aotautograd_local_cache_miss_count or 0) + (m.inductor_fx_local_cache_miss_count or 0)
                         for m in metrics))


def partitioning_backend(on_saved):
    """A torch.compile backend that partitions the training graph as Inductor does and runs the two graphs op by op:
    AOTAutograd with Inductor's decompositions (select_decomp_table) and Inductor's own partition function
    (compile_fx.partition_fn: its joint-graph passes, then min_cut_rematerialization_partition with
    compiler="inductor"), as compile_fx hands them to aot_autograd. on_saved([(name, value)]) is called with what
    the forward saves for backward (the backward graph's inputs other than the tangents) when the backward graph is
    made. checked: 2.14.1"""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func
    from torch._inductor.compile_fx import partition_fn
    from torch._inductor.decomposition import select_decomp_table

    def forward(gm, example_inputs):
        return make_boxed_func(gm.forward)

    def backward(gm, example_inputs):
        on_saved([(n.name, n.meta.get("val")) for n in gm.graph.nodes
                  if n.op == "placeholder" and not n.name.startswith("tangents")])
        return make_boxed_func(gm.forward)

    def partition(gm, joint_inputs, **kwargs):
        # Inductor's joint-graph passes read its fake mode from V (compile_fx sets it before aot_autograd runs).
        from torch._guards import detect_fake_mode
        from torch._inductor.virtualized import V

        with V.set_fake_mode(detect_fake_mode(joint_inputs)):
            return partition_fn(gm, joint_inputs, **kwargs)

    return aot_autograd(fw_compiler=forward, bw_compiler=backward, partition_fn=partition,
                        decompositions=select_decomp_table(), keep_inference_input_mutations=True)


def dynamo_reset() -> None:
    """Forget every compiled frame: each prediction compiles its own model (Dynamo's recompile limit, 8 per frame,
    would otherwise send a later prediction's model eager). checked: 2.14.1"""
    torch._dynamo.reset()

