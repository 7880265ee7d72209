"""The balance report: where the balancer cut the stages, what each stage costs, and how.

The balancer returns it beside the balanced graph; the driver hands it to the later steps
(the replica counts it chose) and to the manifest, whose ``balance`` object is ``as_json()``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any, TypedDict

from pipecompile.ir.programs.cost_model import CostModelJson

__all__ = ["BalanceJson", "BalanceReport"]


class BalanceJson(TypedDict, total=False):
    """The manifest's ``balance`` object (see ``BalanceReport``; the modelled split's keys are
    absent after a plain one, and an earlier manifest lacks the later keys). The balancer
    builds it in parts: each split's figures, then the order and the stages' op counts."""

    cost: str
    unit: str
    stage_costs: Sequence[float]  # lists in the manifest and as the splits make them
    stage_compute: Sequence[float]
    stage_comm: Sequence[float]
    stage_comm_bytes: Sequence[int]
    stage_params: Sequence[int]
    bottleneck: float
    lower_bound: float
    unconstrained_optimum: float
    replicas: Sequence[int]
    model: CostModelJson
    stage_memory: Sequence[int]
    stage_balanced: Sequence[int]
    order: str
    orders: dict[str, float]
    stage_ops: Sequence[int]
    requested_boundaries: int
    shape: str
    shapes: dict[str, float]


@dataclass(frozen=True)
class BalanceReport:
    """What the balancer decided and why.

    ``starts`` and ``method`` describe the decision (the index, among the graph's ops, of each
    stage's first op; ``"min_max"`` for the plain summed-cost split, ``"modelled"`` for the
    machine model's predicted times) and stay out of the manifest (read back, they are
    empty). The other fields are the manifest's ``balance`` object, in its order; those of
    the modelled split only (``unit`` and the ``stage_*`` times, ``replicas``, ``model``,
    ``stage_memory`` under a memory limit, ``stage_balanced``, ``order``, ``orders``) are
    None after a plain split and left out. ``shape`` says whether the plan is a chain or a
    graph (branches side by side, ``method`` "graph"), ``shapes`` each shape's priced step
    where the graph_plan pass priced both.
    """

    cost: str
    stage_costs: tuple[float, ...]
    bottleneck: float
    lower_bound: float
    unconstrained_optimum: float
    stage_ops: tuple[int, ...]
    requested_boundaries: int
    unit: str | None = None
    stage_compute: tuple[float, ...] | None = None
    stage_comm: tuple[float, ...] | None = None
    stage_comm_bytes: tuple[int, ...] | None = None
    stage_params: tuple[int, ...] | None = None
    replicas: tuple[int, ...] | None = None
    model: CostModelJson | None = None
    stage_memory: tuple[int, ...] | None = None
    stage_balanced: tuple[int, ...] | None = None
    order: str | None = None
    orders: dict[str, float] | None = None
    shape: str | None = None  # "chain", or "graph": branches side by side (passes/graph_plan)
    shapes: dict[str, float] | None = None  # each shape's priced step, where both were priced
    starts: tuple[int, ...] = ()  # not in the manifest: () when read back from one
    method: str = ""  # not in the manifest: "" when read back from one

    @classmethod
    def from_json(cls, raw: BalanceJson | None) -> BalanceReport | None:
        """The manifest's ``balance`` object read back (None for an empty or missing one;
        keys an earlier pipecompile did not write take their defaults)."""
        if not raw:
            return None
        known = {f.name for f in fields(cls)}
        values = {k: tuple(v) if isinstance(v, list) else v for k, v in raw.items() if k in known}
        values.setdefault("unconstrained_optimum", values.get("bottleneck", 0.0))
        values.setdefault("stage_ops", ())
        values.setdefault("requested_boundaries", 0)
        return cls(**values)

    def at(self, key: str, j: int) -> Any:
        """Stage ``j``'s value of the per-stage field ``key`` (None where it has none)."""
        values = getattr(self, key)
        return values[j] if values and j < len(values) else None

    def as_json(self) -> BalanceJson:
        """The manifest's ``balance`` object: every field set, in the manifest's key order."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return {
            key: list(values[key]) if isinstance(values[key], tuple) else values[key]
            for key in _JSON_ORDER
            if values[key] is not None
        }

    def __str__(self) -> str:
        costs = " ".join(f"{c:g}" for c in self.stage_costs)
        return (
            f"balance ({self.method}, {self.cost}{', ' + self.unit if self.unit else ''}): "
            f"stages start at ops {list(self.starts)}; costs {costs}; "
            f"bottleneck {self.bottleneck:g}, lower bound {self.lower_bound:g}"
        )


# The manifest's key order, as the balancer has always written it.
_JSON_ORDER = (
    "cost",
    "unit",
    "stage_costs",
    "stage_compute",
    "stage_comm",
    "stage_comm_bytes",
    "stage_params",
    "bottleneck",
    "lower_bound",
    "unconstrained_optimum",
    "replicas",
    "model",
    "stage_memory",
    "stage_balanced",
    "order",
    "orders",
    "stage_ops",
    "requested_boundaries",
    "shape",
    "shapes",
)
