"""Where a run writes (--save, --metrics) is checked before it trains; another run's
saved train state is never replaced unasked; a save the disk refuses loses no training."""

from __future__ import annotations

import errno
import json
import shutil
from pathlib import Path

import pytest
from torch.distributed.checkpoint import FileSystemWriter

from pipecompile.runtime.training.metrics import Reporter
from pipecompile.surfaces.cli import main
from tests.conftest import EXAMPLES


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("places") / "mlp"
    assert main([str(EXAMPLES / "mlp.py"), "--stages", "2", "-q", "-o", str(target)]) == 0
    return target


def _run(out: Path, *argv: str) -> int:
    return main(["run", str(out), "-q", "--steps", "2", *argv])


def test_another_runs_train_state_is_refused_unless_resumed_or_forced(out, tmp_path, capsys):
    ck = tmp_path / "ck"
    assert _run(out, "--save", str(ck)) == 0
    first = (ck / "step_2" / "__0_0.distcp").read_bytes()
    assert _run(out, "--save", str(ck)) == 2
    err = capsys.readouterr().err
    assert f"--save {ck} holds another run's train state (step_2)" in err
    assert f"--resume {ck}" in err and "--force" in err and len(err.splitlines()) == 1
    assert (ck / "step_2" / "__0_0.distcp").read_bytes() == first
    assert (
        main(["run", str(out), "-q", "--steps", "3", "--resume", str(ck), "--save", str(ck)]) == 0
    )
    assert (ck / "latest").read_text() == "step_3\n"
    capsys.readouterr()
    assert _run(out, "--save", str(ck), "--force") == 0
    assert "pipecompile: note: --force: the saved steps in" in capsys.readouterr().err
    assert (ck / "latest").read_text() == "step_2\n"


def test_what_is_not_a_saved_step_is_never_replaced(out, tmp_path, capsys):
    ck = tmp_path / "ck"
    (ck / "step_2").mkdir(parents=True)
    (ck / "step_2" / "notes.txt").write_text("mine")
    assert _run(out, "--save", str(ck), "--force") == 2
    assert "holds step_2/, which pipecompile did not write" in capsys.readouterr().err
    assert (ck / "step_2" / "notes.txt").read_text() == "mine"
    other = tmp_path / "other"
    other.mkdir()
    (other / "latest").write_text("my latest news\n")
    assert _run(out, "--save", str(other), "--force") == 2
    assert "holds latest, which" in capsys.readouterr().err
    (other / "latest").unlink()
    (other / "notes.txt").write_text("mine")  # beside the saved steps: kept, no name collides
    assert _run(out, "--save", str(other)) == 0
    assert (other / "notes.txt").read_text() == "mine" and (other / "step_2").is_dir()


@pytest.mark.parametrize("where", ["file", "under_file"])
def test_a_save_place_that_is_no_directory_is_refused_before_training(out, tmp_path, capsys, where):
    blocker = tmp_path / "notes.txt"
    blocker.write_text("mine")
    metrics = tmp_path / "m.jsonl"
    target = blocker if where == "file" else blocker / "ck"
    assert _run(out, "--save", str(target), "--metrics", str(metrics)) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"pipecompile: error: cannot write train state to {target}")
    assert len(err.splitlines()) == 1 and not metrics.exists()  # before any step
    assert blocker.read_text() == "mine"


def test_a_users_file_as_metrics_is_refused_and_a_runs_is_appended_to(out, tmp_path, capsys):
    mine = tmp_path / "notes.jsonl"
    mine.write_text("my notes\n")
    assert _run(out, "--metrics", str(mine)) == 2
    assert "cannot append metrics to" in capsys.readouterr().err
    assert mine.read_text() == "my notes\n"
    ours = tmp_path / "m.jsonl"
    assert _run(out, "--metrics", str(ours)) == 0 and _run(out, "--metrics", str(ours)) == 0
    assert sum(json.loads(line)["kind"] == "start" for line in ours.read_text().splitlines()) == 2


def test_a_full_disk_mid_run_names_the_last_saved_step_and_keeps_the_step(
    out, tmp_path, capsys, monkeypatch
):
    ck = tmp_path / "ck"
    real = FileSystemWriter.write_data

    def fills_up(writer, plan, planner):  # type: ignore[no-untyped-def]
        if ".step_2.tmp" in str(writer.path) and Path(writer.path).is_relative_to(ck):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(writer, plan, planner)

    monkeypatch.setattr(FileSystemWriter, "write_data", fills_up)
    assert (
        main(["run", str(out), "-q", "--steps", "3", "--save", str(ck), "--save-every", "1"]) == 2
    )
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[0] == (
        f"pipecompile: error: cannot write train state step_2 to {ck}: the disk is full; free "
        "space there or choose another place"
    )
    assert len(lines) == 2 and f"the last complete saved step there is {ck / 'step_1'}" in lines[1]
    rescue = Path(lines[1].split("--resume ")[1].split()[0])
    assert (ck / "latest").read_text() == "step_1\n" and not list(ck.glob(".step_*"))
    assert (rescue / "latest").read_text() == "step_2\n"
    monkeypatch.undo()
    assert main(["run", str(out), "-q", "--steps", "3", "--resume", str(rescue)]) == 0
    shutil.rmtree(rescue)


def test_a_full_disk_while_writing_metrics_warns_and_goes_on(tmp_path, capsys):
    reporter = Reporter(tmp_path / "m.jsonl", 2, quiet=True)
    reporter.record({"kind": "start"})

    class Full:
        def write(self, *text: str) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

        close = flush = write

    reporter._file = Full()  # type: ignore[assignment]
    reporter.record({"kind": "train"})
    reporter.record({"kind": "train"})  # nothing more is tried
    err = capsys.readouterr().err
    assert err.count("pipecompile: warning: cannot write metrics to") == 1
    assert "the disk is full" in err and "goes on without them" in err
