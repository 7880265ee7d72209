"""Which rank runs what: devices of the program, each replicated over one or more ranks.

Ranks are numbered device by device: device d's replicas are ranks base[d] .. base[d]+r_d-1.
Replica k of a device runs its micro-batches i with i mod r_d == k. Under ``--dp D`` the
pipeline runs D times on the mesh; copy c's placement counts its ranks from ``first`` = c*W.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipecompile.ir.records.manifest import Manifest

__all__ = ["Placement"]


@dataclass(frozen=True)
class Placement:
    stage_device: tuple[int, ...]
    device_replicas: tuple[int, ...]
    first: int = 0  # the global rank of this copy's rank 0 (data-parallel copy c: c * world)

    @classmethod
    def from_manifest(cls, manifest: Manifest, stage_device: tuple[int, ...]) -> Placement:
        per_stage = manifest.replicas or (1,) * len(stage_device)
        devices = max(stage_device) + 1
        counts = [1] * devices
        for j, d in enumerate(stage_device):
            counts[d] = max(counts[d], int(per_stage[j]))
        return cls(stage_device, tuple(counts))

    @property
    def world(self) -> int:
        return sum(self.device_replicas)

    def base(self, device: int) -> int:
        return self.first + sum(self.device_replicas[:device])

    def ranks_of_device(self, device: int) -> list[int]:
        return list(range(self.base(device), self.base(device) + self.device_replicas[device]))

    def ranks_of_stage(self, stage: int) -> list[int]:
        return self.ranks_of_device(self.stage_device[stage])

    def rank_of(self, stage: int, microbatch: int) -> int:
        """The rank that runs ``stage`` for ``microbatch``."""
        d = self.stage_device[stage]
        return self.base(d) + microbatch % self.device_replicas[d]

    def role(self, rank: int) -> tuple[int, int]:
        """(device, replica) of global ``rank`` (a rank of this copy)."""
        for d, count in enumerate(self.device_replicas):
            if rank < self.base(d) + count:
                return d, rank - self.base(d)
        raise ValueError(f"rank {rank} is beyond the {self.world} ranks of this copy")

    def copy(self, index: int) -> Placement:
        """The placement of data-parallel copy ``index`` (ranks index*world onwards)."""
        return Placement(self.stage_device, self.device_replicas, index * self.world)
