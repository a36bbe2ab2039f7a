"""The device mesh sharded techniques share (fsdp, fsdp-offload, tp), named as torchtitan names its dimensions.

`--mesh dp_replicate=2,dp_shard=4,tp=2`: 16 ranks, laid out as torchtitan's `init_device_mesh` lays them, row-major
over (dp_replicate, dp_shard, tp), tensor parallelism innermost (the ranks of one node). FSDP shards over dp_shard
and, with dp_replicate, is HSDP (replicated across dp_replicate); the tp technique shards each block over tp.
Without --mesh every rank is one dp_shard dimension. The text is parsed here only: at the edge (the CLI's argument
type) and by the spec (`RunSpec.mesh_of`), into a `Mesh`; a record keeps the text. The DeviceMesh itself is built
in techniques/mesh.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from membench.common.errors import UserError

DIMS = ("dp_replicate", "dp_shard", "tp")  # torchtitan's names, in its order
UNSUPPORTED = {"pp": "pipeline parallelism", "cp": "context parallelism", "ep": "expert parallelism"}


@dataclass(frozen=True)
class Mesh:
    dp_replicate: int = 1
    dp_shard: int = 1
    tp: int = 1

    @property
    def size(self) -> int:
        return self.dp_replicate * self.dp_shard * self.tp

    @property
    def text(self) -> str:
        """The canonical spelling: every dimension above 1, in torchtitan's order ("dp_shard=1" for one rank)."""
        parts = [f"{d}={getattr(self, d)}" for d in DIMS if getattr(self, d) > 1]
        return ",".join(parts) or "dp_shard=1"

    def coordinates(self, rank: int) -> dict[str, int]:
        """Where a rank sits on each dimension (row-major, tp innermost)."""
        tp, rest = rank % self.tp, rank // self.tp
        return {"dp_replicate": rest // self.dp_shard, "dp_shard": rest % self.dp_shard, "tp": tp}

    def over(self, world_size: int | None, text: str | None = None) -> Mesh:
        """This mesh, checked to be `world_size` ranks (None: any); `text`: as the user wrote it."""
        if world_size is not None and world_size != self.size:
            sizes = [str(getattr(self, d)) for d in DIMS if f"{d}=" in (text or self.text)]
            raise UserError(f"--mesh {text or self.text!r} has {self.size} ranks ({' x '.join(sizes)}), "
                            f"but the run has {world_size}")
        return self

    def data_parallel(self, rank: int) -> tuple[int, int]:
        """(this rank's index among the data-parallel ranks, how many there are): the ranks of one tp group train on
        the same batch, so the batch is split over dp_replicate x dp_shard, not over every rank."""
        at = self.coordinates(rank)
        return at["dp_replicate"] * self.dp_shard + at["dp_shard"], self.dp_replicate * self.dp_shard


def parse_mesh(text: str | None, world_size: int | None = None) -> Mesh:
    """'dp_shard=8,tp=2' -> Mesh(dp_shard=8, tp=2); None: one dp_shard dimension of `world_size` ranks."""
    if text is None:
        return Mesh(dp_shard=world_size or 1)
    sizes: dict[str, int] = {}
    valid = f"NAME=SIZE pairs, e.g. dp_shard=8,tp=2; names: {', '.join(DIMS)}"
    for part in str(text).split(","):
        name, eq, size = part.strip().partition("=")
        if not eq:
            raise UserError(f"--mesh {text!r}: {part.strip()!r} is not {valid}")
        if name in UNSUPPORTED:
            raise UserError(f"--mesh {text!r}: {name} ({UNSUPPORTED[name]}) is not supported; names: "
                            f"{', '.join(DIMS)}")
        if name not in DIMS:
            raise UserError(f"--mesh {text!r}: {name!r} is not a mesh dimension; {valid}")
        if not size.strip().isdigit() or int(size) < 1:
            raise UserError(f"--mesh {text!r}: {part.strip()!r}: a size is an integer of 1 or more; {valid}")
        if name in sizes:
            raise UserError(f"--mesh {text!r}: {name} is given twice")
        sizes[name] = int(size)
    mesh = Mesh(**sizes)
    if mesh.size > 2**31 - 1:
        raise UserError(f"--mesh {text!r} has {mesh.size} ranks: at most {2**31 - 1}")
    return mesh.over(world_size, text)


def check_reshard_after_forward(value, mesh: Mesh) -> None:
    """FSDP2 takes True, False, or a world size to reshard to after forward: a divisor of the shard dimension
    other than 1 and itself (fully_shard's docstring)."""
    if isinstance(value, bool) or value is None:
        return
    if not isinstance(value, int) or value <= 1 or value >= mesh.dp_shard or mesh.dp_shard % value:
        divisors = [d for d in range(2, mesh.dp_shard) if mesh.dp_shard % d == 0]
        raise UserError(f"--reshard-after-forward {value!r}: true, false, or a divisor of dp_shard={mesh.dp_shard} "
                        f"other than 1 and itself ({', '.join(map(str, divisors)) or 'none here'})")
