"""A run across nodes, read back as one: each node's sweep writes its own folder (OUT/node<K>, `membench run
--nnodes`), with one record per run, its first rank's (record.rank). Every rank's record already holds every rank's
summary (`ranks`: the worker gathers them over the whole process group), so the run's record is global rank 0's,
with the failures of the other nodes' records merged in: a node that ran out of memory makes the run an OOM, even
where rank 0 only saw its peer's connection close."""

from __future__ import annotations

import dataclasses

from membench.results.schema import RunRecord

FAILED = ("oom", "error")


def merge_nodes(records: list[RunRecord]) -> list[RunRecord]:
    """One record per run: the records of one run across nodes (same job but for the node rank, under one results
    folder) merged, every other record as it is, in the order first seen."""
    groups: dict[object, list[RunRecord]] = {}
    order: list[object] = []
    for record in records:
        nodes = record.spec.launch.nodes
        key = id(record) if not nodes.several else (
            record.path.parent.parent if record.path else None,
            dataclasses.replace(record.spec, launch=dataclasses.replace(
                record.spec.launch, nodes=dataclasses.replace(nodes, node_rank=0))))
        if key not in groups:
            order.append(key)
        groups.setdefault(key, []).append(record)
    return [group[0] if len(group) == 1 else merged(group) for group in map(groups.get, order)]


def merged(records: list[RunRecord]) -> RunRecord:
    """The run's record from its nodes' records: global rank 0's (else the lowest rank's), its `ranks` filled from
    the others where it lacks one, and a failed node's status and error (an OOM first) the run's."""
    by_rank = sorted(records, key=lambda r: (r.rank is None, r.rank or 0))
    base = by_rank[0]
    out = dataclasses.replace(base)
    summaries = {s.rank: s for r in reversed(by_rank) for s in (r.ranks or [])}
    summaries.update({s.rank: s for s in base.ranks or []})
    out.ranks = [summaries[k] for k in sorted(summaries)] or None
    failed = [r for r in by_rank if r.status in FAILED]
    if failed:
        first = min(failed, key=lambda r: r.status != "oom")
        out.status = first.status
        out.error = "; ".join(f"{_where(r)}: {r.error}" for r in sorted(failed, key=lambda r: r is not first))
        out.memory = base.memory or first.memory
    return out


def _where(record: RunRecord) -> str:
    node = f"node {record.spec.launch.nodes.node_rank}"
    return node if record.rank is None else f"{node} (rank {record.rank})"
