"""Every mistake in tools/qa/bad_inputs.py's catalogue gets a short, clear message, no traceback.

Each case runs in this process through ``pipecompile.surfaces.cli.main`` (a `--nproc` case still
starts its ranks); the tool's own subprocess mode, as a user runs it, is checked on two of its
``--quick`` cases and on the sampled cases that need a process of their own (their verdicts
are read from that command's table). docs/ERRORS.md is generated from the same catalogue.
"""

from __future__ import annotations

import json
import os
import sys

import pytest

from tests.conftest import ROOT, catalogue_tool
from tests.tools.background import RUNS

TOOL = ROOT / "tools" / "qa" / "bad_inputs.py"


bad_inputs = catalogue_tool()
setups = sys.modules["catalogue.case"]  # the setups, loaded with the tool


@pytest.fixture(scope="module")
def workspace(catalogue_workspace):  # type: ignore[no-untyped-def]
    """The catalogue's bases and cases, prepared once (tests/test_doors.py shares them)."""
    return catalogue_workspace


# A case that starts ranks (`--nproc`) or a process of its own costs 8-14 s; 24 of them would
# be a third of the suite. This fixed sample runs on every test run: one or two per area that
# has such cases, in this process and in a process of its own. The rest are skipped here (set
# PIPECOMPILE_ALL_CASES=1 to run them); `python tools/qa/bad_inputs.py` runs the full catalogue.
# save-full-disk-nproc is tests/runtime/test_distributed.py's full-disk test; nproc-data-sharded-
# by-rank is test_distributed_data.py's agreement test; hook-one-shot-nproc,
# nproc-unseeded-shuffle and nproc-hook-blocks are tests/runtime/test_run_data.py's and
# test_distributed_data.py's own launches; every kind of setup runs in a cheaper case too.
SAMPLED = (
    "nproc-zero",  # basics: refused before any rank starts
    "nproc-stage-syntax-error",  # basics: a damaged stage file, in this process
    "nproc-weights-truncated",  # basics: damaged weights
    "check-nproc-precision",  # asked: --check under --nproc
    "hook-empty-nproc",  # asked: a data hook, in a process of its own
    "nproc-hook-raises-one-rank",  # ranks: a line from each rank
    "generate-nproc-not-stages",  # generating: refused before any rank starts
    # doors: faults that could never fire, refused before any rank starts
    "fault-rank-beyond",
    "fault-no-such-instruction",
    "fault-after-the-last-step",
    "fault-save-without-save",
    "fault-save-not-saved",
    "fault-before-the-resumed-step",
    "fault-unreadable",
    "generate-fault-rank-0",
    "generate-fault-at-instruction",
    "coupling-loss-dp",  # coupling: --dp splitting a whole-batch loss, refused before any rank
)
ALL_CASES = os.environ.get("PIPECOMPILE_ALL_CASES") == "1"


def _costly(case) -> bool:  # type: ignore[no-untyped-def]
    return case.own_process or "--nproc" in case.argv


def _params(cases):  # type: ignore[no-untyped-def]
    skip = pytest.mark.skip(reason="not in SAMPLED: python tools/qa/bad_inputs.py runs it")
    return [
        pytest.param(c, id=c.id, marks=() if ALL_CASES or not _costly(c) or c.id in SAMPLED
                     else skip)
        for c in cases
    ]  # fmt: skip


@pytest.mark.parametrize("case", _params(bad_inputs.CASES))
def test_case(case, workspace):
    if case.id in AS_A_USER:  # run by the background command of test_quick_subset_...
        verdict = _subset_verdicts().get(case.id)
        assert verdict == "clear", _subset().stdout + _subset().stderr
        return
    outcome = bad_inputs.run_case(case, workspace, in_process=True)
    if outcome.verdict == "skipped":
        pytest.skip(outcome.reason)
    assert outcome.clear, bad_inputs.show(outcome)


def test_case_ids_are_unique():
    ids = [case.id for case in bad_inputs.CASES]
    assert len(ids) == len(set(ids))


def test_the_sample_runs_ranks_of_every_area_that_has_them():
    costly = {case.id: area for area, cases in bad_inputs.AREAS.items() for case in cases
              if _costly(case)}  # fmt: skip
    assert set(SAMPLED) <= set(costly), set(SAMPLED) - set(costly)
    covered = {costly[i] for i in SAMPLED} | {"files"}  # files: the full-disk test in runtime/
    assert covered == set(costly.values())


QUICK_TWO = ("stage-syntax-error", "steps-zero")  # a run's error and a usage error
# The sampled cases that need a process of their own anyway (own_process: their ranks write
# on file descriptor 2): they run in the tool's command below, and test_case reads its verdict.
AS_A_USER = ("hook-empty-nproc", "nproc-hook-raises-one-rank")


SUBSET_JOB = "bad_inputs.py, four cases"  # its key in the background runs


def subset_command() -> list[str]:
    """The tool's command line for two of its --quick cases and the AS_A_USER ones, two at
    once."""
    only = [arg for case in (*QUICK_TWO, *AS_A_USER) for arg in ("--only", case)]
    return [sys.executable, str(TOOL), *only, "--jobs", "2"]


def _subset():  # type: ignore[no-untyped-def]
    return RUNS.result(SUBSET_JOB, subset_command())


