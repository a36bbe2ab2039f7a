"""Several machines: torchrun's multi-node options as `membench run` takes them, checked before anything runs, and
the torchrun arguments they become.

The options and their meaning are torchrun's own (torch/distributed/run.py, get_args_parser): `--nnodes`,
`--node-rank`, and a rendezvous, either dynamic (`--rdzv-backend c10d --rdzv-endpoint HOST:PORT --rdzv-id ID`) or
static (`--master-addr HOST --master-port PORT`, torchrun's "static" backend, where `--node-rank` orders the global
ranks). Under c10d, torchrun gives global ranks by its participants' sorted (host, pid) descriptors
(torch/distributed/elastic/rendezvous/dynamic_rendezvous.py, `_mark_rendezvous_complete`), not by `--node-rank`:
global rank 0 may run on any node, so a node's results never assume it holds rank 0.
"""

from __future__ import annotations

from dataclasses import dataclass

from membench.common.errors import UserError

RDZV_BACKENDS = ("c10d", "static", "etcd", "etcd-v2")  # torch.distributed.elastic.rendezvous.registry
DEFAULT_RDZV_ID = "membench"


@dataclass(frozen=True)
class Nodes:
    """The nodes of a run: how many, this one's rank among them, and where they meet."""

    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str = ""
    rdzv_backend: str = ""  # "": c10d with --rdzv-endpoint, static with --master-addr
    rdzv_id: str = ""
    master_addr: str = ""
    master_port: int | None = None

    @property
    def several(self) -> bool:
        return self.nnodes > 1

    def validated(self) -> Nodes:
        if isinstance(self.nnodes, bool) or not isinstance(self.nnodes, int) or self.nnodes < 1:
            raise UserError(f"--nnodes must be an integer, 1 or more, got {self.nnodes!r}")
        if isinstance(self.node_rank, bool) or not isinstance(self.node_rank, int) or not (
                0 <= self.node_rank < self.nnodes):
            raise UserError(f"--node-rank must be from 0 to {self.nnodes - 1} (below --nnodes {self.nnodes}), got "
                            f"{self.node_rank!r}")
        if self.rdzv_endpoint and self.master_addr:
            raise UserError("give --rdzv-endpoint HOST:PORT (c10d rendezvous) or --master-addr/--master-port "
                            "(static rendezvous), not both")
        if self.rdzv_endpoint:
            _host_port(self.rdzv_endpoint)
        if self.master_port is not None and not (isinstance(self.master_port, int) and 1 <= self.master_port <= 65535):
            raise UserError(f"--master-port must be a port from 1 to 65535, got {self.master_port!r}")
        if self.rdzv_backend and self.rdzv_backend not in RDZV_BACKENDS:
            raise UserError(f"--rdzv-backend {self.rdzv_backend!r} is not one torchrun knows; valid: "
                            f"{', '.join(RDZV_BACKENDS)}")
        if self.several and not (self.rdzv_endpoint or self.master_addr):
            raise UserError(f"--nnodes {self.nnodes}: the nodes need a place to meet: --rdzv-endpoint HOST:PORT "
                            "(a host every node reaches, usually the first node's) or --master-addr HOST")
        return self

    def torchrun_options(self, run_name: str) -> list[str]:
        """torchrun's arguments for these nodes, [] for one node with no rendezvous given. Each run of a sweep
        meets under an id of its own (`<rdzv-id>-<run>`): a node that starts the next run while another still
        closes the last never joins the wrong one."""
        if not (self.several or self.rdzv_endpoint or self.master_addr):
            return []
        out = [f"--nnodes={self.nnodes}", f"--node-rank={self.node_rank}"]
        if self.master_addr and self.rdzv_backend in ("", "static"):
            out += [f"--master-addr={self.master_addr}"]
            out += [f"--master-port={self.master_port}"] if self.master_port is not None else []
            return out
        backend = self.rdzv_backend or "c10d"
        endpoint = self.rdzv_endpoint or f"{self.master_addr}:{self.master_port or 29500}"
        return out + [f"--rdzv-backend={backend}", f"--rdzv-endpoint={endpoint}",
                      f"--rdzv-id={self.rdzv_id or DEFAULT_RDZV_ID}-{run_name}"]


def _host_port(endpoint: str) -> tuple[str, int]:
    """HOST:PORT, or [IPv6]:PORT, as torchrun's parse_rendezvous_endpoint reads it (rendezvous/utils.py); a port is
    required here: without one torchrun picks its default on each node, which the nodes may not agree on."""
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535 or (
            host.startswith("[") != host.endswith("]")):
        raise UserError(f"--rdzv-endpoint {endpoint!r} must be HOST:PORT with a port from 1 to 65535, e.g. "
                        "node0:29500")
    return host.strip("[]"), int(port)
