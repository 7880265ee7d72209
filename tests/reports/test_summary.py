"""The compile summary's `predicted:` line prints a searched plan's step as the search priced
it, and no part of it from another cost model (which once came out larger than the whole)."""

from __future__ import annotations

from pipecompile.ir.records.manifest import read_manifest
from pipecompile.reports.plan_table import seconds_text
from pipecompile.surfaces.cli import main
from tests.conftest import EXAMPLES


def test_a_searched_plans_step_is_the_searchs_price(tmp_path, capsys):
    out = tmp_path / "out"
    assert main([str(EXAMPLES / "mlp.py"), "--devices", "2", "-o", str(out)]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("predicted:"))
    step = read_manifest(out).plan.chosen.predicted_step_s  # type: ignore[union-attr]
    assert f"step {seconds_text(step)} (the plan search's price" in line, line
    assert "of it" not in line, line
