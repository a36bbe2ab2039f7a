"""A model of PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp) for one device, in pure Python.

It follows the public source rule by rule, with the same names where that helps to compare:
round_size, get_allocation_size, get_free_block (best fit by (stream, size, address)), should_split,
alloc_found_block, free_block / try_merge_blocks (coalescing), alloc_block (a new segment: cudaMalloc, or mapping
pages of an expandable segment), release_available_cached_blocks (max_split_size), release_cached_blocks
(empty_cache, and the last retry before an OOM), garbage_collect_cached_blocks, and expandable segments
(find_expandable_block, map_block, unmap_block).

Streams: a block belongs to the stream it was allocated on, free or not, and a request takes only its own
stream's free blocks (c10 keys its pools by stream first); a segment is made for one stream. Not modelled: CUDA
graph private pools, record_stream (it delays a free until events on the other streams complete: feed the free at
the time it completed), cudaMallocAsync, and memory the driver or other processes hold:
`capacity` is the memory cudaMalloc can get, all of it for this allocator; nor the address ranges the driver holds
for itself, which decide where new segments lie (see CachingAllocator and docs/predict.md).
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Callable

from membench.allocator.settings import LARGE_BUFFER, AllocatorSettings

MIN_BLOCK = 512  # every size is rounded up to a multiple of 512 bytes (kMinBlockSize)
SMALL_SIZE = 2**20  # requests up to 1 MiB go to the small pool (kSmallSize)
SMALL_BUFFER = 2 * 2**20  # ... which is made of 2 MiB segments (kSmallBuffer)
MIN_LARGE_ALLOC = 10 * 2**20  # requests from 1 to 10 MiB share a 20 MiB segment (kMinLargeAlloc; large_segment_size_mb)
ROUND_LARGE = 2 * 2**20  # larger requests get a segment of their size rounded up to 2 MiB (kRoundLarge)
_DEFAULT_ADDRESS_SPACE = 2**44  # an expandable segment's virtual size when no capacity is given (never reached)
PLACEMENTS = ("ascending", "top-down")  # where a new segment goes when no released range holds it


class OutOfMemory(Exception):
    """The simulated allocation did not fit under the capacity (or memory fraction), after every release and retry."""


class ExpandableSegment:
    """A virtual address range whose pages (2 MiB small pool, large_segment_size_mb large pool) are mapped on demand."""

    __slots__ = ("base", "size", "page")

    def __init__(self, base: int, size: int, page: int):
        self.base, self.size, self.page = base, size, page


class Block:
    __slots__ = ("ptr", "size", "requested", "allocated", "prev", "next", "pool", "stream", "mapped", "segment",
                 "gc_base")

    def __init__(self, ptr: int, size: int, pool: Pool, stream: int, mapped: bool = True,
                 segment: ExpandableSegment | None = None):
        self.ptr, self.size, self.pool, self.stream = ptr, size, pool, stream
        self.requested, self.allocated = 0, False
        self.prev: Block | None = None
        self.next: Block | None = None
        self.mapped, self.segment, self.gc_base = mapped, segment, 0

    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None

    def splice(self, before: Block | None, after: Block | None) -> None:
        if before:
            before.next = self
        self.prev = before
        if after:
            after.prev = self
        self.next = after

    def __repr__(self) -> str:
        state = "allocated" if self.allocated else "free" if self.mapped else "unmapped"
        return f"Block({self.ptr:#x}, {self.size}, {state})"


class Pool:
    """Free blocks ordered by (stream, size, address), as c10's BlockPool (a std::set with BlockComparatorSize)."""

    def __init__(self, is_small: bool):
        self.is_small = is_small
        self.keys: list[tuple[int, int, int]] = []  # sorted (stream, size, ptr) of the free mapped blocks
        self.blocks: dict[tuple[int, int, int], Block] = {}
        self.unmapped_keys: list[tuple[int, int]] = []  # sorted (stream, ptr): expandable address space not mapped
        self.unmapped: dict[tuple[int, int], Block] = {}
        self.get_free_blocks_call_count = 0  # the clock of garbage collection's block ages

    def insert(self, block: Block) -> None:
        key = (block.stream, block.size, block.ptr)
        bisect.insort(self.keys, key)
        self.blocks[key] = block
        block.gc_base = self.get_free_blocks_call_count

    def remove(self, block: Block) -> None:
        key = (block.stream, block.size, block.ptr)
        del self.blocks[key]
        del self.keys[bisect.bisect_left(self.keys, key)]

    def insert_unmapped(self, block: Block) -> None:
        key = (block.stream, block.ptr)
        bisect.insort(self.unmapped_keys, key)
        self.unmapped[key] = block

    def remove_unmapped(self, block: Block) -> None:
        key = (block.stream, block.ptr)
        del self.unmapped[key]
        del self.unmapped_keys[bisect.bisect_left(self.unmapped_keys, key)]


