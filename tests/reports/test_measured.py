"""`show --measured`: the breakdown of a trace counts each span for the step that holds it
(never a negative "other"), gives every data-parallel copy's ranks their device's predicted
bubble, and says when the only traced step is the warm-up one. Traces are made here from
spans, as a run's ranks gather them (a real `--dp 2` trace: tests/runtime/test_mesh.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pipecompile.ir.programs.topology import topology_from_manifest
from pipecompile.reports.measured import COLUMNS, format_measured, measured_report
from pipecompile.runtime.load import read_manifest, read_program
from pipecompile.runtime.timeline_file import trace_document

MS = 1_000_000  # ns


def _span(
    rank: int, name: str, category: str, start: float, end: float, step: int, **args: Any
) -> dict[str, Any]:
    track = "step" if category == "step" else "compute"
    return {
        "rank": rank,
        "device": rank % 2,
        "track": track,
        "name": name,
        "category": category,
        "start": int(start * MS),
        "end": int(end * MS),
        "step": step,
        "args": args,
    }


def _step(rank: int, step: int, at: float) -> list[dict[str, Any]]:
    """One 10 ms step of ``rank`` (device rank % 2) from ``at`` ms: a forward and a backward of
    each micro-batch, 4 ms of compute in all; then an evaluation's forward after the step."""
    j = rank % 2
    spans = [_span(rank, f"step {step}", "step", at, at + 10, step)]
    for i in (0, 1):
        ids = {"stage": j, "microbatch": i}
        spans.append(_span(rank, f"{j}F{i}", "forward", at + 1 + i, at + 1.5 + i, step, **ids))
        spans.append(_span(rank, f"{j}B{i}", "backward", at + 5 + i, at + 6.5 + i, step, **ids))
    spans.append(_span(rank, f"{j}F0", "forward", at + 11, at + 14, step, stage=j, microbatch=0))
    return spans


def _trace(directory: Path, path: Path, steps: list[int], ranks: int = 4) -> Path:
    """A trace of ``ranks`` ranks (2 copies of the 2-device pipeline with 4) over ``steps``."""
    manifest = read_manifest(directory)
    program = read_program(directory / manifest.program)
    spans = [s for r in range(ranks) for k, n in enumerate(steps) for s in _step(r, n, 20 * k)]
    document = trace_document(
        spans, program, topology_from_manifest(manifest), one_process=False, traced_steps=steps
    )
    path.write_text(json.dumps(document))
    return path


@pytest.fixture(scope="module")
def mlp(compiled_examples: dict[tuple[str, int], Path]) -> Path:
    return compiled_examples[("mlp", 2)]


def test_a_span_counts_for_the_step_that_holds_it(mlp, tmp_path):
    report = measured_report(mlp, _trace(mlp, tmp_path / "t.json", [1, 2, 3]))
    assert report["steps"] == [2, 3] and not report["warm_up_only"]
    for figures in report["rows"].values():
        assert figures["step"] == pytest.approx(10) and figures["compute"] == pytest.approx(4)
        assert figures["other"] == pytest.approx(6)  # the evaluation's 3 ms are not the step's
        assert sum(figures[c] for c in COLUMNS) == pytest.approx(figures["step"])
    assert report["spans_outside_steps"] == 4 * 2  # one per rank and counted step
    assert "8 spans outside their step (recorded between steps" in format_measured(report)


def test_every_copys_ranks_get_their_devices_predicted_bubble(mlp, tmp_path):
    path = _trace(mlp, tmp_path / "t.json", [1, 2])
    report = measured_report(mlp, path)
    assert report["row_devices"] == {0: 0, 1: 1, 2: 0, 3: 1}
    rows = format_measured(report).splitlines()[3:7]
    predicted = [f"{report['predicted_bubble'][d]:.1%}" for d in (0, 1, 0, 1)]
    assert [row.split()[-1] for row in rows] == predicted and "-" not in rows[2].split()
    # a trace written before traces named each row's device: read from the row's name
    document = json.loads(path.read_text())
    del document["otherData"]["row_devices"]
    path.write_text(json.dumps(document))
    assert measured_report(mlp, path)["row_devices"] == {0: 0, 1: 1, 2: 0, 3: 1}


def test_a_trace_of_the_warm_up_step_alone_says_so(mlp, tmp_path):
    report = measured_report(mlp, _trace(mlp, tmp_path / "t.json", [1], ranks=2))
    assert report["warm_up_only"] and report["steps"] == [1]
    text = format_measured(report).splitlines()
    assert text[1].startswith("step 1 is the only traced step, the warm-up one")
    assert "trace 2 steps or more" in text[1]
