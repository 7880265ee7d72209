"""The plan search's table: the chosen plan and the runners-up, as the manifest's ``plan``
records them (with the measured step of each plan ``--tune`` ran)."""

from __future__ import annotations

from pipecompile.ir.records.plan_record import PlanRecord, PlanRow
from pipecompile.ir.records.sizes import format_size

__all__ = ["plan_table", "seconds_text"]

_HEAD = (
    "",
    "devices",
    "stages",
    "micro-batches",
    "schedule",
    "recompute",
    "step",
    "bubble",
    "peak memory",
)


def plan_table(plan: PlanRecord) -> str:
    """``plan``'s best plans, one row each, the chosen one first and marked."""
    measured = {t.flags: t.measured_step_s for t in plan.tuned}
    rows = [_HEAD + (("measured",) if measured else ())]
    for k, p in enumerate(plan.ranked):
        row = (
            "*" if k == 0 else str(k + 1),
            str(p.devices_used if p.devices_used is not None else "-"),
            _shape(p),
            str(p.microbatches),
            p.schedule,
            p.recompute,
            seconds_text(p.predicted_step_s),
            f"{p.bubble:.1%}",
            format_size(max(p.peak_memory)),
        )
        if measured:
            got = measured.get(p.flags)
            row += (seconds_text(got) if got is not None else "-",)
        rows.append(row)
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows]
    head = (
        f"plan: searched {plan.plans_searched} plans for {plan.devices} devices"
        + (f" ({plan.plans_bounded} bounded out)" if plan.plans_bounded else "")
        + " in "
        f"{plan.search_seconds:.1f} s; chose *"
    )
    if measured:
        head += f", the measured best of the {len(measured)} tuned"
    used = plan.chosen.devices_used
    if used is not None and used < plan.devices:
        head += (
            f" (it uses {used} of the {plan.devices}: a device more would have no "
            f"micro-batch to run, or cost more than it saves)"
        )
    return "\n".join([head, *lines])


def seconds_text(value: float) -> str:
    """``1.3 ms`` or ``850.2 us``."""
    return f"{value * 1e3:.1f} ms" if value >= 1e-3 else f"{value * 1e6:.1f} us"


def _shape(p: PlanRow) -> str:
    replicas, v = p.replicas, p.virtual_stages
    shape = str(p.stages)
    if any(r > 1 for r in replicas):
        shape += f" x ({','.join(map(str, replicas))})"
    if v:
        shape += f" ({v} per device)"
    if p.graph:
        shape += " (graph)"  # branches side by side on devices of their own
    return shape
