"""A plan: how a model runs on a set of devices (stages and their replicas, micro-batches,
schedule, virtual stages, recomputation), and what the cost model predicts for it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Plan", "Predicted"]


@dataclass(frozen=True)
class Plan:
    """One choice of everything the compile options `--stages`, `--replicate`,
    `--microbatches`, `--schedule`, `--virtual-stages` and `--recompute` fix."""

    schedule: str
    stages: int
    microbatches: int
    recompute: str = "never"
    virtual_stages: int | None = None
    replicas: tuple[int, ...] = ()  # ranks per stage; () when one each
    graph: bool = False  # a stage graph on ``stages`` devices: branches side by side

    @property
    def shape(self) -> str:
        """Stages x replicas as the table shows it: ``4``, ``2x(3,1)``, ``8 on 4``."""
        if self.replicas and any(r > 1 for r in self.replicas):
            return f"{self.stages}x({','.join(map(str, self.replicas))})"
        return str(self.stages)

    @property
    def flags(self) -> str:
        """The compile flags that give this plan."""
        out = [f"--stages {self.stages}", f"--microbatches {self.microbatches}"]
        out.append(f"--schedule {self.schedule}")
        if self.virtual_stages is not None:
            out.append(f"--virtual-stages {self.virtual_stages}")
        if self.recompute != "never":
            out.append(f"--recompute {self.recompute}")
        if self.replicas and any(r > 1 for r in self.replicas):
            out.append(f"--replicate {','.join(map(str, self.replicas))}")
        if self.graph:
            out.append("--graph")
        return " ".join(out)


@dataclass(frozen=True)
class Predicted:
    """A plan with its predicted step (seconds), bubble fraction, peak memory per device
    (bytes: parameters, gradients, optimizer state, weight copies, stored activations) and
    the split the exact partitioner chose for it (atom index of each stage's start)."""

    plan: Plan
    step: float
    bubble: float
    memory: tuple[int, ...]
    starts: tuple[int, ...]

    @property
    def devices(self) -> int:
        """The devices (ranks) the plan uses: its stages' replicas, else its program's
        devices; a search for N devices may use fewer, where more would idle or cost more
        than they save."""
        return sum(self.plan.replicas) if self.plan.replicas else len(self.memory)

    def as_json(self) -> dict[str, Any]:
        p = self.plan
        return {
            "stages": p.stages,
            "replicas": list(p.replicas) or [1] * p.stages,
            "microbatches": p.microbatches,
            "schedule": p.schedule,
            "virtual_stages": p.virtual_stages,
            "recompute": p.recompute,
            "devices_used": self.devices,
            "predicted_step_s": round(self.step, 6),
            "bubble": round(self.bubble, 4),
            "peak_memory": list(self.memory),
            **({"graph": True} if p.graph else {}),
        }
