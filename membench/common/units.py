"""Bytes and seconds are stored; these helpers only format and parse them for people (GiB = 2**30)."""

import math
import re

from membench.common.errors import UserError

_UNITS = {"": 1, "b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
          "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}


def parse_bytes(text: str) -> int:
    """'24GiB' -> 25769803776. Decimal units (GB) are 10**9, binary units (GiB) 2**30."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise UserError(f"cannot read {text!r} as a size: use a number with a unit such as 512MiB, 24GiB or 16GB")
    number, unit = m.group(1), _UNITS[m.group(2).lower()]
    if len(number) > 40:  # 400 digits would be inf as a float, and far beyond any memory
        raise UserError(f"size {text[:40]!r}... is too large to be a size in bytes")
    # Whole numbers stay integers: through a float, 9223372036854775807 B would read as 2**63.
    value = int(number) * unit if number.isdigit() else int(float(number) * unit)
    if value <= 0:
        raise UserError(f"size {text!r} must be positive")
    return value


def fmt_bytes(nbytes: float | None) -> str:
    if nbytes is None:
        return "-"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(nbytes) >= size:
            return f"{nbytes / size:.2f} {unit}"
    return f"{int(nbytes)} B"


def fmt_number(value: float | None) -> str:
    """A rate as people read it: three significant digits, thousands separated ('14,900', '351', '0.0123')."""
    if value is None:
        return "-"
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    digits = math.floor(math.log10(abs(value)))
    if digits >= 2:
        return f"{round(value, 2 - digits):,.0f}"
    return f"{value:.{2 - digits}f}"


def fmt_duration(seconds: float) -> str:
    """'0.4 s', '42 s', '7 min 36 s', '1 h 05 min'."""
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 59.5:
        return f"{seconds:.0f} s"
    minutes, s = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {s:02d} s"
    return f"{minutes // 60} h {minutes % 60:02d} min"


def pct_change(new: float, old: float) -> float:
    """The change from old to new, in percent of old."""
    return (new / old - 1) * 100


UNITS = (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10), ("B", 1))


def unit_for(values) -> tuple[str, int]:
    """The largest binary unit in which the largest magnitude among `values` is at least 1 (B for small ones)."""
    top = max((abs(v) for v in values if v is not None), default=0)
    return next(((u, s) for u, s in UNITS if top >= s), UNITS[-1])


class ByteFormat:
    """One unit and one number of decimals for a whole table, picked from the values it shows: a table of
    kilobyte-sized peaks reads in KiB, not as 0.001 GiB everywhere, and values that differ are shown differing."""

    def __init__(self, values, min_decimals: int = 2, max_decimals: int = 4):
        values = [v for v in values if v is not None]
        self.unit, self.scale = unit_for(values)
        self.decimals = 0
        if self.scale > 1:
            distinct = set(values)
            self.decimals = next((d for d in range(min_decimals, max_decimals + 1)
                                  if len({round(v / self.scale, d) for v in distinct}) == len(distinct)), None)
            if self.decimals is None:  # values a few bytes apart: only whole bytes tell them apart
                self.unit, self.scale, self.decimals = "B", 1, 0

    def __call__(self, nbytes: float | None, sign: bool = False) -> str:
        if nbytes is None:
            return "-"
        return format(nbytes / self.scale, f"{'+' if sign else ''}{',' if self.scale == 1 else ''}.{self.decimals}f")

    def with_unit(self, nbytes: float | None, sign: bool = False) -> str:
        return "-" if nbytes is None else f"{self(nbytes, sign)} {self.unit}"


def fmt_bytes_apart(*values: float) -> tuple[str, ...]:
    """Byte values one sentence sets side by side ('from X to Y'): in one unit, and printed differently whenever
    they differ (38,232,500 B and 38,232,512 B are both '36.46 MiB' to fmt_bytes)."""
    fmt = ByteFormat(values)
    return tuple(fmt.with_unit(v) for v in values)
