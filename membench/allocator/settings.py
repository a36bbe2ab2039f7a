"""PYTORCH_CUDA_ALLOC_CONF, parsed once, into the settings the simulator uses.

The syntax and the checks follow c10's AllocatorConfig::parseArgs (PyTorch's public source): comma-separated
`key:value` pairs, spaces ignored, `roundup_power2_divisions` either one number or a list `[256:4,512:2,>:1]` whose keys
are sizes in MiB. Options that do not change device memory (pinned host memory, lock release) are accepted and ignored,
so that a user's real setting string can be pasted as it is.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

from membench.common.errors import UserError

MiB = 2**20
#: "large" requests of 1-10 MiB share 20 MiB segments; also the smallest max_split_size and the default
#: max_non_split_rounding (c10: kLargeBuffer).
LARGE_BUFFER = 20 * MiB
#: roundup_power2_divisions has one entry per power-of-two interval from 1 MiB ([1, 2) MiB) to 32 GiB and above.
ROUNDUP_INTERVALS = 16

_VALID = ("max_split_size_mb, max_non_split_rounding_mb, garbage_collection_threshold, roundup_power2_divisions, "
          "expandable_segments, backend, release_lock_on_cudamalloc, pinned_use_cuda_host_register, "
          "pinned_num_register_threads, pinned_use_background_threads")
_IGNORED = {"release_lock_on_cudamalloc", "release_lock_on_hipmalloc", "pinned_use_cuda_host_register",
            "pinned_use_hip_host_register", "pinned_num_register_threads", "pinned_use_background_threads",
            "pinned_reserve_segment_size_mb", "graph_capture_record_stream_reuse"}


@dataclasses.dataclass(frozen=True)
class AllocatorSettings:
    """The caching allocator's options that change device memory. Sizes in bytes; None = unlimited."""

    max_split_size: int | None = None
    max_non_split_rounding: int = LARGE_BUFFER
    garbage_collection_threshold: float = 0.0
    roundup_power2_divisions: tuple[int, ...] = (0,) * ROUNDUP_INTERVALS
    expandable_segments: bool = False
    text: str = ""  # what the user wrote, for tables

    def label(self) -> str:
        """What the user wrote, or the same settings in PYTORCH_CUDA_ALLOC_CONF syntax, or 'default'."""
        if self.text:
            return self.text
        parts = []
        if self.max_split_size is not None:
            parts.append(f"max_split_size_mb:{self.max_split_size // MiB}")
        if self.max_non_split_rounding != LARGE_BUFFER:
            parts.append(f"max_non_split_rounding_mb:{self.max_non_split_rounding // MiB}")
        if self.garbage_collection_threshold:
            parts.append(f"garbage_collection_threshold:{self.garbage_collection_threshold}")
        if any(self.roundup_power2_divisions):
            pairs = ",".join(f"{2**k}:{d}" for k, d in enumerate(self.roundup_power2_divisions))
            parts.append(f"roundup_power2_divisions:[{pairs}]")
        if self.expandable_segments:
            parts.append("expandable_segments:True")
        return ",".join(parts) or "default"

    def divisions_for(self, size: int) -> int:
        """The roundup_power2_divisions entry for a request: by its power-of-two interval, starting at 1 MiB."""
        index = min(max(size.bit_length() - 1 - 20, 0), ROUNDUP_INTERVALS - 1)
        return self.roundup_power2_divisions[index]


def _fail(text: str, why: str) -> UserError:
    shown = text if len(text) <= 80 else text[:80] + "..."
    return UserError(f"cannot read allocator settings {shown!r}: {why} (PYTORCH_CUDA_ALLOC_CONF syntax, e.g. "
                     f"'expandable_segments:True,max_split_size_mb:128'; options: {_VALID})")


def _tokens(text: str) -> list[str]:
    # c10's lexArgs: ',', ':', '[' and ']' are tokens of their own, spaces vanish.
    return [t for t in re.split(r"([,:\[\]])", text.replace(" ", "")) if t]


def _int(text: str, tok: str, what: str) -> int:
    if not re.fullmatch(r"[0-9]+", tok):
        raise _fail(text, f"{what} must be a whole number, got {tok[:40]!r}")
    if len(tok) > 18:  # more than any byte count or division could be, and past what int() reads past 4300 digits
        raise _fail(text, f"{what} is a number of {len(tok)} digits: at most 18")
    return int(tok)


def _power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _bool(text: str, tok: str, key: str) -> bool:
    if tok not in ("True", "False"):
        raise _fail(text, f"{key} takes True or False, got {tok[:40]!r}")
    return tok == "True"


def parse_alloc_conf(text: str | None) -> AllocatorSettings:
    """'expandable_segments:True,max_split_size_mb:128' -> AllocatorSettings. Raises UserError on bad input."""
    text = (text or "").strip()
    toks = _tokens(text)
    values: dict = {}
    i = 0

    def expect(tok: str) -> None:
        nonlocal i
        if i >= len(toks) or toks[i] != tok:
            raise _fail(text, f"expected {tok[:40]!r} after {toks[i - 1][:40]!r}" if i else f"expected {tok[:40]!r}")
        i += 1

    def value(key: str) -> str:
        nonlocal i
        expect(":")
        if i >= len(toks) or toks[i] in ",:[]":
            raise _fail(text, f"{key} needs a value")
        i += 1
        return toks[i - 1]

    while i < len(toks):
        key = toks[i]
        i += 1
        if key == "max_split_size_mb" or key == "max_non_split_rounding_mb":
            mb = _int(text, value(key), key)
            if mb < LARGE_BUFFER // MiB:
                raise _fail(text, f"{key} must be >= {LARGE_BUFFER // MiB}, got {mb}")
            values["max_split_size" if key == "max_split_size_mb" else "max_non_split_rounding"] = mb * MiB
        elif key == "garbage_collection_threshold":
            raw = value(key)
            try:
                threshold = float(raw)
            except ValueError:
                raise _fail(text, f"{key} must be a number, got {raw[:40]!r}") from None
            if not 0.0 < threshold < 1.0:
                raise _fail(text, f"{key} must be between 0.0 and 1.0 (exclusive), got {raw[:40]}")
            values["garbage_collection_threshold"] = threshold
        elif key == "roundup_power2_divisions":
            expect(":")
            values["roundup_power2_divisions"], i = _parse_divisions(text, toks, i)
        elif key == "expandable_segments":
            values["expandable_segments"] = _bool(text, value(key), key)
        elif key == "backend":
            backend = value(key)
            if backend != "native":
                raise _fail(text, f"only the native caching allocator is simulated, not backend {backend!r}")
        elif key in _IGNORED:
            value(key)  # host-side options: they do not change device memory
        else:
            raise _fail(text, f"unknown option {key!r}")
        if i < len(toks):
            expect(",")
    return AllocatorSettings(text=text, **values)


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
            # '>' sets this interval and every larger one
            divisions[last_index:] = [n] * (ROUNDUP_INTERVALS - last_index)
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
