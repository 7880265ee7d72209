"""`pipecompile calibration` shows the kept calibrations with how they were measured, and
`--clear` removes them, saying what it removed or that nothing was kept (a cache of its own,
through PIPECOMPILE_CACHE)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipecompile.planner.calibration_quality import Quality
from pipecompile.planner.calibration_store import METHOD, read_records, write_records
from pipecompile.surfaces.cli import main
from tests.planner.test_calibrate import CONSTANTS

TAKEN = 1_764_000_000.0  # 2025-11-24 16:00 UTC
BUSY = Quality(0.6, {"op_overhead": 0.1, "instr_overhead": 0.3}, TAKEN).as_json()
QUIET = Quality(0.01, {}, TAKEN).as_json()
MESSAGES = {"message_latency": 1.5e-4, "bandwidth": 4e8}
KEY = "host/torch-2/cpu/2cores/1threads"


@pytest.fixture
def cache(tmp_path: Path, monkeypatch) -> Path:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("PIPECOMPILE_CACHE", str(tmp_path))
    return tmp_path / "calibration.json"


def _records() -> None:
    kept = {**CONSTANTS, "threads": 1, "method": METHOD, **BUSY}
    kept |= {"ranks": {"2": {**MESSAGES, **QUIET}}, "step_scale": {"2/abc": 1.25}}
    older = {**CONSTANTS, "threads": 2, "method": 2}
    damaged = {**kept, "ranks": {"2": {"bandwidth": "fast"}}}
    write_records({KEY: kept, "host/torch-1/cpu/2cores/2threads": older, "z/damaged": damaged})


def test_show_prints_each_record_with_its_load_and_spread(cache: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    _records()
    assert main(["calibration"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert (
        out[0] == f"calibrations kept in {cache} (`pipecompile calibration --clear` removes them):"
    )
    assert out[1] == (
        "host/torch-1/cpu/2cores/2threads: measured by an older pipecompile; the next search "
        "measures it again"
    )
    assert out[2] == (
        f"{KEY}: measured 2025-11-24 16:00:00 UTC, others kept 60% of the cores busy, worst "
        "spread 30% (instr_overhead)"
    )
    assert out[3].startswith(
        "  50.0 GFLOP/s (half that for 2e+06-FLOP matmuls), convolutions 30.0 GFLOP/s (half for "
        "6e+06-FLOP ones), 4.0 us an op"
    )
    assert out[4] == (
        "  2 ranks: message latency 150 us, bandwidth 0.40 GB/s; measured 2025-11-24 16:00:00 "
        "UTC, others kept 1% of the cores busy"
    )
    assert out[5] == "  --tune's measured / predicted for 2/abc: 1.25"
    assert out[6] == "  may be off: other programs kept 60% of the 2 cores busy (bound 25%)"
    assert out[7] == "z/damaged: damaged; `pipecompile calibration --clear` removes it"


def test_show_with_nothing_kept_says_so(cache: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["calibration"]) == 0
    assert capsys.readouterr().out == (
        f"no calibration kept in {cache} (none): the next plan search measures one\n"
    )


def test_clear_says_what_it_removed_or_that_nothing_was_kept(cache: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    _records()
    assert main(["calibration", "--clear"]) == 0
    assert capsys.readouterr().out == f"removed {cache} (3 calibrations)\n"
    assert not cache.exists() and read_records() == {}
    assert main(["calibration", "--clear"]) == 0
    assert capsys.readouterr().out == f"no calibration kept in {cache}: nothing to clear\n"
    cache.write_text("not json")  # a damaged file goes too
    assert main(["calibration", "--clear"]) == 0
    assert capsys.readouterr().out == f"removed {cache} (0 calibrations)\n"


def test_clear_that_cannot_remove_says_what_to_do(cache: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    cache.mkdir()  # no file to unlink, for root too
    assert main(["calibration", "--clear"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"pipecompile: error: cannot remove the kept calibrations {cache}: ")
    assert "remove it by hand, or point PIPECOMPILE_CACHE at a folder you can write" in err


def test_a_directory_given_to_calibration_is_refused(cache: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    _records()
    assert main(["calibration", "--clear", "out"]) == 2
    err = capsys.readouterr().err
    assert "`pipecompile calibration` takes no model or directory (got out)" in err
    assert cache.exists()  # nothing cleared


def test_the_cache_folder_follows_xdg_where_pipecompile_cache_is_not_set(monkeypatch, tmp_path):
    """The calibration and `--balance time`'s profiles share one root, the XDG convention's."""
    from pipecompile.passes.profile_costs import default_cache
    from pipecompile.planner.calibration_store import record_path

    monkeypatch.delenv("PIPECOMPILE_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert record_path() == tmp_path / "xdg" / "pipecompile" / "calibration.json"
    assert default_cache() == tmp_path / "xdg" / "pipecompile" / "profiles"
    monkeypatch.setenv("PIPECOMPILE_CACHE", str(tmp_path / "own"))
    assert record_path() == tmp_path / "own" / "calibration.json"
    assert default_cache() == tmp_path / "own" / "profiles"
    monkeypatch.delenv("PIPECOMPILE_CACHE")
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert record_path().parent == Path.home() / ".cache" / "pipecompile"
