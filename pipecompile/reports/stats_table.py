"""The table `run --stats` prints after a run: measured against predicted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["stats_table"]


def stats_table(pipe: Any, directory: Path, program: str | None) -> str:
    """`run --stats`: per device, the peak in-flight micro-batches and stored activations
    measured in the last step against the schedule's prediction; per stage, the compute per
    micro-batch measured against the balancer's."""
    from pipecompile.ir.records.sizes import format_size
    from pipecompile.reports.show import schedule_report

    predicted, _ = schedule_report(directory, program_path=program, uniform=True)
    assert pipe.last is not None
    stats = pipe.last.stats
    rows = [
        "device   peak in-flight (measured / predicted)   peak activations (measured / predicted)"
    ]
    for d, dev in enumerate(stats.devices):
        want = predicted.get("peak_activation_bytes")
        rows.append(
            f"{d:>6}   {dev.peak_inflight:>14} / {predicted['peak_inflight'][d]:<9}"
            f"                 {format_size(dev.peak_stored):>10} / "
            f"{format_size(want[d]) if want else '-'}"
        )
    balance = pipe.manifest.balance
    timed = balance is not None and balance.unit == "ns"
    predicted_ns = balance.stage_compute if timed else None  # type: ignore[union-attr]
    m = pipe.program.microbatches
    rows.append("stage   compute per micro-batch, forward + backward (measured / predicted)")
    for j in sorted(stats.compute_ns):
        want_ns = predicted_ns[j] if predicted_ns else None
        ratio = ""
        if want_ns and balance.cost == "time":  # type: ignore[union-attr]
            ratio = f"  ({stats.compute_ns[j] / m / want_ns:.2f}x)"
        elif want_ns:
            rate = (balance.model or {})["flops_rate"]  # type: ignore[union-attr]
            ratio = f"  (FLOPs at {rate:g}/s; compile with --balance time to compare)"
        rows.append(
            f"{j:>5}   {stats.compute_ns[j] / m / 1e3:>10.1f} us / "
            f"{'-' if want_ns is None else f'{want_ns / 1e3:.1f} us'}{ratio}"
        )
    return "\n".join(rows)