@dataclasses.dataclass
class SegmentEvent:
    """A change of reserved memory: 'alloc'/'free' of a cudaMalloc segment, 'map'/'unmap' of expandable pages."""

    action: str
    address: int
    size: int
    at_malloc: int  # how many malloc calls had started when it happened (the one causing it included)


def round_size(size: int, settings: AllocatorSettings) -> int:
    """The block size a request gets: a multiple of 512 B, or a power-of-two division (roundup_power2_divisions)."""
    if size < MIN_BLOCK:
        return MIN_BLOCK
    divisions = settings.divisions_for(size)
    if divisions > 1 and size > MIN_BLOCK * divisions:
        return _roundup_power2_next_division(size, divisions)
    return -(-size // MIN_BLOCK) * MIN_BLOCK


def _roundup_power2_next_division(size: int, divisions: int) -> int:
    # e.g. 1200 B with 4 divisions: [1024, 1280, 1536, 1792] -> 1280
    if size & (size - 1) == 0:
        return size
    floor = 1 << (size.bit_length() - 1)
    step = floor >> (divisions.bit_length() - 1)
    if step == 0:
        return floor << 1
    rounded = size & ~(step - 1)
    return size if rounded == size else rounded + step


def get_allocation_size(size: int, large_segment: int = LARGE_BUFFER) -> int:
    """The size of the segment cudaMalloc'ed when no cached block fits a (rounded) request; `large_segment` is
    large_segment_size_mb's (20 MiB by default: AcceleratorAllocatorConfig::large_segment_size(), torch 2.14)."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return large_segment
    return -(-size // ROUND_LARGE) * ROUND_LARGE


class CachingAllocator:
    """One device's caching allocator. malloc(size) -> Block, free(block), empty_cache().

    `capacity` (bytes) is the device memory: cudaMalloc fails beyond it; without it cudaMalloc never fails.
    `memory_fraction` is torch.cuda.set_per_process_memory_fraction: the allocator itself then refuses to reserve
    more than fraction x capacity, and only then does garbage_collection_threshold act (as in PyTorch).
    `segment_address(size)` may choose where a new cudaMalloc segment lies (the driver's choice, which only breaks
    ties between free blocks of equal size); where it returns None, or offers memory still held, or is not given,
    the simulator places it as the traces' driver did: address-ordered first fit, at the lowest address range that
    this allocator released (cudaFree of a segment) and that is big enough, else after everything handed out so far
    (so, without releases, one after another, ascending). See docs/predict.md, "Where the driver puts segments".
    `placement` "top-down" puts a new segment that no released range holds below everything handed out so far
    instead: the driver of the H200 runs in results/gpu-runs/ (and of the six public snapshots) placed new segments
    below the earlier ones, so among equal-size free blocks the allocator's best fit takes the newest segment's.
    """

    def __init__(self, settings: AllocatorSettings | None = None, capacity: int | None = None,
                 segment_address: Callable[[int], int | None] | None = None, memory_fraction: float | None = None,
                 placement: str = "ascending"):
        if placement not in PLACEMENTS:
            raise ValueError(f"placement is one of {', '.join(PLACEMENTS)}, got {placement!r}")
        self.settings = settings or AllocatorSettings()
        self.placement = placement
        self.capacity = capacity
        if memory_fraction is not None and (capacity is None or not 0 < memory_fraction <= 1):
            raise ValueError(f"a memory fraction needs a capacity and lies in (0, 1], got {memory_fraction}")
        # allowed_memory_maximum in c10, set only by a memory fraction
        self.allowed = int(memory_fraction * capacity) if memory_fraction is not None else None
        self.small, self.large = Pool(True), Pool(False)
        self._next_address = 2**40
        self._lowest_address = 2**60  # top-down: the lowest address handed out so far
        self._released: list[tuple[int, int]] = []  # sorted, coalesced (address, size) ranges cudaFree gave back
        self._chooser = segment_address
        self.reserved = self.allocated = 0
        self.peak_reserved = self.peak_allocated = 0
        # The requests behind the allocated blocks, each rounded up to 512 B (kMinBlockSize) as a storage tracker
        # rounds it: what account.py holds against the tracker's live bytes; its peak counts from reset_peak too.
        self.requested = self.peak_requested = 0
        self.allocated_at_peak_reserved = self.reserved_at_peak_allocated = 0
        # Reserved memory by the stream whose pool holds it (a segment serves the stream it was made for), now and
        # at the peak of reserved.
        self.reserved_by_stream: dict[int, int] = {}
        self.reserved_by_stream_at_peak: dict[int, int] = {}
        self.num_alloc_retries = self.mallocs = 0
        self.segment_log: list[SegmentEvent] = []
        self.live_segments: dict[int, int] = {}  # base address -> size of every cudaMalloc'ed segment held
        self._max_split = self.settings.max_split_size if self.settings.max_split_size is not None else 2**64
        self._gc = self.settings.garbage_collection_threshold > 0 and self.allowed is not None

    # --- addresses -------------------------------------------------------------------------------------------
    def _bump_address(self, size: int) -> int:
        if self.placement == "top-down":
            self._lowest_address -= -(-size // ROUND_LARGE) * ROUND_LARGE
            return self._lowest_address
        address = self._next_address
        self._next_address += -(-size // ROUND_LARGE) * ROUND_LARGE
        return address

    def _new_address(self, size: int) -> int:
        address = self._chooser(size) if self._chooser else None
        if address is None or any(a < address + size and address < a + s for a, s in self.live_segments.items()):
            return self._first_fit(size)
        self._next_address = max(self._next_address, -(-(address + size) // ROUND_LARGE) * ROUND_LARGE)
        self._lowest_address = min(self._lowest_address, address)
        self._take_released(address, address + size)
        return address

    def _first_fit(self, size: int) -> int:
        """The driver's placement seen in the traces: the lowest released range that holds the segment (2 MiB
        granules), else the end of the address space used so far (top-down: below its start; where a top-down
        driver reuses released ranges no run here shows, as none released a segment)."""
        span = -(-size // ROUND_LARGE) * ROUND_LARGE
        for address, free in self._released:
            if free >= span:
                self._take_released(address, address + span)
                return address
        return self._bump_address(size)

    def _take_released(self, start: int, end: int) -> None:
        kept = []
        for address, free in self._released:
            if address < end and start < address + free:  # overlaps: keep what lies outside [start, end)
                kept += [(address, start - address)] if address < start else []
                kept += [(end, address + free - end)] if end < address + free else []
            else:
                kept.append((address, free))
        self._released = kept

    def _give_back_range(self, address: int, size: int) -> None:
        """cudaFree: the segment's range (whole 2 MiB granules) can be handed out again, merged with its free
        neighbours."""
        start, end = address, address + -(-size // ROUND_LARGE) * ROUND_LARGE
        kept = []
        for a, free in self._released:
            if a + free == start:
                start = a
            elif a == end:
                end = a + free
            else:
                kept.append((a, free))
        bisect.insort(kept, (start, end - start))
        self._released = kept

    # --- the public operations ---------------------------------------------------------------------------------
    def reset_peak(self) -> None:
        """torch.cuda.reset_peak_memory_stats(): the peaks start again from what is held now. Where reserved still
        stands at its peak (nothing released since), the peak is that same one, and what was allocated when it was
        reached (fragmentation_at_peak_bytes' moment) stays."""
        if self.reserved != self.peak_reserved:
            self.peak_reserved, self.allocated_at_peak_reserved = self.reserved, self.allocated
            self.reserved_by_stream_at_peak = dict(self.reserved_by_stream)
        self.peak_allocated, self.reserved_at_peak_allocated = self.allocated, self.reserved
        self.peak_requested = self.requested

    def malloc(self, orig_size: int, stream: int = 0) -> Block:
        self.mallocs += 1
        size = round_size(orig_size, self.settings)
        pool = self.small if size <= SMALL_SIZE else self.large
        alloc_size = get_allocation_size(size, self.settings.large_segment_size)
        block = self._get_free_block(pool, stream, size)
        if block is None:
            if self._gc:
                self._garbage_collect_cached_blocks()
            block = self._alloc_block(pool, stream, size, alloc_size, retry=False)
            if block is None and self._release_available_cached_blocks(pool, stream, size):
                block = self._alloc_block(pool, stream, size, alloc_size, retry=False)
            if block is None:
                self._release_cached_blocks()
                block = self._alloc_block(pool, stream, size, alloc_size, retry=True)
            if block is None:
                limit = self.capacity if self.allowed is None else self.allowed
                raise OutOfMemory(f"cannot allocate {alloc_size} B: {self.reserved} B reserved of {limit} B")
        block = self._alloc_found_block(block, size, orig_size, self._should_split(block, size))
        if self.reserved > self.peak_reserved:
            self.peak_reserved, self.allocated_at_peak_reserved = self.reserved, self.allocated
            self.reserved_by_stream_at_peak = dict(self.reserved_by_stream)
        if self.allocated > self.peak_allocated:
            self.peak_allocated, self.reserved_at_peak_allocated = self.allocated, self.reserved
        self.requested += -(-orig_size // MIN_BLOCK) * MIN_BLOCK
        if self.requested > self.peak_requested:
            self.peak_requested = self.requested
        return block

    def free(self, block: Block) -> None:
        if not block.allocated:
            raise ValueError(f"{block!r} is not allocated")
        block.allocated = False
        self.allocated -= block.size
        self.requested -= -(-block.requested // MIN_BLOCK) * MIN_BLOCK
        self._free_block(block)

    def empty_cache(self) -> None:
        """torch.cuda.empty_cache(): release every cached segment that is entirely free."""
        self._release_cached_blocks()

    def add_segment(self, address: int, size: int, is_small: bool, allocated: list[tuple[int, int, int]],
                    stream: int = 0) -> list[Block]:
        """Put an existing cudaMalloc'ed segment in the state (to start from a snapshot's state).

        `allocated` lists its blocks in use as (address, size, requested size); the gaps between them are free
        blocks. Returns the allocated blocks, in the order given.
        """
        pool = self.small if is_small else self.large
        cursor, prev, pieces = address, None, []
        for ptr, block_size, requested in sorted(allocated):
            if ptr < cursor or ptr + block_size > address + size:
                raise ValueError(f"block {ptr:#x}+{block_size} does not fit segment {address:#x}+{size}")
            if ptr > cursor:
                pieces.append((cursor, ptr - cursor, None))
            pieces.append((ptr, block_size, requested))
            cursor = ptr + block_size
        if cursor < address + size:
            pieces.append((cursor, address + size - cursor, None))
        by_ptr = {}
        for ptr, block_size, requested in pieces:
            block = Block(ptr, block_size, pool, stream)
            block.splice(prev, None)
            prev = block
            if requested is None:
                pool.insert(block)
            else:
                block.allocated, block.requested = True, requested
                self.allocated += block_size
                self.requested += -(-requested // MIN_BLOCK) * MIN_BLOCK
                by_ptr[ptr] = block
        self._reserve(stream, size)
        self.live_segments[address] = size
        self._next_address = max(self._next_address, -(-(address + size) // ROUND_LARGE) * ROUND_LARGE)
        self._lowest_address = min(self._lowest_address, address)
        if self.reserved > self.peak_reserved:
            self.peak_reserved, self.allocated_at_peak_reserved = self.reserved, self.allocated
            self.reserved_by_stream_at_peak = dict(self.reserved_by_stream)
        if self.allocated > self.peak_allocated:
            self.peak_allocated, self.reserved_at_peak_allocated = self.allocated, self.reserved
        self.peak_requested = max(self.peak_requested, self.requested)
        return [by_ptr[ptr] for ptr, _, _ in allocated]

    # --- finding and splitting blocks --------------------------------------------------------------------------
    def _get_free_block(self, pool: Pool, stream: int, size: int) -> Block | None:
        if self._gc:
            pool.get_free_blocks_call_count += 1
        keys = pool.keys
        i = bisect.bisect_left(keys, (stream, size, 0))
        if i == len(keys) or keys[i][0] != stream:
            return None
        block = pool.blocks[keys[i]]
        if block.segment is not None:
            # Best fit counts an expandable block at the size it can grow to (its unmapped neighbour included).
            def expandable_size(b: Block) -> int:
                return b.size + (b.next.size if b.next is not None and not b.next.mapped else 0)
            while (block.segment is not None and i + 1 < len(keys) and keys[i + 1][0] == stream
                   and expandable_size(pool.blocks[keys[i + 1]]) < expandable_size(block)):
                i += 1
                block = pool.blocks[keys[i]]
        # An oversize block (>= max_split_size) serves only oversize requests, and only ones it exceeds by less
        # than max_non_split_rounding (20 MiB by default).
        if size < self._max_split and block.size >= self._max_split:
            return None
        if size >= self._max_split and block.size >= size + self.settings.max_non_split_rounding:
            return None
        pool.remove(block)
        return block

    def _should_split(self, block: Block, size: int) -> bool:
        remaining = block.size - size
        if block.pool.is_small or self.settings.expandable_segments:
            return remaining >= MIN_BLOCK
        # Large pool: keep a remainder of 1 MiB or less inside the block, never split an oversize request.
        return size < self._max_split and remaining > SMALL_SIZE

    def _alloc_found_block(self, block: Block, size: int, orig_size: int, split: bool) -> Block:
        if split:
            remaining = block
            block = Block(remaining.ptr, size, remaining.pool, remaining.stream, segment=remaining.segment)
            block.splice(remaining.prev, remaining)
            remaining.ptr += size
            remaining.size -= size
            remaining.pool.insert(remaining)
        block.allocated, block.requested = True, orig_size
        self.allocated += block.size
        return block

    def _free_block(self, block: Block) -> None:
        pool = block.pool
        for neighbour in (block.prev, block.next):
            self._try_merge_blocks(block, neighbour, pool)
        pool.insert(block)

    def _try_merge_blocks(self, dst: Block, src: Block | None, pool: Pool) -> int:
        if src is None or src.allocated or src.mapped != dst.mapped:
            return 0
        if src.mapped:
            pool.remove(src)
        else:
            pool.remove_unmapped(src)
        if dst.prev is src:  # [src dst]
            dst.ptr = src.ptr
            dst.prev = src.prev
            if dst.prev:
                dst.prev.next = dst
        else:  # [dst src]
            dst.next = src.next
            if dst.next:
                dst.next.prev = dst
        dst.size += src.size
        return src.size

    # --- getting memory from the device and giving it back ------------------------------------------------------
    def _reserve(self, stream: int, size: int) -> None:
        """Reserved memory changes by `size` bytes (negative: released), held by `stream`'s pool."""
        self.reserved += size
        self.reserved_by_stream[stream] = self.reserved_by_stream.get(stream, 0) + size
    def _alloc_block(self, pool: Pool, stream: int, size: int, alloc_size: int, retry: bool) -> Block | None:
        if retry:
            self.num_alloc_retries += 1
        if self.allowed is not None and self.reserved + alloc_size > self.allowed:
            return None  # over the memory fraction: refused before asking the device
        if self.settings.expandable_segments:
            return self._try_allocate_expandable_block(pool, stream, size)
        if self.capacity is not None and self.reserved + alloc_size > self.capacity:
            return None  # cudaMalloc: the device is full
        address = self._new_address(alloc_size)
        self._reserve(stream, alloc_size)
        self.live_segments[address] = alloc_size
        self.segment_log.append(SegmentEvent("alloc", address, alloc_size, self.mallocs))
        return Block(address, alloc_size, pool, stream)

    def _release_block(self, block: Block) -> None:
        self.segment_log.append(SegmentEvent("free", block.ptr, block.size, self.mallocs))
        self._reserve(block.stream, -block.size)
        del self.live_segments[block.ptr]
        self._give_back_range(block.ptr, block.size)
        block.pool.remove(block)

    def _release_available_cached_blocks(self, pool: Pool, stream: int, size: int) -> bool:
        """With max_split_size: free one oversize cached segment big enough, else the largest ones until enough."""
        if self.settings.max_split_size is None:
            return False
        key_size = max(size, self._max_split)
        keys = pool.keys
        i = bisect.bisect_left(keys, (stream, key_size, 0))
        if i < len(keys) and keys[i][0] == stream:
            block = pool.blocks[keys[i]]
            if block.segment is None:
                self._release_block(block)
                return True
            return False
        released = 0
        i -= 1
        while i >= 0 and released < key_size:
            block = pool.blocks[keys[i]]
            if block.size < self._max_split or block.stream != stream or block.segment is not None:
                break
            released += block.size
            self._release_block(block)  # removes keys[i]; the next candidate is keys[i - 1]
            i -= 1
        return released >= key_size

    def _release_cached_blocks(self) -> None:
        for pool in (self.large, self.small):
            to_unmap = []
            for key in list(pool.keys):
                block = pool.blocks[key]
                if block.segment is not None:
                    to_unmap.append(block)
                elif not block.is_split():
                    self._release_block(block)
            for block in to_unmap:
                self._unmap_block(block)
                if not block.is_split():  # the whole expandable segment is unmapped: give its addresses back
                    pool.remove_unmapped(block)

    def _garbage_collect_cached_blocks(self) -> None:
        """garbage_collection_threshold: above threshold x allowed memory, free the cached segments unused longest."""
        threshold = int(self.settings.garbage_collection_threshold * self.allowed)
        if self.reserved <= threshold:
            return
        target, reclaimed = self.reserved - threshold, 0
        pool = self.large
        clock = pool.get_free_blocks_call_count
        freeable = [pool.blocks[k] for k in pool.keys if not pool.blocks[k].is_split()]
        total_age, count = sum(clock - b.gc_base for b in freeable), len(freeable)
        freed = True
        while reclaimed < target and freed and count > 0:
            age_threshold = total_age / count  # free the blocks at least as old as the average first
            freed = False
            for key in list(pool.keys):
                block = pool.blocks[key]
                age = clock - block.gc_base
                if not block.is_split() and block.segment is None and age >= age_threshold:
                    freed = True
                    reclaimed += block.size
                    total_age -= age
                    count -= 1
                    self._release_block(block)

    # --- expandable segments ---------------------------------------------------------------------------------
    def _find_expandable_block(self, pool: Pool, stream: int, size: int) -> Block:
        """The lowest-address run of free and unmapped blocks with `size` bytes, or a new segment's space."""
        def allocatable(b: Block | None) -> bool:
            return b is not None and not b.allocated

        def has_space(b: Block | None) -> bool:
            total = 0
            while total < size and allocatable(b):
                total += b.size
                b = b.next
            return total >= size

        i = bisect.bisect_left(pool.unmapped_keys, (stream, 0))
        while i < len(pool.unmapped_keys) and pool.unmapped_keys[i][0] == stream:
            candidate = pool.unmapped[pool.unmapped_keys[i]]
            if allocatable(candidate.prev):
                candidate = candidate.prev
            if has_space(candidate):
                return candidate
            i += 1
        page = SMALL_BUFFER if pool.is_small else self.settings.large_segment_size
        total = self.capacity or _DEFAULT_ADDRESS_SPACE
        space = -(-(total + total // 8) // page) * page  # c10 reserves 9/8 of the device's memory
        segment = ExpandableSegment(self._bump_address(space), space, page)
        candidate = Block(segment.base, space, pool, stream, mapped=False, segment=segment)
        pool.insert_unmapped(candidate)
        return candidate

    def _map_block(self, block: Block, size: int) -> bool:
        seg = block.segment
        begin = (block.ptr - seg.base) // seg.page
        end = -(-(block.ptr + size - seg.base) // seg.page)
        mapped = (end - begin) * seg.page
        if self.capacity is not None and self.reserved + mapped > self.capacity:
            return False  # cuMemCreate: out of memory
        pool = block.pool
        pool.remove_unmapped(block)
        block.mapped = True
        if mapped < block.size:
            rest = Block(block.ptr + mapped, block.size - mapped, pool, block.stream, mapped=False, segment=seg)
            rest.splice(block, block.next)
            pool.insert_unmapped(rest)
            block.size = mapped
        self._try_merge_blocks(block, block.prev, pool)
        self._try_merge_blocks(block, block.next, pool)
        pool.insert(block)
        self._reserve(block.stream, mapped)
        self.segment_log.append(SegmentEvent("map", seg.base + begin * seg.page, mapped, self.mallocs))
        return True

    def _try_allocate_expandable_block(self, pool: Pool, stream: int, size: int) -> Block | None:
        candidate = self._find_expandable_block(pool, stream, size)
        if not candidate.mapped and not self._map_block(candidate, min(candidate.size, size)):
            return None
        while candidate.size < size:  # free -> unmapped -> ...: map more pages after it (they merge into it)
            following = candidate.next
            if following is None:  # larger than the segment's whole address range: no device holds it
                return None
            if not self._map_block(following, min(size - candidate.size, following.size)):
                return None
            candidate = following
        pool.remove(candidate)
        return candidate

    def _unmap_block(self, block: Block) -> None:
        """Unmap the whole pages inside a free expandable block; partial pages stay mapped as free blocks."""
        seg, pool = block.segment, block.pool
        begin = -(-(block.ptr - seg.base) // seg.page)
        end = (block.ptr + block.size - seg.base) // seg.page
        if begin >= end:
            return
        start, length = seg.base + begin * seg.page, (end - begin) * seg.page
        pool.remove(block)
        before = start - block.ptr
        if before > 0:
            head = Block(block.ptr, before, pool, block.stream, segment=seg)
            head.splice(block.prev, block)
            pool.insert(head)
        after = block.size - before - length
        if after > 0:
            tail = Block(start + length, after, pool, block.stream, segment=seg)
            tail.splice(block, block.next)
            pool.insert(tail)
        block.ptr, block.size, block.mapped = start, length, False
        self._try_merge_blocks(block, block.prev, pool)
        self._try_merge_blocks(block, block.next, pool)
        pool.insert_unmapped(block)
        self._reserve(block.stream, -length)
        self.segment_log.append(SegmentEvent("unmap", start, length, self.mallocs))
