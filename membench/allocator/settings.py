"""PYTORCH_CUDA_ALLOC_CONF, parsed once, into the settings the simulator uses.

The syntax, the keys and the checks follow torch 2.14's own parsers, which read the same string one after the
other: c10's AcceleratorAllocatorConfig::parseArgs (c10/core/AllocatorConfig.cpp: the device-generic keys) and
CUDAAllocatorConfig::parseArgs (c10/cuda/CUDAAllocatorConfig.cpp: the CUDA ones); each refuses a key neither knows.
Comma-separated `key:value` pairs, white space ignored, `roundup_power2_divisions` either one number or a list
`[256:4,512:2,>:1]` whose keys are sizes in MiB. `large_segment_size_mb` is read first, whatever its place: it sets
the segment that 1-10 MiB requests share (20 MiB by default), the default `max_non_split_rounding_mb` and the
smallest `max_split_size_mb` / `max_non_split_rounding_mb` allowed. Options that do not change device memory
(pinned host memory, locks, graph capture) are checked and ignored, so that a user's real setting string can be
pasted as it is. tests/test_alloc_settings.py holds every case against c10's own parser where torch has one.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Literal

from membench.common.errors import UserError

MiB = 2**20
#: "large" requests of 1-10 MiB share segments of this size unless large_segment_size_mb says otherwise; also the
#: default max_non_split_rounding and the smallest max_split_size (c10: kLargeBuffer, large_segment_size()).
LARGE_BUFFER = 20 * MiB
#: requests from this size on get a segment of their own (c10: kMinLargeAlloc); large_segment_size_mb must exceed it.
MIN_LARGE_ALLOC = 10 * MiB
#: roundup_power2_divisions has one entry per power-of-two interval from 1 MiB ([1, 2) MiB) to 32 GiB and above.
ROUNDUP_INTERVALS = 16
#: torch 2.14's limit on pinned_num_register_threads (CUDAAllocatorConfig::pinned_max_register_threads).
MAX_REGISTER_THREADS = 128

Backend = Literal["native", "cudaMallocAsync"]

# What each key takes, by kind: the keys that change device memory have their own branch in parse_alloc_conf.
_BOOLEAN = ("expandable_segments", "pinned_use_background_threads", "release_lock_on_cudamalloc",
            "release_lock_on_hipmalloc", "pinned_use_cuda_host_register", "pinned_use_hip_host_register",
            "graph_capture_record_stream_reuse", "pinned_free_catch_all", "throw_on_cudamalloc_oom")
_HOST_SIZES = ("pinned_max_round_threshold_mb", "pinned_max_cached_size_mb")  # any whole number (MiB)
_VALID = ("large_segment_size_mb, max_split_size_mb, max_non_split_rounding_mb, garbage_collection_threshold, "
          "roundup_power2_divisions, expandable_segments, backend, per_process_memory_fraction, and the host-side "
          "ones: pinned_*, release_lock_on_cudamalloc, ...")


@dataclasses.dataclass(frozen=True)
class AllocatorSettings:
    """The caching allocator's options that change device memory. Sizes in bytes; None = unlimited."""

    max_split_size: int | None = None
    max_non_split_rounding: int = LARGE_BUFFER
    garbage_collection_threshold: float = 0.0
    roundup_power2_divisions: tuple[int, ...] = (0,) * ROUNDUP_INTERVALS
    expandable_segments: bool = False
    large_segment_size: int = LARGE_BUFFER  # the segment 1-10 MiB requests share (large_segment_size_mb)
    per_process_memory_fraction: float = 1.0  # as torch.cuda.set_per_process_memory_fraction, from the start
    backend: Backend = "native"  # cudaMallocAsync: CUDA's own pool, which the simulator does not model
    text: str = ""  # what the user wrote, for tables

    def label(self) -> str:
        """What the user wrote, or the same settings in PYTORCH_CUDA_ALLOC_CONF syntax, or 'default'."""
        if self.text:
            return self.text
        parts = []
        if self.backend != "native":
            parts.append(f"backend:{self.backend}")
        if self.large_segment_size != LARGE_BUFFER:
            parts.append(f"large_segment_size_mb:{self.large_segment_size // MiB}")
        if self.max_split_size is not None:
            parts.append(f"max_split_size_mb:{self.max_split_size // MiB}")
        if self.max_non_split_rounding != self.large_segment_size:
            parts.append(f"max_non_split_rounding_mb:{self.max_non_split_rounding // MiB}")
        if self.garbage_collection_threshold:
            parts.append(f"garbage_collection_threshold:{self.garbage_collection_threshold}")
        if any(self.roundup_power2_divisions):
            pairs = ",".join(f"{2**k}:{d}" for k, d in enumerate(self.roundup_power2_divisions))
            parts.append(f"roundup_power2_divisions:[{pairs}]")
        if self.expandable_segments:
            parts.append("expandable_segments:True")
        if self.per_process_memory_fraction != 1.0:
            parts.append(f"per_process_memory_fraction:{self.per_process_memory_fraction}")
        return ",".join(parts) or "default"

    def divisions_for(self, size: int) -> int:
        """The roundup_power2_divisions entry for a request: by its power-of-two interval, starting at 1 MiB."""
        index = min(max(size.bit_length() - 1 - 20, 0), ROUNDUP_INTERVALS - 1)
        return self.roundup_power2_divisions[index]


