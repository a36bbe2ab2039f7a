"""A table wider than 120 columns is folded into tables that fit, each headed by the run."""

from __future__ import annotations

from membench.report.table import WIDTH, fold, tabulated

# The header and rows of a real sweep's table (mypkg.bench:my_model at batch 32 on CPU), 124 columns wide as one.
HEADERS = ["run", "status", "peak alloc B", "vs base", "peak phase", "step ms ±", "samples/s", "speed vs base",
           "equivalence"]
BODY = [["baseline", "ok", "38,232,500", "+0.0%", "optimizer", "217.3 ±5.8%", "147", "reference", "reference"],
        ["accum", "ok", "38,232,512", "+0.0%", "optimizer", "168.8 ±21.1%", "190", "undecided (-30.2%)",
         "equivalent"],
        ["opt-in-bwd", "ok", "38,209,936", "-0.1%", "backward", "151.4 ±1.3%", "211", "within noise (+0.1%)",
         "bitwise"]]


def widest(headers, body) -> int:
    return max(len(line) for line in tabulated(headers, body).splitlines())


def test_a_table_over_the_width_is_folded_into_tables_that_fit_each_headed_by_the_run():
    assert widest(HEADERS, BODY) > WIDTH  # tabulate pads each header by two: 124 columns
    parts = fold(HEADERS, BODY)
    assert len(parts) == 2
    assert all(h[0] == "run" and [r[0] for r in b] == ["baseline", "accum", "opt-in-bwd"] for h, b in parts)
    assert all(widest(h, b) <= WIDTH for h, b in parts)
    assert [c for h, _ in parts for c in h[1:]] == HEADERS[1:]  # every column once, in order


def test_a_table_that_fits_is_one():
    assert fold(HEADERS[:4], [row[:4] for row in BODY]) == [(HEADERS[:4], [row[:4] for row in BODY])]
