"""The background quick runs see the session's starting environment, not a test's changes,
and their times are kept for the session's closing line."""

from __future__ import annotations

import signal
import time
from concurrent.futures import CancelledError
from pathlib import Path

import pytest

from tests.tools.background import ROOT, QuickRuns


def test_a_run_started_later_does_not_inherit_a_tests_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = tmp_path / "first.py"
    first.write_text("import time\ntime.sleep(0.5)\nprint('first')\n")  # holds the one worker
    second = tmp_path / "second.py"
    second.write_text("import os\nprint(os.environ.get('PIPECOMPILE_FAULT', 'unset'))\n")
    runs = QuickRuns()
    monkeypatch.delenv("PIPECOMPILE_FAULT", raising=False)
    runs.start([first, second], at_once=1)
    monkeypatch.setenv("PIPECOMPILE_FAULT", "1:1B2:hang")  # as a test does meanwhile
    try:
        assert runs.result(first).stdout.strip() == "first"
        assert runs.result(second).stdout.strip() == "unset"
    finally:
        runs.stop()
    # each finished run's time is kept and summed in the session's closing line
    assert set(runs.seconds) == {first, second} and runs.seconds[first] >= 0.5
    line = runs.summary()
    assert line.startswith("background runs: 2 in ") and "first " in line and "second " in line


def test_stop_kills_what_runs_and_cancels_what_waits(tmp_path: Path) -> None:
    started = tmp_path / "started"
    slow = tmp_path / "slow.py"
    touch = f"pathlib.Path({str(started)!r}).touch()"
    slow.write_text(f"import pathlib, time\n{touch}\ntime.sleep(60)\n")
    runs = QuickRuns()
    runs.start([slow, tmp_path / "never.py"], at_once=1)
    deadline = time.monotonic() + 60
    while not started.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    runs.stop()  # returns once the sleeping run is killed
    assert runs.result(slow).returncode == -signal.SIGKILL
    with pytest.raises(CancelledError):
        runs.result(tmp_path / "never.py")


def test_a_forked_script_runs_as_python_runs_it(tmp_path: Path) -> None:
    """Forked from the warm process, a script is ``__main__`` with its argv, its folder first on
    ``sys.path`` for its own imports, and the exit status and stderr the interpreter gives."""
    (tmp_path / "helper.py").write_text("WORD = 'found'\n")
    script = tmp_path / "script.py"
    script.write_text(
        "import os, sys\nfrom helper import WORD\n"
        "print(__name__, sys.argv[1:], WORD, os.getcwd())\n"
        "if __name__ == '__main__':\n    sys.exit('stopped with a message')\n"
    )
    runs = QuickRuns()
    runs.start([script], at_once=1)
    try:
        done = runs.result(script)
    finally:
        runs.stop()
    assert done.stdout.split() == ["__main__", "['--quick']", "found", str(ROOT)]
    assert done.returncode == 1 and done.stderr.strip() == "stopped with a message"
