"""What the `memory_peak` fixture measured of one block: kept apart from the fixture (membench/gate/peak.py, which
imports torch) so that the pytest plugin reads and writes baselines without importing torch."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Measurement:
    """One measured block: its peak (bytes), make-up by category and, with model=, by module."""

    name: str
    peak_bytes: int = 0
    breakdown: dict[str, int] = field(default_factory=dict)
    top_modules: list[tuple[str, str, int]] = field(default_factory=list)

    def as_json(self) -> dict:
        return {"peak_bytes": self.peak_bytes, "breakdown": self.breakdown,
                "top_modules": [{"module": m, "category": c, "bytes": b} for m, c, b in self.top_modules]}
