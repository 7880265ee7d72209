"""The plan search's record, as the manifest's ``plan`` holds it: the chosen plan and the
runners-up (``PlanRow``), how the search went, the cost model it priced them with, and what
``--tune`` measured (``TunedRow``). Read and written only by the manifest's reader and writer
and by the planner that makes it."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, NotRequired, TypedDict

from pipecompile.ir.programs.cost_model import CostModelJson

__all__ = ["PlanJson", "PlanRecord", "PlanRow", "PlanRowJson", "TunedRow", "TunedRowJson"]

_FLAGS = ("stages", "replicas", "microbatches", "schedule", "virtual_stages", "recompute")


class TunedRowJson(TypedDict):
    """A ``TunedRow`` in the manifest: the plan's choices, its predicted and measured step."""

    stages: int
    replicas: NotRequired[list[int]]  # NotRequired here and below: not in earlier manifests
    microbatches: int
    schedule: str
    virtual_stages: NotRequired[int | None]
    recompute: NotRequired[str]
    predicted_step_s: float
    measured_step_s: float


class PlanRowJson(TypedDict):
    """A ``PlanRow`` in the manifest."""

    stages: int
    replicas: NotRequired[list[int]]
    microbatches: int
    schedule: str
    virtual_stages: NotRequired[int | None]
    recompute: NotRequired[str]
    devices_used: NotRequired[int | None]
    predicted_step_s: float
    bubble: NotRequired[float]
    peak_memory: NotRequired[list[int]]
    graph: NotRequired[bool]


class PlanJson(PlanRowJson):
    """The manifest's ``plan``: the chosen plan's row, then the search's figures."""

    devices: int
    plans_searched: NotRequired[int]
    plans_bounded: NotRequired[int]
    search_seconds: NotRequired[float]
    runners_up: NotRequired[list[PlanRowJson]]
    cost_model: NotRequired[CostModelJson]
    tuned: NotRequired[list[TunedRowJson]]
    measured_step_s: NotRequired[float]


@dataclass(frozen=True)
class PlanRow:
    """One plan the search priced: its shape (the choices a compile fixes), the devices it
    uses, its predicted step, bubble and peak memory per device."""

    stages: int
    replicas: tuple[int, ...]
    microbatches: int
    schedule: str
    virtual_stages: int | None
    recompute: str
    devices_used: int | None
    predicted_step_s: float
    bubble: float
    peak_memory: tuple[int, ...]
    graph: bool = False  # a stage graph: branches side by side (passes/graph_plan)

    @property
    def flags(self) -> tuple[Any, ...]:
        """The choices that make this plan (what ``--tune`` compiles it from)."""
        return tuple(getattr(self, k) for k in _FLAGS)

    def label(self) -> str:
        """``2x(2,1) stages, 4 micro-batches, SCHEDULE``."""
        shape = f"{self.stages}" + (
            f"x({','.join(map(str, self.replicas))})" if any(r > 1 for r in self.replicas) else ""
        )
        graph = ", a stage graph" if self.graph else ""
        return f"{shape} stages{graph}, {self.microbatches} micro-batches, {self.schedule}"

    def as_json(self) -> PlanRowJson:
        return {
            "stages": self.stages,
            "replicas": list(self.replicas),
            "microbatches": self.microbatches,
            "schedule": self.schedule,
            "virtual_stages": self.virtual_stages,
            "recompute": self.recompute,
            "devices_used": self.devices_used,
            "predicted_step_s": self.predicted_step_s,
            "bubble": self.bubble,
            "peak_memory": list(self.peak_memory),
            **({"graph": True} if self.graph else {}),  # type: ignore[typeddict-item]
        }

    @classmethod
    def from_json(cls, raw: PlanRowJson) -> PlanRow:
        return cls(
            stages=int(raw["stages"]),
            replicas=tuple(raw.get("replicas") or [1] * int(raw["stages"])),
            microbatches=int(raw["microbatches"]),
            schedule=raw["schedule"],
            virtual_stages=raw.get("virtual_stages"),
            recompute=raw.get("recompute", "never"),
            devices_used=raw.get("devices_used"),
            predicted_step_s=float(raw["predicted_step_s"]),
            bubble=float(raw.get("bubble", 0.0)),
            peak_memory=tuple(raw.get("peak_memory") or ()),
            graph=bool(raw.get("graph", False)),
        )


