"""The plan search's table: the chosen plan and the runners-up, as the manifest's ``plan``
records them (with the measured step of each plan ``--tune`` ran)."""

from __future__ import annotations

from typing import Any

from pipecompile.ir.sizes import format_size

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
_KEYS = ("stages", "replicas", "microbatches", "schedule", "virtual_stages", "recompute")


def plan_table(plan: dict[str, Any]) -> str:
    """``plan``'s best plans, one row each, the chosen one first and marked."""
    measured = {_key(t): t["measured_step_s"] for t in plan.get("tuned", [])}
    rows = [_HEAD + (("measured",) if measured else ())]
    for k, p in enumerate([plan, *plan.get("runners_up", [])]):
        row = (
            "*" if k == 0 else str(k + 1),
            str(p.get("devices_used", "-")),
            _shape(p),
            str(p["microbatches"]),
            p["schedule"],
            p["recompute"],
            seconds_text(p["predicted_step_s"]),
            f"{p['bubble']:.1%}",
            format_size(max(p["peak_memory"])),
        )
        if measured:
            got = measured.get(_key(p))
            row += (seconds_text(got) if got is not None else "-",)
        rows.append(row)
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows]
    head = (
        f"plan: searched {plan['plans_searched']} plans for {plan['devices']} devices"
        + (f" ({plan['plans_bounded']} bounded out)" if plan.get("plans_bounded") else "")
        + " in "
        f"{plan['search_seconds']:.1f} s; chose *"
    )
    if measured:
        head += f", the measured best of the {len(measured)} tuned"
    used = plan.get("devices_used")
    if used is not None and used < plan["devices"]:
        head += (
            f" (it uses {used} of the {plan['devices']}: a device more would have no "
            f"micro-batch to run, or cost more than it saves)"
        )
    return "\n".join([head, *lines])


def _key(p: dict[str, Any]) -> tuple[str, ...]:
    return tuple(str(p.get(k)) for k in _KEYS)


def seconds_text(value: float) -> str:
    """``1.3 ms`` or ``850.2 us``."""
    return f"{value * 1e3:.1f} ms" if value >= 1e-3 else f"{value * 1e6:.1f} us"


def _shape(p: dict[str, Any]) -> str:
    replicas = p.get("replicas") or []
    v = p.get("virtual_stages")
    shape = str(p["stages"])
    if any(r > 1 for r in replicas):
        shape += f" x ({','.join(map(str, replicas))})"
    if v:
        shape += f" ({v} per device)"
    return shape
