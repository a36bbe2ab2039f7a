from membench.techniques.base import Technique


class ExpandableSegments(Technique):
    """Trades nothing numeric: the CUDA caching allocator maps growable segments instead of fixed blocks, so
    memory freed in one size class serves another and reserved memory stays closer to allocated (less
    fragmentation). Set for the run's own process only; meaningless on CPU, which has no caching allocator.
    """

    name = "expandable-segments"
    summary = "CUDA allocator's expandable segments: less fragmentation (reserved closer to allocated)"
    devices = ("cuda",)
    env = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
