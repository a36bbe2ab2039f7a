"""The ground floor, imported by everything and importing nothing else of membench: errors, files written
atomically (`fsio`), the JSON <-> dataclass converter (`typedjson`), units, and the names results use (`vocab`)."""
