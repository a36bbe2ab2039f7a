"""The regression gate: compare results against a stored baseline with rules such as peak_allocated:5%.

Only like is compared with like: a run is paired with the baseline run of the same name and the same workload
spec, measured on the same machine (device model, torch, CUDA), and predictions only with predictions, unless the
caller opts in. A gate must not pass by seeing less: a baseline run with no current run, or a current run with no
memory measured, is a failure unless the caller allows missing runs. Exit codes: 0 within the rules, 1 a
regression, 2 a usage error (raised as UserError).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from tabulate import tabulate

from membench import environment
from membench.common.errors import UserError
from membench.common.units import fmt_bytes, parse_bytes
from membench.results import RunRecord, load_dir
from membench.techniques import pairing_key

OK, REGRESSION = 0, 1


@dataclass(frozen=True)
class Metric:
    section: str  # where in a result file
    field: str
    kind: str  # "bytes", "seconds" or "number": how an absolute limit is written and a value shown
    lower_is_better: bool = True


METRICS = {
    "peak_allocated": Metric("memory", "peak_allocated_bytes", "bytes"),
    "peak_reserved": Metric("memory", "peak_reserved_bytes", "bytes"),
    "peak_active": Metric("memory", "peak_active_bytes", "bytes"),
    "driver_used": Metric("memory", "driver_used_bytes", "bytes"),
    "step_time": Metric("timing", "median_s", "seconds"),
    "throughput": Metric("timing", "throughput", "number", lower_is_better=False),
    "samples_per_s": Metric("timing", "samples_per_s", "number", lower_is_better=False),
    "mfu": Metric("timing", "mfu", "number", lower_is_better=False),
}

@dataclass(frozen=True)
class Rule:
    metric: str
    limit: float  # a fraction (0.05) when relative, else an amount in the metric's unit (bytes, seconds)
    relative: bool
    text: str

    def worse_by(self, base: float, current: float) -> tuple[float, float]:
        """(how much worse, as an amount; as a fraction of the baseline). Negative: better."""
        delta = current - base if METRICS[self.metric].lower_is_better else base - current
        return delta, (delta / base if base else (float("inf") if delta > 0 else 0.0))

    def broken(self, base: float, current: float) -> bool:
        amount, fraction = self.worse_by(base, current)
        return (fraction if self.relative else amount) > self.limit


def parse_rule(text: str) -> Rule:
    """'peak_allocated:5%', 'peak_allocated:64MiB', 'step_time:20ms', 'throughput:10%'."""
    name, sep, limit = text.partition(":")
    name = name.strip()
    if not sep or name not in METRICS:
        raise UserError(f"cannot read rule {text!r}: write metric:N% or metric:amount, with metric one of "
                        f"{', '.join(METRICS)}")
    limit = limit.strip()
    if limit.endswith("%"):
        try:
            value = float(limit[:-1])
        except ValueError:
            raise UserError(f"rule {text!r}: {limit!r} is not a percentage") from None
        if not math.isfinite(value):  # float() reads "nan" and "inf": a limit nothing can break is no rule
            raise UserError(f"rule {text!r}: the limit must be a finite number, such as 5%")
        if value < 0:
            raise UserError(f"rule {text!r}: the limit cannot be negative")
        return Rule(name, value / 100, True, text)
    kind = METRICS[name].kind
    if kind == "bytes":
        if limit.strip() in ("0", "0B"):
            return Rule(name, 0, False, text)
        return Rule(name, parse_bytes(limit), False, text)
    m = re.fullmatch(r"([0-9]*\.?[0-9]+)\s*(ms|s)?", limit)
    if not m or (kind == "number" and m.group(2)):
        unit = "a time such as 20ms or 0.5s" if kind == "seconds" else "a plain number"
        raise UserError(f"rule {text!r}: write the limit as N% or as {unit}")
    value = float(m.group(1)) / (1000 if m.group(2) == "ms" else 1)
    if not math.isfinite(value):
        raise UserError(f"rule {text[:60]!r}: the limit is too large to be a number")
    return Rule(name, value, False, text)


def _machine(result: RunRecord) -> str:
    env = result.env
    if env is None or env.device_name is None or env.torch is None:
        return f"{env.device if env else '?'} (unknown machine)"
    return environment.machine_key(env)


def _value(result: RunRecord, metric: str):
    m = METRICS[metric]
    section = getattr(result, m.section)
    return getattr(section, m.field) if section is not None else None


def _show(metric: str, value) -> str:
    kind = METRICS[metric].kind
    if value is None:
        return "-"
    if kind == "bytes":
        return f"{fmt_bytes(value)} ({int(value)} B)"
    return f"{value * 1e3:.2f} ms" if kind == "seconds" else f"{value:.4g}"


def _pairs(baseline: list[dict], current: list[dict], allow_machine_mismatch: bool, allow_predicted: bool):
    # Runs pair by what ran (RunSpec: workload, batch, techniques, device, optimizer, ...; not the options of
    # techniques a run does not use: techniques.pairing_key), never by how it was
    # measured (steps, warm-up) or launched (timeout): those may differ between a baseline and a check.
    by_key: dict = {}
    for r in baseline:
        by_key.setdefault(pairing_key(r.spec.run), []).append(r)
    pairs, unmatched = [], []
    current_specs = {pairing_key(cur.spec.run) for cur in current}
    missing = [b for b in baseline if pairing_key(b.spec.run) not in current_specs]
    for cur in current:
        candidates = by_key.get(pairing_key(cur.spec.run))
        if not candidates:
            unmatched.append(cur)
            continue
        base = max(candidates, key=lambda r: r.started or 0)  # the newest, if a baseline was re-run
        if base.predicted != cur.predicted and not allow_predicted:
            kinds = {True: "a prediction", False: "a measurement"}
            raise UserError(f"run {cur.name} ({cur.label}) is {kinds[cur.predicted]} and its "
                            f"baseline {kinds[base.predicted]}: they are not comparable "
                            "(pass --allow-predicted-vs-measured to compare anyway)")
        if _machine(base) != _machine(cur) and not allow_machine_mismatch:
            raise UserError(f"run {cur.name} ({cur.label}) was measured on {_machine(cur)} but its baseline "
                            f"on {_machine(base)}: record a baseline on this machine, or pass "
                            "--allow-machine-mismatch to compare anyway")
        pairs.append((base, cur))
    return pairs, unmatched, missing


_MEMORY_METRICS = {name for name, m in METRICS.items() if m.section == "memory"}


def check(baseline: Path, current: Path, rules: list[str], allow_machine_mismatch: bool = False,
          allow_predicted_vs_measured: bool = False, allow_missing: bool = False) -> tuple[int, str]:
    """Compare; return (exit code, report text). Usage errors raise UserError (exit 2)."""
    if not rules:
        raise UserError("no --rule given: write e.g. --rule peak_allocated:5% (metrics: " + ", ".join(METRICS) + ")")
    parsed = [parse_rule(r) for r in rules]
    base_results, cur_results = load_dir(baseline), load_dir(current)
    pairs, unmatched, missing = _pairs(base_results, cur_results, allow_machine_mismatch,
                                       allow_predicted_vs_measured)
    if not pairs:
        have = sorted({f"{r.name} ({r.label})" for r in base_results})
        got = sorted({f"{r.name} ({r.label})" for r in cur_results})
        raise UserError(f"nothing comparable: no run in {current} has the name and workload spec of a run in "
                        f"{baseline} (baseline: {', '.join(have)}; current: {', '.join(got)})")

    rows, regressions, compared, skipped = [], 0, 0, []
    for base in missing:
        # A run that vanished is not a run that stayed within the rules.
        if allow_missing:
            skipped.append(f"note: baseline run {base.name} ({base.label}) has no current run; allowed by "
                           "--allow-missing")
            continue
        regressions += 1
        rows.append(["MISSING", base.name, base.label, "run", base.status, "-", "-",
                     "must be present (or --allow-missing)"])
    for base, cur in pairs:
        if base.status == "ok" and cur.status != "ok":
            regressions += 1
            rows.append(["REGRESSED", cur.name, cur.label, "status", "ok", cur.status, "-", "must stay ok"])
            continue
        for rule in parsed:
            b, c = _value(base, rule.metric), _value(cur, rule.metric)
            if b is not None and c is None and rule.metric in _MEMORY_METRICS and not allow_missing:
                # The baseline measured it and this run did not: an empty record must not pass the gate.
                regressions += 1
                rows.append(["MISSING", cur.name, cur.label, rule.metric, _show(rule.metric, b), "-", "-",
                             "must be measured (or --allow-missing)"])
                continue
            if b is None or c is None:
                if b is not None:
                    skipped.append(f"note: {cur.name} ({cur.label}) has no {rule.metric}; allowed by "
                                   "--allow-missing")
                continue
            compared += 1
            broken = rule.broken(b, c)
            regressions += broken
            sign = "+" if METRICS[rule.metric].lower_is_better else "-"
            change = f"{(c - b) / b * 100:+.2f}%" if b else f"{sign}{_show(rule.metric, abs(c - b))}"
            rows.append(["REGRESSED" if broken else "ok", cur.name, cur.label, rule.metric,
                         _show(rule.metric, b), _show(rule.metric, c), change, rule.text])
    if not compared and not regressions:
        metrics = ", ".join(sorted({r.metric for r in parsed}))
        raise UserError(f"nothing comparable: no paired run has {metrics} in both files "
                        "(peak_reserved and driver_used exist only for CUDA runs; timing only for measured runs)")
    rows.sort(key=lambda r: r[0] == "ok")
    table = tabulate(rows, headers=["verdict", "run", "workload", "metric", "baseline", "current", "change", "rule"],
                     tablefmt="simple", disable_numparse=True)
    lines = [table, ""]
    for r in unmatched:
        lines.append(f"note: {r.name} ({r.label}) has no baseline with the same run spec; not checked")
    lines.extend(skipped)
    if regressions:
        lines.append(f"membench check: {regressions} regression(s) against {baseline}")
        return REGRESSION, "\n".join(lines)
    lines.append(f"membench check: {len(pairs)} run(s), {compared} comparison(s), all within the rules")
    return OK, "\n".join(lines)
