"""The comparison table: each run's peak and throughput, and the change against the baseline.

One table per sweep: runs of different sweeps never share a "vs base" column. Memory is shown in one unit per
table, picked from its magnitudes; step times with their noise; the speed against the baseline only as the
interleaved timing measured it (report/noise.py), with the same percentage the sentences give. Columns with
nothing to show are left out, and a table wider than WIDTH is folded into several, each headed by the run.
"""

from __future__ import annotations

import textwrap

from tabulate import tabulate

from membench.common.units import ByteFormat, fmt_bytes, fmt_number, pct_change
from membench.common.vocab import CATEGORIES
from membench.report import noise
from membench.report.explain import breakdown
from membench.report.words import speed_cell
from membench.results import RunRecord
from membench.results.sweep import Sweep

WIDTH = 120  # columns of a terminal or a code block: a wider table is folded
OPTIONAL = ("reserved", "step ms ±", "throughput", "speed vs base", "equivalence")  # left out when all "-"


def equivalence_text(r: RunRecord) -> str:
    eq = r.equivalence
    if eq is None:
        return "-"
    return eq.verdict + (f" (apart from {eq.apart_from})" if eq.apart_from else "")


def reference_note(sweep: Sweep) -> str | None:
    """Why there are no deltas, when the baseline cannot be the reference."""
    base = sweep.baseline
    if base is None:
        return "no baseline in these results: absolute numbers only"
    if base.status == "ok" and base.memory is None:
        return ("the baseline's result says ok but holds no memory (a damaged or edited file): no change against it "
                "is shown (absolute numbers only)")
    if base.status != "ok":
        return (f"the baseline did not finish ({base.status}): its numbers are partial and cannot be a reference, "
                "so no change against it is shown (absolute numbers only)")
    return None


def _row(r: RunRecord, sweep: Sweep, mem: ByteFormat) -> dict[str, str]:
    m, t, ref = r.memory, r.timing, sweep.reference
    finished = r.status == "ok" and m is not None
    return {
        "run": r.name,
        "status": r.status,
        "peak": mem(m.peak_allocated_bytes) if m else "-",
        "vs base": f"{pct_change(m.peak_allocated_bytes, ref.peak):+.1f}%" if finished and ref else "-",
        "peak phase": (m.peak_phase if m else None) or "-",
        "reserved": mem(m.peak_reserved_bytes) if m else "-",
        "step ms ±": noise.step_ms(t),
        "throughput": fmt_number(t.throughput) if t and t.throughput else "-",
        "speed vs base": speed_cell(noise.speed(r)) if finished and ref and t else "-",
        "equivalence": equivalence_text(r),
    }


def rows(sweep: Sweep) -> tuple[list[str], list[list[str]]]:
    """The table of one sweep: headers and one row per run (columns with nothing to show left out)."""
    mem = ByteFormat([v for r in sweep.runs if r.memory for v in (r.memory.peak_allocated_bytes,
                                                                   r.memory.peak_reserved_bytes)])
    cells = [_row(r, sweep, mem) for r in sweep.runs]
    keys = [k for k in cells[0] if k not in OPTIONAL or any(c[k] != "-" for c in cells)]
    unit = next((r.timing.unit for r in sweep.runs if r.timing and r.timing.unit), "samples/s")
    predicted = "predicted " if sweep.predicted else ""
    names = {"peak": f"{predicted or 'peak '}alloc {mem.unit}", "reserved": f"{predicted}reserved {mem.unit}",
             "throughput": unit}
    return [names.get(k, k) for k in keys], [[c[k] for k in keys] for c in cells]


def notes(sweep: Sweep) -> list[str]:
    """What the table's cells cannot say: a missing reference, what `speed vs base` is, runs not compared."""
    said = [reference_note(sweep)]
    ref = sweep.reference
    speeds = {r.name: noise.speed(r) for r in sweep.finished if r.timing and not r.is_baseline and ref}
    if any(s.interval for s in speeds.values()):
        said.append("speed vs base: the throughput change against the baseline, both timed in alternation in the "
                    "run's own process [its interval]; within noise where the interval holds no change")
    if any(s.verdict == "undecided" for s in speeds.values()):
        said.append(f"undecided: a large change inside a wide interval; {noise.RERUN}")
    said += [f"{name}: speed not compared ({s.why_not})" for name, s in speeds.items() if s.verdict == "not-compared"]
    said += [compiled_note(r) for r in sweep.finished if r.compiled is not None and not r.predicted]
    said += [f"{name}: {s.why_not}" for name, s in speeds.items() if s.verdict == "not-enough"]
    said += [above_baseline(r, ref) for r in sweep.finished if ref is not None and r is not ref]
    return [s for s in said if s]


def compiled_note(r: RunRecord) -> str:
    """A compiled run (techniques/compile.py): what Dynamo compiled, and what its memory figures mean."""
    c = r.compiled
    late = (f"; {c.after_warmup} compiled after the warm-up, inside the measured or timed steps"
            if c.after_warmup else "; all in the warm-up")
    return (f"{r.name}: torch.compile mode {c.mode}{', options ' + c.options if c.options else ''}: "
            f"{c.compilations} compilation(s), {c.graph_breaks} graph break(s), {c.recompiles} recompile(s){late}"
            + (f"; {c.memory_note}" if c.memory_note else ""))


def _backends(r: RunRecord) -> dict[str, str]:
    """A CUDA prediction's attention kernels: backend -> why the faster ones were refused."""
    attention = r.memory.attention if r.memory else None
    return {site.backend: "; ".join(site.refused) for site in (attention.sites if attention else [])}


