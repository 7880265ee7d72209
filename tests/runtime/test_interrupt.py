"""Ctrl-C and SIGTERM stop a run: every process ends (without waiting for a timeout), one line
is printed, the exit status is 130, `latest` names a complete step and no temporary file is left."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipecompile.runtime.pipeline import Pipeline
from pipecompile.runtime.process.interrupt import interrupted_line
from pipecompile.runtime.training.train_state import save
from tests.conftest import SAMPLED_OUT
from tests.runtime.test_distributed import MLP, compile_to

pytestmark = pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds processes in /proc")

STEPS = 100000
STOP_S = 120.0  # the most a stopped run may take to end: a hang guard, not a speed test
START_S = 90.0  # the most a run may take to write its first checkpoint


@pytest.fixture(scope="module")
def mlp(tmp_path_factory: pytest.TempPathFactory) -> str:
    return compile_to(tmp_path_factory.mktemp("mlp"), MLP, "--stages", "2", "--microbatches", "4")


def start(out: str, ck: Path, *options: str) -> subprocess.Popen:
    """`pipecompile run` saving every step, in a session of its own (so its group can be
    signalled as a terminal's Ctrl-C does)."""
    command = [sys.executable, "-m", "pipecompile", "run", out, *options, "--steps", str(STEPS),
               "--save", str(ck), "--save-every", "1", "-q"]  # fmt: skip
    return subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        start_new_session=True, env={**os.environ, "PYTHONFAULTHANDLER": "1"},
        preexec_fn=_ctrl_c_as_in_a_terminal,
    )  # fmt: skip