def _fail(text: str, why: str) -> UserError:
    shown = text if len(text) <= 80 else text[:80] + "..."
    return UserError(f"cannot read allocator settings {shown!r}: {why} (PYTORCH_CUDA_ALLOC_CONF syntax, e.g. "
                     f"'expandable_segments:True'; torch 2.14's options: {_VALID})")


def _tokens(text: str) -> list[str]:
    # c10's ConfigTokenizer: ',', ':', '[' and ']' are tokens of their own, white space vanishes.
    return [t for t in re.split(r"([,:\[\]])", re.sub(r"\s", "", text)) if t]


def _int(text: str, tok: str, what: str) -> int:
    if not re.fullmatch(r"[0-9]+", tok):
        raise _fail(text, f"{what} must be a whole number, got {tok[:40]!r}")
    if len(tok) > 18:  # more than any byte count or division could be, and past what int() reads past 4300 digits
        raise _fail(text, f"{what} is a number of {len(tok)} digits: at most 18")
    return int(tok)


def _float(text: str, tok: str, what: str) -> float:
    if len(tok) > 40 or not re.fullmatch(r"[0-9.eE+-]+", tok):
        raise _fail(text, f"{what} must be a number, got {tok[:40]!r}")
    try:
        return float(tok)
    except ValueError:
        raise _fail(text, f"{what} must be a number, got {tok!r}") from None


def _power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _bool(text: str, tok: str, key: str) -> bool:
    if tok not in ("True", "False"):
        raise _fail(text, f"{key} takes True or False, got {tok[:40]!r}")
    return tok == "True"


class _Reader:
    """The tokens of one settings string, read as c10's parsers read them."""

    def __init__(self, text: str):
        self.text, self.toks, self.i = text, _tokens(text), 0

    def more(self) -> bool:
        return self.i < len(self.toks)

    def key(self) -> str:
        self.i += 1
        return self.toks[self.i - 1]

    def expect(self, tok: str) -> None:
        toks, i = self.toks, self.i
        if i >= len(toks) or toks[i] != tok:
            raise _fail(self.text, f"expected {tok!r} after {toks[i - 1][:40]!r}" if i else f"expected {tok!r}")
        self.i += 1

    def value(self, key: str) -> str:
        self.expect(":")
        if self.i >= len(self.toks) or self.toks[self.i] in (",", ":", "[", "]"):
            raise _fail(self.text, f"{key} needs a value")
        self.i += 1
        return self.toks[self.i - 1]

    def separator(self) -> None:
        if self.more():
            self.expect(",")


def parse_alloc_conf(text: str | None) -> AllocatorSettings:
    """'expandable_segments:True,max_split_size_mb:128' -> AllocatorSettings. Raises UserError on bad input."""
    text = (text or "").strip()
    values: dict = {}
    # First, as c10 does, large_segment_size_mb wherever it is: the other sizes are checked against it.
    first = _Reader(text)
    for at, tok in enumerate(first.toks):
        if tok == "large_segment_size_mb":
            first.i = at + 1
            mb = _int(text, first.value(tok), tok)
            if mb <= MIN_LARGE_ALLOC // MiB:
                raise _fail(text, f"{tok} must be > {MIN_LARGE_ALLOC // MiB}, got {mb}")
            values["large_segment_size"] = mb * MiB
    large = values.get("large_segment_size", LARGE_BUFFER)
    values["max_non_split_rounding"] = large
    reader = _Reader(text)
    while reader.more():
        key = reader.key()
        if key == "large_segment_size_mb":
            reader.value(key)
        else:
            _parse_key(reader, key, values, large)
        reader.separator()
    return AllocatorSettings(text=text, **values)


