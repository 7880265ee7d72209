"""One door: every refusal of a run's options meets the job at every door that can express it.

tools/qa/doors.py gives each of the catalogue's runs that `pipecompile run` refuses before it
runs anything to the job a rank builds from its argv (what the worker does under torchrun),
to ``fit()`` where its options are keywords of it, and to the worker module under a real
``torchrun`` (two cases in the default run, every case with ``PIPECOMPILE_ALL_CASES=1``).
Every door must say what `run` says: a refusal made at one door and not at another fails
here. The cases' directories are the catalogue test's own (prepared once, left as they were
by a refusal).
"""

from __future__ import annotations

import pytest

from tests.conftest import ALL_CASES, ROOT, catalogue_tool, load_tool

catalogue_tool()  # the catalogue the door tool reads, loaded once
doors = load_tool(ROOT / "tools" / "qa" / "doors.py")


@pytest.mark.parametrize("case", doors.RUN_CASES, ids=lambda c: c.id)
def test_a_refusal_is_made_at_every_door(case, catalogue_workspace):
    torchrun = ALL_CASES or case.id in doors.TORCHRUN_SAMPLE
    row = doors.judge(case, catalogue_workspace, torchrun=torchrun)
    if row.run is None:
        pytest.skip("refused while running (the loop every door shares), not at the door")
    assert not row.differ, doors.table([row])
    if torchrun and doors.NOT_AT.get(case.id, ("",))[0] != "rank":
        assert "torchrun" in row.doors


def test_the_sample_covers_the_issues_own_cases():
    """The torchrun sample holds a mesh refusal (the shard that trained silently wrong under
    torchrun) and a fault that could never fire; the doors a case cannot reach are few and
    named."""
    ids = {c.id for c in doors.RUN_CASES}
    assert set(doors.TORCHRUN_SAMPLE) <= ids and set(doors.NOT_AT) <= ids
    assert len(doors.NOT_AT) <= 10


def test_the_rank_door_refuses_what_run_refuses_and_is_no_stub(catalogue_workspace):
    """The comparison can fail: an option the rank accepts (a run with nothing wrong) reads
    ACCEPTED, which no refusal of `run` equals."""
    case = next(c for c in doors.RUN_CASES if c.id == "save-every-without-save")
    d = catalogue_workspace.prepare(case)
    fine = doors.Case("fine", "", case.setup, ("run", "out", "-q", "--save-every", "2",
                                                "--save", "ck"), "")  # fmt: skip
    assert doors.rank_door(fine, d) == doors.ACCEPTED
    assert doors.rank_door(case, d).startswith(doors.ERROR + "--save-every needs --save")