def _subset_verdicts() -> dict[str, str]:
    """Each case's verdict in the command's table (``case  verdict  exit  message``)."""
    ids = {*QUICK_TWO, *AS_A_USER}
    rows = [line.split() for line in _subset().stdout.splitlines()]
    return {row[0]: row[1] for row in rows if len(row) > 1 and row[0] in ids}


def test_quick_subset_as_a_user_runs_it():
    """The tool's command line, each case in a `pipecompile` process of its own, two at once:
    two of the --quick cases (each --quick case also runs above, in this process) and the
    sampled cases that need a process of their own. The command runs in the background from
    the start of the session (tests/conftest.py)."""
    quick = [case.id for case in bad_inputs.select(bad_inputs.CASES, [], quick=True)]
    assert set(QUICK_TWO) <= set(quick) and len(quick) < len(bad_inputs.CASES) / 4, quick
    assert set(AS_A_USER) <= set(SAMPLED)
    assert all(c.own_process for c in bad_inputs.CASES if c.id in AS_A_USER)
    result = _subset()
    assert result.returncode == 0, result.stdout + result.stderr
    assert _subset_verdicts() == dict.fromkeys((*QUICK_TWO, *AS_A_USER), "clear"), result.stdout
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith("4 cases tried: 4 clear"), result.stdout
    assert "0 traceback, 0 wrong exit, 0 unclear" in last, result.stdout
    assert "0 silently wrong, 0 data lost, 0 hang" in last, result.stdout


def test_a_traceback_is_classified_as_such():
    case = bad_inputs.Case("x", "did", setups.nothing, (), "anything")
    outcome = bad_inputs.Outcome(case, 1, "", "Traceback (most recent call last):\nValueError: x\n")
    assert bad_inputs.judge(case, outcome).verdict == "traceback"
    long = bad_inputs.Outcome(case, 2, "", "pipecompile: error: anything\nmore\nand more\n")
    assert bad_inputs.judge(case, long).verdict == "unclear"
    wrong = bad_inputs.Outcome(case, 1, "", "pipecompile: error: anything\n")
    assert bad_inputs.judge(case, wrong).verdict == "wrong exit"
    good = bad_inputs.Outcome(case, 2, "", "\npipecompile: error: anything\n")
    assert bad_inputs.judge(case, good).verdict == "clear"
    silent = bad_inputs.Outcome(case, 0, "", "")
    assert bad_inputs.judge(case, silent).verdict == "silently wrong"
    hung = bad_inputs.Outcome(case, bad_inputs.HANG, "", "pipecompile: error: anything\n")
    assert bad_inputs.judge(case, hung).verdict == "hang"


def test_a_case_that_does_not_stop_is_judged_a_hang(tmp_path):
    """The detector itself: a model file whose import sleeps, run with a 3 s limit."""
    case = bad_inputs.Case(
        "sleeps", "a model file that sleeps on import",
        setups.write("model.py", "import time\ntime.sleep(600)\n"),
        ("model.py", "--stages", "2", "-o", "o"), "anything", base=None, timeout=3.0,
    )  # fmt: skip
    outcome = bad_inputs.run_case(case, bad_inputs.Workspace(tmp_path), in_process=False)
    assert outcome.verdict == "hang", bad_inputs.show(outcome)


def test_a_changed_user_file_is_classified_as_data_lost(workspace):
    """The detector itself: a recompile replaces an edited stage file (pipecompile's own, which
    it restores on purpose), here declared the user's."""
    case = bad_inputs.Case(
        "overwrite-on-purpose", "recompile over an edited out/stage_0.py",
        setups.edit("out/stage_0.py", "import torch", "import torch  # my edit"),
        ("mlp.py", "--stages", "2", "--microbatches", "2", "-q", "-o", "out"), r"^$", status=0,
        intact=("out/stage_0.py",),
    )  # fmt: skip
    outcome = bad_inputs.run_case(case, workspace, in_process=True)
    assert outcome.status == 0 and outcome.verdict == "data lost", bad_inputs.show(outcome)


def test_verdicts_per_area_from_recorded_json(tmp_path, capsys):
    """--areas reads what --json recorded, before -> now per area, and runs nothing."""
    first, second = bad_inputs.AREAS["files"][0].id, bad_inputs.AREAS["asked"][0].id
    before, now = tmp_path / "before.json", tmp_path / "now.json"
    row = {"exit": 2, "reason": "", "lines": []}
    before.write_text(json.dumps([{**row, "id": first, "verdict": "data lost"},
                                  {**row, "id": second, "verdict": "silently wrong"}]))  # fmt: skip
    now.write_text(json.dumps([{**row, "id": first, "verdict": "clear"},
                               {**row, "id": second, "verdict": "clear"}]))  # fmt: skip
    assert bad_inputs.main(["--areas", str(now), "--before", str(before)]) == 0
    table = capsys.readouterr().out
    assert "| files | 1 | 0 -> 1 |" in table and "| asked | 1 | 0 -> 1 |" in table
    assert "| all | 2 | 0 -> 2 | 0 -> 0 | 0 -> 0 | 0 -> 0 | 1 -> 0 | 1 -> 0 | 0 -> 0 |" in table