def _parse_key(reader: _Reader, key: str, values: dict, large: int) -> None:
    """One key's value into `values` (the device-memory ones), or checked and dropped (the others)."""
    text = reader.text
    if key in ("max_split_size_mb", "max_non_split_rounding_mb"):
        mb = _int(text, reader.value(key), key)
        if mb < large // MiB:
            raise _fail(text, f"{key} must be >= {large // MiB} (large_segment_size_mb), got {mb}")
        values["max_split_size" if key == "max_split_size_mb" else "max_non_split_rounding"] = mb * MiB
    elif key in ("garbage_collection_threshold", "per_process_memory_fraction"):
        raw = reader.value(key)
        number = _float(text, raw, key)
        if key == "garbage_collection_threshold" and not 0.0 < number < 1.0:
            raise _fail(text, f"{key} must be between 0.0 and 1.0 (exclusive), got {raw[:40]}")
        if key == "per_process_memory_fraction" and not 0.0 <= number <= 1.0:
            raise _fail(text, f"{key} must be between 0.0 and 1.0, got {raw[:40]}")
        values[key] = number
    elif key == "roundup_power2_divisions":
        reader.expect(":")
        values[key], reader.i = _parse_divisions(text, reader.toks, reader.i)
    elif key == "backend":
        backend = reader.value(key)
        if backend not in ("native", "cudaMallocAsync"):
            raise _fail(text, f"backend must be native or cudaMallocAsync, got {backend[:40]!r}")
        values["backend"] = backend
    elif key in _BOOLEAN:
        flag = _bool(text, reader.value(key), key)
        if key == "expandable_segments":
            values[key] = flag
    elif key in _HOST_SIZES:
        _int(text, reader.value(key), key)  # host memory: no change to the device's
    elif key == "pinned_num_register_threads":
        n = _int(text, reader.value(key), key)
        if not _power_of_two(n) or n > MAX_REGISTER_THREADS:
            raise _fail(text, f"{key} must be a power of 2 up to {MAX_REGISTER_THREADS}, got {n}")
    elif key == "pinned_reserve_segment_size_mb":
        if _int(text, reader.value(key), key) == 0:
            raise _fail(text, f"{key} must be greater than 0")
    elif key == "expandable_segments_handle_type":  # named by torch 2.14's own error message, refused by its parser
        raise _fail(text, f"{key} is not an option torch 2.14 reads (its parser refuses it too)")
    else:
        raise _fail(text, f"unknown option {key[:40]!r}")


def _parse_divisions(text: str, toks: list[str], i: int) -> tuple[tuple[int, ...], int]:
    """roundup_power2_divisions: one power of two for every size, or [MiB:divisions, ..., >:divisions]."""
    if i >= len(toks):
        raise _fail(text, "roundup_power2_divisions needs a value")
    divisions = [0] * ROUNDUP_INTERVALS
    if toks[i] != "[":
        n = _int(text, toks[i], "roundup_power2_divisions")
        if not _power_of_two(n):
            raise _fail(text, f"roundup_power2_divisions must be a power of 2, got {n}")
        return (n,) * ROUNDUP_INTERVALS, i + 1
    i += 1
    first, last_index = True, 0
    while i < len(toks) and toks[i] != "]":
        size_tok = toks[i]
        if i + 2 >= len(toks) or toks[i + 1] != ":":
            raise _fail(text, f"expected MiB:divisions in the roundup_power2_divisions list at {size_tok!r}")
        n = _int(text, toks[i + 2], "roundup_power2_divisions")
        if n != 0 and not _power_of_two(n):
            raise _fail(text, f"roundup_power2_divisions must be a power of 2 or 0, got {n}")
        if size_tok == ">":
            # '>' sets every interval after the entry before it (torch >= 2.8: last_index + 1)
            divisions[last_index + 1:] = [n] * (ROUNDUP_INTERVALS - last_index - 1)
        else:
            mb = _int(text, size_tok, "a roundup_power2_divisions interval")
            if not _power_of_two(mb):
                raise _fail(text, f"roundup_power2_divisions intervals must be powers of 2 (MiB), got {mb}")
            index = min(mb.bit_length() - 1, ROUNDUP_INTERVALS - 1)
            if first:  # the first entry also covers every smaller interval
                divisions[:index] = [n] * index
                first = False
            divisions[index] = n
            last_index = index
        i += 3
        if i < len(toks) and toks[i] == ",":
            i += 1
    if i >= len(toks):
        raise _fail(text, "the roundup_power2_divisions list has no closing ']'")
    return tuple(divisions), i + 1


