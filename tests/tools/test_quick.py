"""Every script in tools/bench/ and tools/qa/ runs end to end in its ``--quick`` mode, so no
benchmark can rot.

Each script is found by a glob of both rooms (a new one is covered without touching this file)
and run as a user runs it, ``python tools/ROOM/X.py --quick``, in a subprocess with a time limit;
it must exit 0 and print something. A missing optional peer (torchgpipe, DeepSpeed) or Graphviz
is skipped by the script itself with a note. tools/qa/bad_inputs.py has its own test
(tests/test_bad_inputs.py); tools/bench/common.py, forked.py and
model_files.py are the benchmarks' shared helpers, no scripts.

The selected scripts run in the background from the moment collection ends
(tests/tools/background.py), overlapping the rest of the suite; the tests here read the results.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.tools.background import RUNS

ROOMS = ("bench", "qa")
NOT_RUN = {"bad_inputs.py", "common.py", "forked.py", "model_files.py"}  # test_bad_inputs; helpers
FOUND = sorted(p for room in ROOMS for p in (ROOT / "tools" / room).glob("*.py"))
SCRIPTS = [p for p in FOUND if p.name not in NOT_RUN]


def test_every_script_is_found() -> None:
    """Both rooms hold scripts, none is left loose in tools/, and every file globbed is a script
    (it runs as ``__main__``) or one of the known exceptions."""
    assert len(SCRIPTS) >= 13, [p.name for p in SCRIPTS]
    assert {p.parent.name for p in SCRIPTS} == set(ROOMS)
    assert not list((ROOT / "tools").glob("*.py")), "a script belongs in tools/bench or tools/qa"
    assert NOT_RUN <= {p.name for p in FOUND}
    for script in SCRIPTS:
        assert 'if __name__ == "__main__":' in script.read_text(), script


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_quick_mode_runs(script: Path) -> None:
    result = RUNS.result(script)
    shown = f"--- stdout\n{result.stdout[-3000:]}\n--- stderr\n{result.stderr[-3000:]}"
    assert result.returncode == 0, shown
    assert result.stdout.strip(), shown