@dataclass(frozen=True)
class TunedRow:
    """A plan ``--tune`` compiled and ran: its choices, predicted and measured step."""

    flags: tuple[Any, ...]  # as ``PlanRow.flags``
    predicted_step_s: float
    measured_step_s: float

    def as_json(self) -> TunedRowJson:
        stages, replicas, microbatches, schedule, virtual_stages, recompute = self.flags
        return {
            "stages": stages,
            "replicas": list(replicas),
            "microbatches": microbatches,
            "schedule": schedule,
            "virtual_stages": virtual_stages,
            "recompute": recompute,
            "predicted_step_s": self.predicted_step_s,
            "measured_step_s": self.measured_step_s,
        }

    @classmethod
    def from_json(cls, raw: TunedRowJson) -> TunedRow:
        row = PlanRow.from_json({**raw, "peak_memory": [], "bubble": 0.0})
        return cls(row.flags, float(raw["predicted_step_s"]), float(raw["measured_step_s"]))


@dataclass(frozen=True)
class PlanRecord:
    """The manifest's ``plan``: ``chosen``'s fields at its top level, then the search's."""

    devices: int
    chosen: PlanRow
    plans_searched: int
    plans_bounded: int
    search_seconds: float
    runners_up: tuple[PlanRow, ...]
    cost_model: CostModelJson
    tuned: tuple[TunedRow, ...] = ()
    measured_step_s: float | None = None  # --tune: the chosen plan's measured step

    @property
    def ranked(self) -> tuple[PlanRow, ...]:
        """The chosen plan, then the runners-up."""
        return (self.chosen, *self.runners_up)

    def retuned(self, k: int, tuned: tuple[TunedRow, ...], measured: float) -> PlanRecord:
        """This record with ``ranked[k]`` chosen (the measured best of ``--tune``), the others
        its runners-up, and what was measured."""
        ranked = self.ranked
        others = ranked[:k] + ranked[k + 1 :]
        return replace(
            self,
            chosen=ranked[k],
            runners_up=others,
            tuned=tuned,
            measured_step_s=round(measured, 6),
        )

    def as_json(self) -> PlanJson:
        raw: PlanJson = {
            "devices": self.devices,
            **self.chosen.as_json(),
            "plans_searched": self.plans_searched,
            "plans_bounded": self.plans_bounded,
            "search_seconds": self.search_seconds,
            "runners_up": [p.as_json() for p in self.runners_up],
            "cost_model": self.cost_model,
        }
        if self.tuned:
            raw["tuned"] = [t.as_json() for t in self.tuned]
        if self.measured_step_s is not None:
            raw["measured_step_s"] = self.measured_step_s
        return raw

    @classmethod
    def from_json(cls, raw: PlanJson | None) -> PlanRecord | None:
        """The manifest's ``plan`` read back (None where it has none)."""
        if not raw:
            return None
        return cls(
            devices=int(raw["devices"]),
            chosen=PlanRow.from_json(raw),
            plans_searched=int(raw.get("plans_searched", 0)),
            plans_bounded=int(raw.get("plans_bounded", 0)),
            search_seconds=float(raw.get("search_seconds", 0.0)),
            runners_up=tuple(PlanRow.from_json(p) for p in raw.get("runners_up", [])),
            cost_model=CostModelJson(**(raw.get("cost_model") or {})),
            tuned=tuple(TunedRow.from_json(t) for t in raw.get("tuned", [])),
            measured_step_s=raw.get("measured_step_s"),
        )
