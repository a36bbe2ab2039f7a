"""Results held against a baseline: `check` (the CI memory gate), `compare` (two folders side by side) and the
pytest plugin (`memory_peak`, --membench-save / --membench-compare)."""