def settings_from_snapshot(recorded: dict | None) -> AllocatorSettings:
    """The settings a snapshot says it was recorded with (`allocator_settings`, torch >= 2.6); default without it."""
    if not isinstance(recorded, dict):
        return AllocatorSettings()
    conf = recorded.get("PYTORCH_CUDA_ALLOC_CONF")
    if isinstance(conf, str) and conf.strip():
        return parse_alloc_conf(conf)
    # Older snapshots, or settings made with torch.cuda.memory._set_allocator_settings: use the parsed fields.
    split = recorded.get("max_split_size", -1)
    gc = recorded.get("garbage_collection_threshold", 0.0) or 0.0
    if not isinstance(gc, (int, float)) or isinstance(gc, bool) or not 0.0 <= gc < 1.0:
        raise UserError(f"the snapshot's allocator_settings hold garbage_collection_threshold {str(gc)[:40]!r}: "
                        "expected a number from 0.0 up to (not including) 1.0")
    div = recorded.get("roundup_power2_divisions") or {}
    divisions = tuple(div.get(str(2**k), 0) for k in range(ROUNDUP_INTERVALS)) if isinstance(div, dict) \
        else (0,) * ROUNDUP_INTERVALS
    if not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d <= 2**16 for d in divisions):
        raise UserError(f"the snapshot's allocator_settings hold roundup_power2_divisions {str(div)[:80]}: "
                        "expected whole numbers from 0 to 65536 by size")
    return AllocatorSettings(
        max_split_size=None if not isinstance(split, int) or split < 0 or split >= 2**63 else split,
        garbage_collection_threshold=float(gc), roundup_power2_divisions=divisions,
        expandable_segments=bool(recorded.get("expandable_segments", False)))


def settings_from_env(env: Mapping[str, str]) -> AllocatorSettings:
    """The settings a process started with this environment runs with: its PYTORCH_CUDA_ALLOC_CONF, or default.

    For a membench run that is with_allocator_env(os.environ, stack.env): the user's own setting plus the
    techniques' (the expandable-segments technique adds expandable_segments:True; a later key wins, as in PyTorch).
    """
    # CUDAAllocatorConfig's order (c10/cuda/CUDAAllocatorConfig.h, torch 2.14): the CUDA name, else the generic one.
    return parse_alloc_conf(env.get("PYTORCH_CUDA_ALLOC_CONF") or env.get("PYTORCH_ALLOC_CONF", ""))


# The CUDA allocator's settings go by two names, and torch reads them in different orders: since 2.9
# AcceleratorAllocatorConfig prefers PYTORCH_ALLOC_CONF ("PYTORCH_CUDA_ALLOC_CONF is also supported with lower
# priority", c10/core/AllocatorConfig.h), CUDAAllocatorConfig::instance() reads PYTORCH_CUDA_ALLOC_CONF first
# (c10/cuda/CUDAAllocatorConfig.h, 2.14). A setting made under one name only is ignored wherever the other is set.
ALLOC_CONF = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")


def with_allocator_env(base: Mapping[str, str], extra: Mapping[str, str]) -> dict[str, str]:
    """`base` (an environment) with `extra` (a stack's variables) added: allocator settings to the user's own."""
    env = dict(base)
    for key, value in extra.items():
        # Allocator settings are comma-separated lists: add ours to what the user already set, under both names
        # (each keeps what the user set under it, else under the other name).
        names = ALLOC_CONF if key in ALLOC_CONF else (key,)
        user = {name: env.get(name) for name in names}
        for name in names:
            theirs = user[name] or next((user[n] for n in names if user[n]), None)
            env[name] = f"{theirs},{value}" if theirs else value
    return env
