"""The catalogue's vocabulary: a ``Case``, its ``Outcome``, the setups that prepare a case's
directory, and the two ways of running ``pipecompile`` (in this process, or as a user does)."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import signal
import subprocess
import sys
import traceback
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
MLP = REPO / "examples" / "mlp.py"

Setup = Callable[[Path], None]


@dataclass(frozen=True)
class Case:
    """One mistake: ``setup`` prepares the case directory (a copy of ``base``), then
    ``pipecompile *argv`` runs in it and must exit with ``status`` and a message on stderr
    matching ``message`` (a regular expression, searched in the joined stderr lines)."""

    id: str
    did: str
    setup: Setup
    argv: tuple[str, ...]
    message: str
    status: int = 2
    base: str | None = "mlp"
    quick: bool = False
    max_lines: int = 2
    intact: tuple[str, ...] = ()  # files (in the case directory) that must not change
    own_process: bool = False  # always in a subprocess (it may hang, or prints on fd 2)
    timeout: float = 300.0  # seconds; a case still running then is judged a hang
    cleanup: Setup | None = None  # undoes what setup did outside the directory (an unmount)
    env: tuple[tuple[str, str], ...] = ()  # the command's environment adds these


class Unavailable(Exception):
    """Raised by a setup this machine cannot prepare (a small file system to fill needs
    root); the case is skipped, not judged."""


@dataclass
class Outcome:
    """What one case printed and how it is judged."""

    case: Case
    status: int
    stdout: str
    stderr: str
    verdict: str = ""
    reason: str = ""
    lines: list[str] = field(default_factory=list)

    @property
    def clear(self) -> bool:
        return self.verdict == "clear"


# -- setups ------------------------------------------------------------------------------


def nothing(_: Path) -> None:
    """The base directory as it is."""


def edit(path: str, old: str, new: str, count: int = 1) -> Setup:
    """A setup replacing ``old`` by ``new`` in the case directory's ``path``."""

    def run(d: Path) -> None:
        text = (d / path).read_text()
        if old not in text:
            raise AssertionError(f"{path} lacks {old!r}; the case needs updating")
        (d / path).write_text(text.replace(old, new, count))

    return run


def write(path: str, text: str) -> Setup:
    def run(d: Path) -> None:
        (d / path).parent.mkdir(parents=True, exist_ok=True)
        (d / path).write_text(text)

    return run


def truncate(path: str, keep: float) -> Setup:
    """Keep the first ``keep`` fraction of ``path``'s bytes."""

    def run(d: Path) -> None:
        data = (d / path).read_bytes()
        (d / path).write_bytes(data[: int(len(data) * keep)])

    return run


def delete(path: str) -> Setup:
    def run(d: Path) -> None:
        (d / path).unlink()

    return run


def copy(src: str, dst: str) -> Setup:
    def run(d: Path) -> None:
        shutil.copyfile(d / src, d / dst)

    return run


def compiled(
    setup: Setup, model: str = "model.py", out: str = "out", flags: tuple[str, ...] = ()
) -> Setup:
    """``setup`` (writing ``model``), then compile ``model`` into ``out`` as the base is (with
    ``flags`` added)."""

    def run(d: Path) -> None:
        setup(d)
        argv = [model, "--stages", "2", "--microbatches", "2", *flags, "-q", "-o", out]
        result = run_in_process(argv, d)
        if result.status != 0:
            raise AssertionError(f"compiling {model} failed:\n{result.stderr}")

    return run


def mlp_variant(*edits: tuple[str, str], name: str = "model.py") -> Setup:
    """Write examples/mlp.py with each (old, new) replaced to ``name``."""

    def run(d: Path) -> None:
        text = MLP.read_text()
        for old, new in edits:
            if old not in text:
                raise AssertionError(f"examples/mlp.py lacks {old!r}; the case needs updating")
            text = text.replace(old, new)
        (d / name).write_text(text)

    return run


def mkdir(path: str) -> Setup:
    def run(d: Path) -> None:
        (d / path).mkdir(parents=True, exist_ok=True)

    return run


def steps(*setups: Setup) -> Setup:
    """Each setup in turn."""

    def run(d: Path) -> None:
        for setup in setups:
            setup(d)

    return run


def ran(*argv: str) -> Setup:
    """A setup that runs ``pipecompile ARGV`` (it must succeed)."""

    def run(d: Path) -> None:
        result = run_in_process(argv, d)
        if result.status != 0:
            raise AssertionError(f"pipecompile {' '.join(argv)} failed:\n{result.stderr}")

    return run


# -- running ---------------------------------------------------------------------------


HANG = -9  # the status of a case stopped at its timeout


