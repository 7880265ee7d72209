"""What the benchmarks share: the repository's paths, the machine and command they report, timing
and the pipecompile / torchrun commands they start.

A script here runs as ``python tools/bench/X.py``, so this folder is first on ``sys.path`` and
``from common import ...`` finds this file from any working directory.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import io
import os
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

ROOT = Path(__file__).resolve().parents[2]  # the repository
EXAMPLES = ROOT / "examples"
T = TypeVar("T")


def use_examples() -> None:
    """Make examples/ importable (``import gpt``, ``from hf_gpt2 import build_gpt2``)."""
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))


def cpu_name() -> str:
    """The CPU's model name from /proc/cpuinfo, else what ``platform`` knows."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def machine(*extras: str) -> str:
    """The machine as docs/BENCHMARKS.md records it: CPU, cores, memory, OS, Python, torch (and
    its thread count once imported), then ``extras`` (a peer's or a library's version)."""
    parts = [f"{cpu_name()}, {os.cpu_count()} CPUs"]
    if hasattr(os, "sysconf"):
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
        parts.append(f"{memory:.0f} GiB")
    parts += [platform.platform(), f"Python {platform.python_version()}"]
    try:
        parts.append(f"torch {importlib.metadata.version('torch')}")
    except importlib.metadata.PackageNotFoundError:
        pass
    if "torch" in sys.modules:
        parts.append(f"torch threads {sys.modules['torch'].get_num_threads()}")
    return ", ".join([*parts, *extras])


def announce() -> None:
    """Print the machine and the command line a benchmark's figures come from."""
    print(f"machine: {machine()}")
    print(f"command: {command()}")


def command(argv: list[str] | None = None) -> str:
    """The command line this script was started with, as a user types it from the repository
    root: ``python tools/bench/X.py ARGS``."""
    script = Path(sys.argv[0]).resolve()
    shown = script.relative_to(ROOT) if script.is_relative_to(ROOT) else script
    return shlex.join(["python", str(shown), *(sys.argv[1:] if argv is None else argv)])


def log(message: str) -> None:
    """A progress line on stderr."""
    print(message, file=sys.stderr, flush=True)


def timed(fn: Callable[..., T], *args: object) -> tuple[float, T]:
    """Seconds ``fn(*args)`` took, and its result."""
    start = time.perf_counter()
    result = fn(*args)
    return time.perf_counter() - start, result


def pipecompile_command(*args: str) -> list[str]:
    """``pipecompile ARGS`` as a command for this interpreter."""
    return [sys.executable, "-m", "pipecompile", *args]


def torchrun_command(nproc: int, *args: str) -> list[str]:
    """``torchrun --standalone --nproc-per-node=NPROC ARGS`` for this interpreter."""
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    return [*launcher, f"--nproc-per-node={nproc}", *args]


def pipecompile_done(*args: str) -> subprocess.CompletedProcess[str]:
    """``pipecompile ARGS`` in this process, for a command whose own start-up is not what is
    measured (a fresh interpreter spends seconds importing torch), reported as ``run_checked``
    reports a command: its status and its printed lines (a run's ranks under ``--nproc``
    write their stdout to this process's own, which is not captured). The benchmark stops
    with its stderr's tail if it fails."""
    from pipecompile.surfaces.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(list(args))
    if status:
        raise SystemExit(f"pipecompile {shlex.join(args)} failed:\n{err.getvalue()[-3000:]}")
    printed = (out.getvalue(), err.getvalue())
    return subprocess.CompletedProcess(["pipecompile", *args], status, *printed)


def pipecompile_here(*args: str) -> str:
    """``pipecompile ARGS`` in this process (``pipecompile_done``); its stdout."""
    return pipecompile_done(*args).stdout


def run_checked(
    command: list[str],
    *,
    cwd: Path = ROOT,
    timeout: float | None = None,
    check: bool = True,
    **env: str,
) -> subprocess.CompletedProcess[str]:
    """Run ``command`` (``env`` added to this environment); stop the benchmark with its stderr's
    tail if it fails (``check``; else return the failed run)."""
    environment = {**os.environ, **env}
    done = subprocess.run(
        command, capture_output=True, text=True, cwd=cwd, timeout=timeout, env=environment
    )
    if check and done.returncode != 0:
        tail = done.stdout[-2000:] + done.stderr[-3000:]
        raise SystemExit(f"{shlex.join(command)} failed:\n{tail}")
    return done


def torchrun_options(
    description: str, quick: str, repeats: int, *, json: bool = False
) -> argparse.Namespace:
    """The options of a benchmark that times steps in ranks it starts under torchrun: --quick
    (``quick`` says what it runs; no warm-up, one timed step), the hidden ones each worker
    gets, --warmup and --repeats (``repeats`` timed steps by default), and where ``json``
    --json PATH (the results also written there)."""
    parser = argparse.ArgumentParser(description=description)
    if json:
        parser.add_argument("--json", type=Path, help="also write the results here as JSON")
    parser.add_argument("--quick", action="store_true", help=quick)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--directory", help=argparse.SUPPRESS)
    parser.add_argument("--sizes", help=argparse.SUPPRESS)
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    parser.add_argument("--repeats", type=int, default=repeats, help="timed steps")
    if parser.parse_known_args()[0].quick:  # smaller defaults; options given still count
        parser.set_defaults(warmup=0, repeats=1)
    return parser.parse_args()


@dataclass(frozen=True)
class GPT2Sizes:
    """The GPT-2 (or Llama) the throughput benchmarks train, and its batch: layers, width,
    attention heads, vocabulary, tokens a sample, samples a mini-batch. Each tool's own
    ``Sizes`` adds its run's fields to it."""

    layers: int = 24
    width: int = 256
    heads: int = 8
    vocab: int = 1024
    tokens: int = 64
    batch: int = 16


QUICK_GPT2 = {"layers": 2, "width": 32, "heads": 2, "vocab": 64, "tokens": 8}  # --quick's


@contextlib.contextmanager
def spinning(count: int, *, gentle: bool = False) -> Iterator[None]:
    """While open, ``count`` processes spin on a core each; ``gentle``: at the lowest
    priority (the test suite's quick run exercises the path without taking a core from the
    other tests)."""
    start = (lambda: os.nice(19)) if gentle else None
    loop = [sys.executable, "-c", "while True: pass"]
    spinners = [subprocess.Popen(loop, preexec_fn=start) for _ in range(count)]
    try:
        yield
    finally:
        for p in spinners:
            p.kill()
            p.wait()