def above_baseline(r: RunRecord, ref: RunRecord) -> str | None:
    """Why a prediction is above the baseline where the record says why: the attention kernel the GPU falls back to
    (bf16 on a T4 runs the math path, which holds the whole score matrix). None otherwise."""
    m, b = r.memory, ref.memory
    if not r.predicted or m is None or b is None:
        return None
    above = [what for what, mine, base in (("allocated", m.peak_allocated_bytes, b.peak_allocated_bytes),
                                           ("reserved", m.peak_reserved_bytes, b.peak_reserved_bytes))
             if mine is not None and base is not None and mine > base]
    mine, base = _backends(r), _backends(ref)
    new = [k for k in mine if k not in base]
    if not above or not new:
        return None
    rule = r.memory.attention.rule
    return (f"{r.name}: predicted above the baseline ({' and '.join(above)}): its attention runs the {new[0]} kernel "
            f"({mine[new[0]]}; {rule}), where the baseline's runs {', '.join(base) or 'none'}")


def fold(headers: list[str], body: list[list[str]], width: int = WIDTH) -> list[tuple[list[str], list[list[str]]]]:
    """The table as several, each headed by the first column, when it is wider than `width` as tabulate's
    "simple" format lays it out (measured on its output: tabulate pads headers as well as cells)."""
    def wide(take: list[int]) -> int:
        text = tabulated([headers[i] for i in take], [[row[i] for i in take] for row in body])
        return max(len(line) for line in text.splitlines())

    parts, columns = [], list(range(1, len(headers)))
    while columns:
        take = [0]
        for c in columns:
            if len(take) > 1 and wide(take + [c]) > width:
                break
            take.append(c)
        parts.append(([headers[i] for i in take], [[row[i] for i in take] for row in body]))
        columns = columns[len(take) - 1:]
    return parts or [(headers, body)]


MARKDOWN_FORMATS = frozenset({"github", "pipe"})
# Markdown renders raw HTML and links: text from result files (names, workloads, errors) is shown, never run.
_MARKDOWN_INERT = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;", "[": "\\[", "]": "\\]"})


def inert_markdown(text: object) -> str:
    """Text as markdown shows it and nothing more: no HTML element (`<script>`), no link (`[x](javascript:)`)."""
    return str(text).translate(_MARKDOWN_INERT)


def tabulated(headers: list[str], body: list[list[str]], fmt: str = "simple") -> str:
    """A table as text; cells are already formatted (numbers as strings: tabulate must not re-read them)."""
    return tabulate(body, headers=headers, tablefmt=fmt, disable_numparse=True)


def render_parts(title: str, headers: list[str], body: list[list[str]], said: list[str], fmt: str = "simple") -> str:
    """One sweep's table under its title, folded to WIDTH in a terminal, with its notes."""
    parts = fold(list(headers), [list(r) for r in body]) if fmt not in MARKDOWN_FORMATS else [(headers, body)]
    text = "\n\n".join(tabulated(list(h), [list(r) for r in b], fmt) for h, b in parts)
    lines = [f"{title}:", text] + [textwrap.fill(f"note: {n}", WIDTH, subsequent_indent="  ") for n in said]
    return "\n".join(lines)


def render_sweep(sweep: Sweep, fmt: str = "simple") -> str:
    headers, body = rows(sweep)
    return render_parts(sweep.title(), headers, body, notes(sweep), fmt)


def join_tables(tables: list[str], fmt: str = "simple") -> str:
    """Tables of several sweeps, with a note that they are never compared."""
    if len(tables) > 1:
        tables = [*tables, f"note: {len(tables)} sweeps (different workload, batch size or device) are shown apart; "
                           "runs are only compared within a sweep"]
    text = "\n\n".join(tables)
    return inert_markdown(text) if fmt in MARKDOWN_FORMATS else text


def render(sweeps: list[Sweep], fmt: str = "simple") -> str:
    """One table per sweep, each titled; a note when there are several, which are never compared."""
    return join_tables([render_sweep(s, fmt) for s in sweeps], fmt)


BREAKDOWN_HEADERS = ["run", "peak", "peak phase"] + [c.replace("_", " ") for c in CATEGORIES]


def breakdown_rows(sweep: Sweep) -> list[list[str]]:
    """Each run's peak and its make-up by category (one unit for the table), the table that explains the peak."""
    fmt = ByteFormat([r.peak for r in sweep.runs] + [v for r in sweep.runs for v in (breakdown(r) or {}).values()],
                     max_decimals=2)
    body = []
    for r in sweep.runs:
        parts = breakdown(r) or {}
        body.append([r.name, fmt.with_unit(r.peak), (r.memory.peak_phase if r.memory else None) or "-"]
                    + [fmt.with_unit(parts[c]) if c in parts else "-" for c in CATEGORIES])
    return body


def module_phrase(m) -> str:
    """'blocks.3.mlp: 412.00 MiB activations' (one ModuleBytes)."""
    return f"{m.module}: {fmt_bytes(m.bytes)} {m.category.replace('_', ' ')}"


def top_modules_text(result: RunRecord, n: int = 5) -> str | None:
    """Where a run's peak comes from, for the terminal: its n largest (module, category) at the peak."""
    top = result.memory.top_modules if result.memory else None
    if not top:
        return None
    width = max(len(m.module) for m in top[:n])
    lines = [f"  {m.module:<{width}}  {fmt_bytes(m.bytes):>11}  {m.category.replace('_', ' ')}" for m in top[:n]]
    share = sum(m.bytes for m in top[:n]) / result.peak * 100 if result.peak else 0
    return "\n".join([f"where {result.name}'s peak ({fmt_bytes(result.peak)}, {result.memory.peak_phase}) comes "
                      f"from, top {min(n, len(top))} modules ({share:.0f}% of it):", *lines])
