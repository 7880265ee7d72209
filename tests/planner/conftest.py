"""The planner tests' made-up calibration: a cache of its own and measurements that return
made-up figures, each count measured listed."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from pipecompile.planner import calibrate, calibration_messages, calibration_quality
from pipecompile.planner.calibration_quality import Quality

CONSTANTS = {
    "flops_rate": 5e10,
    "half_work": 2e6,
    "op_overhead": 4e-6,
    "elementwise_rate": 4e8,
    "instr_overhead": 1.2e-4,
    "optimizer_rate": 1e9,
    "conv_rate": 3e10,
    "conv_half_work": 6e6,
}


@pytest.fixture
def measured(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    """A cache of its own; made-up measurements (messages dearer between more ranks), each
    count measured listed in the order measured."""
    monkeypatch.setenv("PIPECOMPILE_CACHE", str(tmp_path))
    monkeypatch.delenv("PIPECOMPILE_CALIBRATION", raising=False)
    monkeypatch.setattr(calibration_quality, "TRIES", 1)
    counts: list[object] = []
    quiet = Quality(0.0, {})

    def constants(threads: int) -> tuple[dict[str, float], Quality]:
        counts.append(f"{threads} threads")
        return dict(CONSTANTS), replace(quiet, taken=float(int(time.time())))

    def messages(devices: int, threads: int) -> tuple[dict[str, float], Quality]:
        counts.append(devices)
        figures = {"message_latency": 1e-5 * devices, "bandwidth": 4e9 / devices}
        return figures, replace(quiet, taken=float(int(time.time())))

    monkeypatch.setattr(calibrate, "_measured_constants", constants)
    monkeypatch.setattr(calibration_messages, "_measured_messages", messages)
    monkeypatch.setattr(calibration_messages, "load_now", lambda: 0.0)
    return counts
