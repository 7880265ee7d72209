"""Where the machine's calibrations are kept: one JSON file, ``calibration.json`` in
pipecompile's cache folder (``$PIPECOMPILE_CACHE``, else ``$XDG_CACHE_HOME/pipecompile``, else
``~/.cache/pipecompile``), of records keyed by machine (host, torch version, device kind,
cores, threads per rank); read, written and cleared here, with the text `pipecompile
calibration` shows of them.

A record holds the constants (``calibration_timing.FIELDS``), ``threads``, ``method``, the
quality it was measured in (``load``, ``spread``, ``taken``: ``calibration_quality``), per
rank count the message figures with their own quality (``ranks``), what ``--tune``
learned (``step_scale``, per rank count and model) and the models' own timings at that
share of the cores (``timings``: ``model_timings``).
"""

from __future__ import annotations

import json
import platform
import re
import sys
from pathlib import Path
from typing import Any

import torch

from pipecompile.errors import PlanError
from pipecompile.files.atomic import write_atomically
from pipecompile.files.cache_dir import cache_root
from pipecompile.planner.calibration_quality import Quality
from pipecompile.planner.calibration_timing import FIELDS
from pipecompile.runtime.process.threads import cores

__all__ = ["METHOD", "clear_records", "describe", "machine_key", "read_records", "record_path"]

METHOD = 6  # a record measured another way is measured again (3: with its load and spread,
# 4: with convolutions, 5: --tune's ratios learned on predictions the model's own timing
# corrects, 6: those ratios applied after that correction, which had undone them on the ops)


def record_path() -> Path:
    """Where calibrations are kept: ``calibration.json`` in pipecompile's cache folder
    (``files.cache_dir``: ``$PIPECOMPILE_CACHE``, else ``$XDG_CACHE_HOME/pipecompile``, else
    ``~/.cache/pipecompile``)."""
    return cache_root() / "calibration.json"


def machine_key(threads: int) -> str:
    """The key of this machine's record at ``threads`` threads a rank."""
    kind = "cuda" if torch.cuda.is_available() else "cpu"
    return f"{platform.node()}/torch-{torch.__version__}/{kind}/{cores()}cores/{threads}threads"


def read_records() -> dict[str, Any]:
    """Every kept record by key ({} when none is kept, or the file is damaged)."""
    try:
        raw = json.loads(record_path().read_text())
    except (OSError, ValueError):
        return {}
    return raw if isinstance(raw, dict) else {}


def write_records(records: dict[str, Any]) -> None:
    """Keep ``records`` (whole, replacing the file at once); a home that cannot be written
    leaves a note, and the calibration is used, not kept."""
    path = record_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, json.dumps(records, indent=1, sort_keys=True) + "\n", unique=True)
    except OSError as err:
        print(f"pipecompile: note: calibration not saved to {path}: {err}", file=sys.stderr)


def clear_records() -> str:
    """Remove the kept calibrations; the line that says what was removed (or that nothing
    was kept).

    Raises:
        PlanError: the file is there but cannot be removed (its folder is read-only).
    """
    path = record_path()
    if not path.exists():
        return f"no calibration kept in {path}: nothing to clear"
    count = len(read_records())
    try:
        path.unlink()
    except OSError as err:
        why = err.strerror or str(err)
        raise PlanError(
            f"cannot remove the kept calibrations {path}: {why}; remove it by hand, or point "
            "PIPECOMPILE_CACHE at a folder you can write"
        ) from None
    return f"removed {path} ({count} calibration{'s' * (count != 1)})"


def describe() -> str:
    """The kept calibrations, one paragraph each: its key, when it was measured, others'
    load and the worst spread, its constants, the message figures per rank count, and why
    its predictions may be off (see `pipecompile calibration`)."""
    path = record_path()
    records = read_records()
    if not records:
        state = "none" if not path.exists() else "none readable"
        return f"no calibration kept in {path} ({state}): the next plan search measures one"
    lines = [f"calibrations kept in {path} (`pipecompile calibration --clear` removes them):"]
    for key in sorted(records):
        lines += _described(key, records[key])
    return "\n".join(lines)


def _described(key: str, entry: Any) -> list[str]:
    if not isinstance(entry, dict) or entry.get("method") != METHOD:
        return [f"{key}: measured by an older pipecompile; the next search measures it again"]
    try:
        return _record_lines(key, entry)
    except (AttributeError, KeyError, TypeError, ValueError):
        return [f"{key}: damaged; `pipecompile calibration --clear` removes it"]


def _record_lines(key: str, entry: dict[str, Any]) -> list[str]:
    here = _cores_of(key)
    quality = Quality.from_json(entry)
    lines = [f"{key}: {_measured(quality)}", "  " + _constants(entry)]
    for ranks, figures in sorted((entry.get("ranks") or {}).items(), key=lambda kv: int(kv[0])):
        kept = Quality.from_json(figures)
        lines.append(
            f"  {ranks} ranks: message latency {figures['message_latency'] * 1e6:.0f} us, "
            f"bandwidth {figures['bandwidth'] / 1e9:.2f} GB/s; {_measured(kept)}"
        )
        if kept is not None and kept.doubt(here):
            lines.append(f"    may be off: {kept.doubt(here)}")
    for name, scale in sorted((entry.get("step_scale") or {}).items()):
        lines.append(f"  --tune's measured / predicted for {name}: {scale:g}")
    timings = len(entry.get("timings") or {})
    if timings:
        lines.append(f"  the eager timings of {timings} model example{'s' * (timings != 1)} kept")
    if quality is not None and quality.doubt(here):
        lines.append(f"  may be off: {quality.doubt(here)}")
    return lines


def _measured(quality: Quality | None) -> str:
    if quality is None:
        return "no load or spread recorded"
    worst = max(quality.spread.items(), key=lambda kv: kv[1], default=None)
    shown = f", worst spread {worst[1]:.0%} ({worst[0]})" if worst else ""
    return f"measured {quality.when()}, others kept {quality.load:.0%} of the cores busy{shown}"


def _constants(entry: dict[str, Any]) -> str:
    value = {name: float(entry[name]) for name in FIELDS}
    return (
        f"{value['flops_rate'] / 1e9:.1f} GFLOP/s (half that for {value['half_work']:.2g}-FLOP "
        f"matmuls), convolutions {value['conv_rate'] / 1e9:.1f} GFLOP/s (half for "
        f"{value['conv_half_work']:.2g}-FLOP ones), {value['op_overhead'] * 1e6:.1f} us an op, "
        f"{value['instr_overhead'] * 1e6:.0f} us an instruction, "
        f"{value['elementwise_rate'] / 1e9:.2f} G elements/s, "
        f"AdamW {value['optimizer_rate'] / 1e9:.2f} GB/s"
    )


def _cores_of(key: str) -> int:
    found = re.search(r"/(\d+)cores/", key)
    return int(found.group(1)) if found else cores()
