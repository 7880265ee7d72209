"""`--devices N --tune K` end to end: the calibration is measured once and kept, the K best
plans are trained on their ranks, the table shows predicted against measured, and the
emitted plan is the measured best; a plan measured more than 2x off its prediction, either
way, is warned of (made-up figures)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from pipecompile.ir.records.manifest import read_manifest
from pipecompile.ir.records.plan_record import PlanRecord
from pipecompile.planner import calibration_quality
from pipecompile.planner.calibrate import record_path
from pipecompile.planner.tune import far_off
from pipecompile.surfaces.cli import main
from tests.conftest import EXAMPLES


def test_tune_emits_the_measured_best_and_learns_the_scale(
    tmp_path: Path, capsys, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv("PIPECOMPILE_CALIBRATION")  # calibrated (once per session), then tuned
    monkeypatch.setattr(calibration_quality, "TRIES", 1)  # a busy machine measures once too
    out = tmp_path / "out"
    status = main([str(EXAMPLES / "mlp.py"), "--devices", "2", "--tune", "2", "-o", str(out)])
    printed = capsys.readouterr()
    assert status == 0, printed.err
    plan = read_manifest(out).plan
    assert plan is not None and len(plan.tuned) == 2
    measured = [t.measured_step_s for t in plan.tuned]
    assert all(m > 0 for m in measured)
    assert plan.measured_step_s == min(measured)
    chosen = next(t for t in plan.tuned if t.measured_step_s == min(measured))
    assert chosen.flags == plan.chosen.flags
    # the record reads back as it was written
    assert PlanRecord.from_json(plan.as_json()) == plan
    assert "measured" in printed.out and "the measured best of the 2 tuned" in printed.out
    assert sum(line.startswith("  tune ") for line in printed.err.splitlines()) == 2
    # the search timed the model itself and corrected the calibration by it
    assert "the model timed eagerly on " in printed.err or "eager timing on " in printed.err
    factors = (plan.cost_model["fixed_scale"], plan.cost_model["work_scale"])
    assert all(0 < f <= 8 for f in factors) and factors != (1.0, 1.0), factors
    # The calibration is kept where PIPECOMPILE_CACHE says, with the learned ratio.
    assert record_path().parent == Path(os.environ["PIPECOMPILE_CACHE"])
    records = json.loads(record_path().read_text())
    scales = [s for r in records.values() for k, s in r.get("step_scale", {}).items()
              if k.split("/")[0] == "2"]  # fmt: skip  # "2/MODEL": learned for this model
    assert scales and all(s > 0 for s in scales), records


def test_tune_without_a_search_is_refused(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    status = main([str(EXAMPLES / "mlp.py"), "--stages", "2", "--tune", "2", "-o", str(tmp_path)])
    err = capsys.readouterr().err
    assert status == 2 and err.startswith("pipecompile: error: --tune 2 measures the best plans")


def test_a_step_measured_far_from_its_prediction_is_warned_of() -> None:
    off = far_off("2 (2 stages, 4 micro-batches, 1f1b)", 0.695, 0.0073)
    assert off == (
        "--tune: plan 2 (2 stages, 4 micro-batches, 1f1b) was predicted at 695.0 ms a step "
        "but measured 7.3 ms, 95.2x less than predicted: the machine's calibration is likely "
        "off (one measured on a busy machine?). See it with `pipecompile calibration`; clear "
        "it with `pipecompile calibration --clear` and search again on a quiet machine"
    )
    slower = far_off("1 (1 stages, 2 micro-batches, gpipe)", 0.010, 0.025)
    assert slower is not None and "measured 25.0 ms, 2.5x more than predicted" in slower
    assert far_off("1", 0.010, 0.019) is None and far_off("1", 0.010, 0.0051) is None
    assert far_off("1", 0.010, 0.020) is None and far_off("1", 0.0, 0.5) is None  # at 2x: fine
