"""What torch.compile compiled during a run, from Dynamo's own counts (private.compile_counts): how long, how many
graphs, graph breaks and recompiles, and whether any compilation fell after the warm-up (into measured or timed
steps, which should run compiled code only)."""

from __future__ import annotations

from membench import private
from membench.results import Compiled

# reduce-overhead's CUDA graphs keep their memory in a private pool of the caching allocator: blocks that serve only
# the graphs' replays (torch/_inductor/cudagraph_trees.py, graph_pool_handle), beside the usual segments.
CUDA_GRAPH_POOL = ("reduce-overhead: CUDA graphs replay from a private pool of the caching allocator, segments that "
                   "serve only the graphs (torch/_inductor/cudagraph_trees.py); reserved memory counts them, and "
                   "their tensors outlive the step that made them until the next replay")
CPU_NO_GRAPHS = "reduce-overhead on CPU: no CUDA graphs (Inductor skips cudagraphs for CPU tensors): as default"


class Watch:
    """Dynamo's counts at a run's start, after its warm-up and at its end; the differences are the run's."""

    def __init__(self, spec):
        self.spec = spec
        self.start = private.compile_counts()
        self.warm = self.start

    def warmed_up(self) -> Compiled:
        self.warm = private.compile_counts()
        return self._compiled(self.warm)

    def done(self) -> Compiled:
        return self._compiled(private.compile_counts())

    def _compiled(self, now: private.CompileCounts) -> Compiled:
        start, spec = self.start, self.spec
        note = None
        if spec.compile_mode == "reduce-overhead":
            note = CUDA_GRAPH_POOL if spec.device == "cuda" else CPU_NO_GRAPHS
        since = {f: getattr(now, f) - getattr(start, f) for f in
                 ("compilations", "recompiles", "graph_breaks", "cache_hits", "cache_misses")}
        return Compiled(mode=spec.compile_mode, options=spec.compile_options, compile_s=now.seconds - start.seconds,
                        after_warmup=now.compilations - self.warm.compilations, memory_note=note, **since)