def _ctrl_c_as_in_a_terminal() -> None:
    """In the child before it starts: Ctrl-C's default action. A suite started in the
    background by a shell (``pytest &``) ignores SIGINT, every child inherits that, and Python
    then leaves it ignored: the run would never see the signal the test sends."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run_processes(ck: Path) -> list[int]:
    """Live processes of the run: the command, the launcher and the ranks name ``ck``."""
    pids = []
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{name}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if str(ck) in cmdline and int(name) != os.getpid():
            pids.append(int(name))
    return pids


def stop(proc: subprocess.Popen, ck: Path, send) -> tuple[str, float]:  # type: ignore[no-untyped-def]
    """Wait for the first checkpoint, ``send`` the signal; returns stderr and the seconds the
    run took to end (one that does not end fails the test with its threads' stacks). Whatever
    happens, nothing of the run outlives the test."""
    try:
        deadline = time.monotonic() + START_S
        while not (ck / "latest").is_file():
            assert proc.poll() is None, f"the run ended early: {proc.communicate()[1]}"
            assert time.monotonic() < deadline, f"no checkpoint after {START_S:g} s"
            time.sleep(0.05)
        sent = time.monotonic()
        send()
        try:
            _, err = proc.communicate(timeout=STOP_S)
        except subprocess.TimeoutExpired:  # a hang: where each thread of the command waits
            os.kill(proc.pid, signal.SIGABRT)  # faulthandler prints every thread's stack
            _, err = proc.communicate(timeout=STOP_S)
            pytest.fail(f"the run did not end {STOP_S:g} s after the signal:\n{err[-6000:]}")
        return err, time.monotonic() - sent
    finally:
        for pid in [proc.pid, *run_processes(ck)]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait(timeout=STOP_S)


def assert_stopped_cleanly(proc: subprocess.Popen, err: str, ck: Path) -> None:
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    pattern = rf"pipecompile: interrupted at step \d+/{STEPS}; {re.escape(str(ck))}/latest is (\S+)"
    match = re.fullmatch(pattern, lines[0]) if len(lines) == 1 else None
    assert match is not None, err
    latest = (ck / "latest").read_text().strip()
    assert match[1] == latest
    assert (ck / latest / "meta.json").is_file()
    assert not list(ck.glob(".*.tmp")), "temporary files left"
    deadline = time.monotonic() + STOP_S
    while run_processes(ck) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not run_processes(ck), "processes of the run outlived it"


def sigint_everyone(proc: subprocess.Popen, ck: Path) -> None:
    """What `kill -INT` to every process does: the command, the launcher and the ranks."""
    for pid in {proc.pid, *run_processes(ck)}:  # once each: a second Ctrl-C means hurry
        os.kill(pid, signal.SIGINT)


@pytest.mark.parametrize(
    "how",
    [
        "ctrl-c-to-the-group",
        pytest.param("sigterm-to-the-command", marks=SAMPLED_OUT),  # the same path as Ctrl-C
        pytest.param("sigint-to-every-process", marks=SAMPLED_OUT),
    ],
)
def test_a_stopped_distributed_run_leaves_nothing_running(tmp_path, mlp, how):
    ck = tmp_path.resolve() / "ck"  # as `run --nproc` passes it on
    ck.mkdir()
    (ck / ".step_99.tmp").mkdir()  # a killed save's leftovers: removed too
    (ck / ".latest.tmp").write_text("step_99\n")
    proc = start(mlp, ck, "--nproc", "2")
    send = {
        "ctrl-c-to-the-group": lambda: os.killpg(proc.pid, signal.SIGINT),
        "sigterm-to-the-command": lambda: os.kill(proc.pid, signal.SIGTERM),
        "sigint-to-every-process": lambda: sigint_everyone(proc, ck),
    }[how]
    err, seconds = stop(proc, ck, send)
    assert_stopped_cleanly(proc, err, ck)
    assert seconds < STOP_S


def _children(parent: int) -> list[tuple[int, bytes]]:
    """The processes whose parent is ``parent``, with their command lines."""
    found = []
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
            cmdline = Path(f"/proc/{name}/cmdline").read_bytes()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == parent:
            found.append((int(name), cmdline))
    return found


def _forked_starter(proc: subprocess.Popen) -> None:
    """The command forked its rank starter from itself (no second interpreter: the starter's
    command line is the command's), and the ranks are the starter's children."""
    own = Path(f"/proc/{proc.pid}/cmdline").read_bytes()
    (starter, cmdline), *others = _children(proc.pid)
    assert not others and cmdline == own, _children(proc.pid)
    assert len(_children(starter)) == 2  # the ranks


def test_a_killed_command_takes_the_run_with_it(tmp_path, mlp):
    ck = tmp_path.resolve() / "ck"
    proc = start(mlp, ck, "--nproc", "2")

    def kill() -> None:
        _forked_starter(proc)
        os.kill(proc.pid, signal.SIGKILL)  # nothing can be passed on

    stop(proc, ck, kill)
    deadline = time.monotonic() + STOP_S
    while run_processes(ck) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not run_processes(ck), "the launcher or a rank outlived a killed `pipecompile`"
    latest = (ck / "latest").read_text().strip()
    assert (ck / latest / "meta.json").is_file()


@pytest.mark.parametrize(
    ("sig", "saves"),
    [(signal.SIGINT, ()), (signal.SIGTERM, ("--async-save",))],
    ids=["sigint", "sigterm-background-saves"],
)
def test_a_stopped_local_run_prints_one_line(tmp_path, mlp, sig, saves):
    """Either signal ends the run with one line; with --async-save the save in flight is
    never published: `latest` names a complete step and no temporary files are left."""
    ck = tmp_path.resolve() / "ck"  # as `run --nproc` passes it on
    proc = start(mlp, ck, *saves)
    err, seconds = stop(proc, ck, lambda: os.killpg(proc.pid, sig))
    assert_stopped_cleanly(proc, err, ck)
    assert seconds < STOP_S


WRITE_DATA = "torch.distributed.checkpoint.filesystem.FileSystemWriter.write_data"


def test_an_interrupted_save_keeps_latest_and_removes_its_files(tmp_path, mlp, monkeypatch):
    ck = tmp_path.resolve() / "ck"  # as `run --nproc` passes it on
    pipe = Pipeline.load(Path(mlp))
    save(pipe, ck, 1)

    def interrupted(*args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(WRITE_DATA, interrupted)
    with pytest.raises(KeyboardInterrupt):
        save(pipe, ck, 2)
    assert (ck / "latest").read_text().strip() == "step_1"
    assert sorted(p.name for p in ck.iterdir()) == ["latest", "step_1"]


def test_a_stop_the_writer_turns_into_its_own_error_is_still_a_stop(tmp_path, mlp, monkeypatch):
    """torch.save interrupted mid-write fails again closing its zip file ("unexpected pos"):
    the save still ends as a stop (exit 130, one line), not as that error's traceback."""
    ck = tmp_path.resolve() / "ck"
    pipe = Pipeline.load(Path(mlp))
    save(pipe, ck, 1)

    def interrupted_writer(*args: object) -> None:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            # as torch's writer does: raised while handling the stop, not from it
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos")  # noqa: B904

    monkeypatch.setattr(WRITE_DATA, interrupted_writer)
    with pytest.raises(KeyboardInterrupt):
        save(pipe, ck, 2)
    assert (ck / "latest").read_text().strip() == "step_1"
    assert sorted(p.name for p in ck.iterdir()) == ["latest", "step_1"]
    # an error that no stop caused stays that error
    monkeypatch.setattr(WRITE_DATA,
                        lambda *a: (_ for _ in ()).throw(RuntimeError("disk said no")))  # fmt: skip
    with pytest.raises(RuntimeError, match="disk said no"):
        save(pipe, ck, 2)


def test_any_command_stopped_inside_a_writer_ends_as_a_stop(monkeypatch, capsys):
    """The same at the top, for every command: an error raised while handling a stop is the
    stop (one line, 130); an error of its own is still a traceback."""
    from pipecompile.surfaces import cli, commands

    def stopped_writer(args: object) -> int:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise RuntimeError("unexpected pos 2112 vs 2004")  # noqa: B904 - as torch's writer

    monkeypatch.setattr(commands, "show", stopped_writer)
    assert cli.main(["show", "out"]) == 130
    assert capsys.readouterr().err == "pipecompile: interrupted\n"
    monkeypatch.setattr(commands, "show", lambda args: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        cli.main(["show", "out"])


def test_the_interrupted_line(tmp_path):
    assert interrupted_line(None, 10, None) == "pipecompile: interrupted"
    assert interrupted_line(4, 10, tmp_path) == (
        f"pipecompile: interrupted at step 5/10; {tmp_path} holds no saved step yet"
    )
    (tmp_path / "latest").write_text("step_4\n")
    assert interrupted_line(10, 10, tmp_path) == (
        f"pipecompile: interrupted after step 10/10; {tmp_path}/latest is step_4"
    )