def run_subprocess(
    argv: Sequence[str], cwd: Path, timeout: float = 300.0, env: Sequence[tuple[str, str]] = ()
) -> Outcome:
    """``python -m pipecompile ARGV`` in ``cwd`` (its environment with ``env`` added), as a
    user runs it; a run still going after ``timeout`` seconds is killed with its process
    group and gets the status ``HANG``."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipecompile", *argv], cwd=cwd, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PIPECOMPILE_DEBUG": "", **dict(env)}, start_new_session=True,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return Outcome(_NO_CASE, HANG, out, err)
    return Outcome(_NO_CASE, proc.returncode, out, err)


def run_in_process(argv: Sequence[str], cwd: Path, env: Sequence[tuple[str, str]] = ()) -> Outcome:
    """``pipecompile.surfaces.cli.main(argv)`` in ``cwd`` (``env`` added to the environment
    while it runs) with stdout and stderr captured; an
    exception escaping main() is printed as the interpreter would and counts as status 1.
    Warnings are printed to the captured stderr as a fresh process would print them (a test
    runner's filters and earlier cases' once-only registries would otherwise hide them);
    output written straight to file descriptor 2, and logging handlers made before the
    capture, are missed: the subprocess mode sees them."""
    from pipecompile.surfaces.cli import main

    out, err = io.StringIO(), io.StringIO()
    with inside(cwd, env), warnings.catch_warnings(record=True) as caught:
        _default_filters()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            status = _call(main, argv)
    shown = "".join(
        warnings.formatwarning(w.message, w.category, w.filename, w.lineno) for w in caught
    )
    return Outcome(_NO_CASE, status, out.getvalue(), shown + err.getvalue())


@contextlib.contextmanager
def inside(cwd: Path, env: Sequence[tuple[str, str]] = ()) -> Iterator[None]:
    """In ``cwd``, with ``env`` added to the environment (both as they were afterwards)."""
    previous, before = Path.cwd(), {name: os.environ.get(name) for name, _ in env}
    os.environ.update(dict(env))
    os.chdir(cwd)
    try:
        yield
    finally:
        os.chdir(previous)
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _call(main: Callable[[list[str]], int], argv: Sequence[str]) -> int:
    try:
        return main(list(argv))
    except SystemExit as exit_:  # argparse
        return exit_.code if isinstance(exit_.code, int) else 1
    except BaseException:  # what the user would see as a traceback
        traceback.print_exc()
        return 1


def _default_filters() -> None:
    """Python's default warning filters, as a new process has them."""
    warnings.resetwarnings()
    warnings.simplefilter("default")
    for category in (DeprecationWarning, PendingDeprecationWarning, ImportWarning):
        warnings.simplefilter("ignore", category)
    warnings.filterwarnings("default", category=DeprecationWarning, module="__main__")


_NO_CASE = Case("", "", nothing, (), "")

# Command lines most cases share: `out/` is examples/mlp.py compiled into 2 stages.
RUN = ("run", "out", "-q")
CHECK = ("run", "out", "--check", "-q")
COMPILE = ("mlp.py", "--stages", "2", "-q")
INPUTS = "return (torch.randn(BATCH_SIZE, IN_FEATURES, generator=g),)"
TARGETS = "return (torch.randn(BATCH_SIZE, OUT_FEATURES, generator=g),)"
LOSS = 'return F.mse_loss(output, target, reduction="mean")'
FORWARD_RETURN = "return self.fc5(x)"


def small_disk(path: str, size: str = "64k") -> Setup:
    """Mount a ``size`` tmpfs at ``path`` in the case directory: a disk that fills up. Needs
    root (CI and the project's machines are); elsewhere the case is Unavailable. Pair it with
    ``cleanup=unmount(path)``."""

    def run(d: Path) -> None:
        (d / path).mkdir(parents=True, exist_ok=True)
        mount = ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(d / path)]
        done = subprocess.run(mount, capture_output=True, text=True)
        if done.returncode != 0:
            raise Unavailable(f"cannot mount a small tmpfs: {done.stderr.strip()[:100]}")

    return run


def unmount(path: str) -> Setup:
    def run(d: Path) -> None:
        subprocess.run(["umount", "-l", str(d / path)], capture_output=True)

    return run


def read_only(path: str) -> Setup:
    """Make ``path`` (a directory in the case directory) read-only. Root ignores permission
    bits, so the directory is also made immutable with chattr where it can be; where neither
    holds the case is Unavailable. Pair it with ``cleanup=writable(path)``."""

    def run(d: Path) -> None:
        target = d / path
        target.mkdir(parents=True, exist_ok=True)
        target.chmod(0o555)
        if os.access(target, os.W_OK):  # root: permission bits do not stop it
            subprocess.run(["chattr", "+i", str(target)], capture_output=True)
        probe = target / ".probe"
        try:
            probe.write_text("")
        except OSError:
            return
        probe.unlink()
        raise Unavailable(f"cannot make {path} read-only here (root without chattr)")

    return run


def writable(path: str) -> Setup:
    def run(d: Path) -> None:
        subprocess.run(["chattr", "-i", str(d / path)], capture_output=True)
        (d / path).chmod(0o755)

    return run
