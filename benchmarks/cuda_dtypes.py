"""Which ops' outputs CUDA makes in another dtype or shape than the CPU: torch's own meta kernels, compared.

FakeTensorMode runs an op's meta kernel for the fake tensor's device, and a fake tensor on device "cuda" needs no
GPU: so each op of torch's OpInfo database (torch.testing._internal.common_methods_invocations.op_db), on each of its
sample inputs in float16, bfloat16 and float32, runs once on fake "cpu" tensors and once on fake "cuda" ones, and
the outputs' dtypes and shapes are compared. A CUDA prediction runs the CPU's kernels on fake CPU tensors, so every
op printed here needs predict/emulate/dtypes.py to follow CUDA (or is not a training op). Ops that fail on one
device only are listed apart (sparse and linear-algebra ops without a meta kernel for one of them).

    python benchmarks/cuda_dtypes.py [--samples N]

Needs `expecttest` (torch's test utilities import it: `pip install --target DIR expecttest`, DIR on PYTHONPATH).
With torch 2.14.1 on the shared 2-core CPU machine, the same comparison over all samples (50,437, in 23 minutes
under load) found native_layer_norm, native_batch_norm, _native_batch_norm_legit and _batch_norm_with_update: their
saved statistics are fp32 on CUDA under 16-bit input. The other differences were errors on one device only
(sparse ops, geqrf, histogram, grid_sample in fp16, and fp32 _batch_norm_with_update, whose CUDA fake kernel asks
cuDNN, which needs a GPU). With `--samples 2` (2-core machine, 10-36 s each): torch 2.14.1 and 2.11.0 found the
same four; 2.9.1 and 2.6.0 the first three (their _batch_norm_with_update's CUDA fake kernel fails in fp16 too);
2.4.1 only the two batch norms: its fake native_layer_norm keeps the statistics in the input's dtype on either
device, so it cannot tell what its CUDA kernel does (predict/emulate/versions.py keeps 2.11 and 2.14 as checked).
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings

import torch


def _outputs(op, sample, device: str):
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._pytree import tree_flatten, tree_map

    mode = FakeTensorMode()

    def fake(x):
        if isinstance(x, torch.Tensor):
            return mode.fake_tensor_converter.from_meta_and_device(mode, x.to("meta"), torch.device(device))
        return x

    try:
        args, kwargs = tree_map(fake, sample.args), tree_map(fake, sample.kwargs)
        first = tree_map(fake, sample.input)
        with mode:
            out = op.op(first, *args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - an op this device's meta kernel refuses is reported, not fatal
        return f"error: {type(exc).__name__}"
    return [(t.dtype, tuple(t.shape)) for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=None, help="sample inputs per op and dtype (default: all)")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    try:
        from torch.testing._internal.common_methods_invocations import op_db
    except ImportError as exc:
        print(f"torch's OpInfo database cannot be imported here ({exc}): pip install expecttest")
        return 0
    started, compared = time.time(), 0
    differ: dict[str, tuple] = {}
    one_sided: dict[str, tuple] = {}
    for op in op_db:
        for dtype in (torch.float16, torch.bfloat16, torch.float32):
            if dtype not in op.supported_dtypes("cpu"):
                continue
            try:
                samples = list(op.sample_inputs("cpu", dtype, requires_grad=False))[:args.samples]
            except Exception:  # noqa: BLE001,S112 - an op whose samples cannot be made on this machine
                continue
            for sample in samples:
                cpu, cuda = _outputs(op, sample, "cpu"), _outputs(op, sample, "cuda")
                compared += 1
                if cpu != cuda:
                    where = one_sided if isinstance(cpu, str) or isinstance(cuda, str) else differ
                    where.setdefault(op.name, (str(dtype).removeprefix("torch."), cpu, cuda))
    took = time.time() - started
    print(f"torch {torch.__version__}: {compared} samples of {len(op_db)} ops compared in {took:.0f} s")
    print("\noutputs that differ (op, input dtype, cpu's, cuda's):")
    for name, (dtype, cpu, cuda) in differ.items():
        print(f"  {name} ({dtype}): cpu {cpu}; cuda {cuda}")
    print("\nan error on one device only:")
    for name, (dtype, cpu, cuda) in one_sided.items():
        print(f"  {name} ({dtype}): cpu {cpu if isinstance(cpu, str) else 'ok'}; "
              f"cuda {cuda if isinstance(cuda, str) else 'ok'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
