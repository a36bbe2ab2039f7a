"""The storage tracker for a compiled step: compiled code runs compiled under it, and every buffer Inductor's
generated code allocates is counted.

Under a dispatch mode Dynamo runs compiled code eager (torch/_dynamo/convert_frame.py skips the frame), unless the
mode says `ignore_compile_internals()`: then the mode is off while Dynamo, AOTAutograd and Inductor compile, and on
while the compiled code runs (torch/utils/_python_dispatch.py). The compiled code's extern kernels (mm with out=)
and fallback ops still go through the dispatcher and reach the mode; its own buffers do not: Inductor's Python
wrapper allocates them with `empty_strided_cpu`, a C++ function outside the dispatcher (private.inductor_buffers
hooks it). A buffer reused in place (`buf3 = buf0; del buf0  # reuse`) is one storage, counted once; a buffer
freed (`del buf0`) is freed through the tracker's weakref finalizer, as any storage is.

Not counted, as on any CPU run: scratch a kernel keeps outside tensors (Inductor's C++ kernels' local buffers,
like eager kernels' own). Inside a compiled region no module hooks run (they are traced away:
trackers/modules.py), so its memory belongs to the module that called it.
"""

from __future__ import annotations

from membench import private
from membench.trackers.storage import StorageTracker


class CompiledStorageTracker(StorageTracker):
    """A StorageTracker under which torch.compile'd code runs compiled, its buffers counted."""

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True

    def __enter__(self):
        self._buffers = private.inductor_buffers(self.track)
        self._buffers.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            self._buffers.__exit__(None, None, None)
