"""Benchmark stopping a run: Ctrl-C and SIGTERM, pipecompile next to torch.distributed.pipelining.

examples/mlp.py is compiled into 2 stages; ``python -m pipecompile run OUT --steps 100000
--save CK --save-every 1`` starts (with ``--nproc 2``, or locally), in a session of its own as a
shell would start it. Once CK/latest exists (a step has been saved), it is sent

* SIGINT to its process group: what a terminal's Ctrl-C does, or
* SIGTERM to the top process only: what ``kill PID`` does.

Measured: the seconds from the signal until every process of the run is gone (found in /proc
by a marker in their environment or the run's directory in their command line; zombies with
empty command lines do not count), the top process's exit status, the lines it and its children
wrote to stderr, and whether CK/latest still names a complete step (its meta.json and every
stage's weights present) with no ``.step_*.tmp`` left behind.

The peer is a minimal ``torch.distributed.run --nproc-per-node 2`` script (this file with
``--peer-worker``): a 4-layer MLP split in two ``PipelineStage``s, ``ScheduleGPipe``, gloo, CPU,
trained in a loop with SGD. It writes no checkpoint; its run counts as started after its first
step. A run still alive ``--wait`` seconds after the signal is reported as such and SIGKILLed.
Every wait is bounded, and every process a run started is SIGKILLed at the end whatever
happens.

Rerun with::

    python tools/bench/interrupt.py            # every case, 3 runs each (about 3 minutes)
    python tools/bench/interrupt.py --quick    # one run of 3 cases: each path once
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from common import (
    EXAMPLES,
    command,
    machine,
    pipecompile_command,
    run_checked,
    torchrun_command,
)

MARKER = "BENCH_INTERRUPT_RUN"  # in the environment of every process of one run
POLL_S = 0.02
COMPLETE = "complete"


@dataclass(frozen=True)
class Case:
    """One way of running and stopping."""

    system: str  # "pipecompile" or "pipelining"
    nproc: int  # 0: a local run
    signal: str  # "SIGINT" or "SIGTERM"
    group: bool  # to the process group (Ctrl-C) or to the top process only

    @property
    def label(self) -> str:
        run = f"--nproc {self.nproc}" if self.nproc else "local"
        if self.system == "pipelining":
            run = f"torchrun, {self.nproc} ranks"
        to = "Ctrl-C (SIGINT to the group)" if self.group else "SIGTERM to the top process"
        return f"| {self.system} | {run} | {to} |"


CASES = [
    Case("pipecompile", 2, "SIGINT", True),
    Case("pipecompile", 2, "SIGTERM", False),
    Case("pipecompile", 0, "SIGINT", True),
    Case("pipecompile", 0, "SIGTERM", False),
    Case("pipelining", 2, "SIGINT", True),
    Case("pipelining", 2, "SIGTERM", False),
]
QUICK_CASES = [CASES[0], CASES[3], CASES[4]]


@dataclass
class Outcome:
    """What one stop looked like."""

    seconds: float | None  # None: processes were still running after the wait
    status: str
    stderr: list[str]
    checkpoint: str  # COMPLETE, "n/a" or what is wrong


# --------------------------------------------------------------------------- processes


def run_pids(tag: str, directory: Path) -> list[int]:
    """Live processes of the run: the marker in their environment or ``directory`` in their
    command line. Zombies (empty command line) and unreadable entries do not count."""
    marker, where = f"{MARKER}={tag}".encode(), str(directory).encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            if not cmdline:
                continue
            if where in cmdline or marker in (entry / "environ").read_bytes():
                found.append(int(entry.name))
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return found


def kill_all(proc: subprocess.Popen, tag: str, directory: Path) -> None:
    """SIGKILL the top process's group and every process of the run; reap the top."""
    for kill, target in ((os.killpg, proc.pid), *((os.kill, p) for p in run_pids(tag, directory))):
        try:
            kill(target, signal.SIGKILL)
        except OSError:  # already gone
            pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def wait_for(condition: object, seconds: float, proc: subprocess.Popen) -> bool:
    """Poll ``condition()`` for at most ``seconds``; False if the top process ended first."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return True
        if proc.poll() is not None:
            return False
        time.sleep(POLL_S)
    return False


def stop(proc: subprocess.Popen, case: Case, tag: str, directory: Path, wait: float) -> float:
    """Send the case's signal; seconds until no process of the run is left (inf after
    ``wait``)."""
    sig = getattr(signal, case.signal)
    start = time.monotonic()
    if case.group:
        os.killpg(proc.pid, sig)
    else:
        proc.send_signal(sig)
    while time.monotonic() - start < wait:
        proc.poll()  # reap the top process once it exits, or it stays a zombie
        if not run_pids(tag, directory):
            return time.monotonic() - start
        time.sleep(POLL_S)
    return float("inf")


# --------------------------------------------------------------------------- one case


def measure(case: Case, work: Path, compiled: Path, wait: float, start_wait: float) -> Outcome:
    """Start the case's run, stop it once it has saved (or stepped), and clean up."""
    tag = uuid.uuid4().hex
    directory = Path(tempfile.mkdtemp(prefix="run-", dir=work))
    ck, ready = directory / "ck", directory / "ready"
    env = {**os.environ, MARKER: tag, "OMP_NUM_THREADS": "1"}
    if case.system == "pipecompile":
        run = pipecompile_command("run", str(compiled), "--steps", "100000", "--save", str(ck))
        run += ["--save-every", "1", *(["--nproc", str(case.nproc)] if case.nproc else [])]
        started = (ck / "latest").is_file
    else:
        run = torchrun_command(case.nproc, __file__, "--peer-worker", str(ready))
        started = ready.is_file
    stderr = directory / "stderr.txt"
    with open(stderr, "w") as err, open(directory / "stdout.txt", "w") as out:
        proc = subprocess.Popen(run, stdout=out, stderr=err, env=env, cwd=directory,
                                start_new_session=True)  # fmt: skip
    try:
        if not wait_for(started, start_wait, proc):
            tail = stderr.read_text()[-2000:]
            raise SystemExit(f"{case.label} did not start within {start_wait:.0f} s:\n{tail}")
        seconds = stop(proc, case, tag, directory, wait)
    finally:
        kill_all(proc, tag, directory)
    return Outcome(
        None if seconds == float("inf") else seconds,
        exit_status(proc.returncode, seconds == float("inf")),
        stderr.read_text().splitlines(),
        checkpoint_state(ck) if case.system == "pipecompile" else "n/a (writes none)",
    )


def exit_status(code: int | None, killed_by_us: bool) -> str:
    if killed_by_us:
        return "still running (SIGKILLed)"
    if code is None:
        return "unknown"
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return str(code)


def _readable(step_dir: Path) -> bool:
    """Whether every tensor of the saved step can be read back (its index and each shard)."""
    from pipecompile.runtime.training.model_keyed import read_model_keyed

    try:
        read_model_keyed(step_dir)
    except Exception:  # a missing index (EmitError) or shard (the checkpoint's own error)
        return False
    return True


def checkpoint_state(ck: Path) -> str:
    """COMPLETE when CK/latest names a step whose files are all there and no temporary
    directory is left; otherwise what is wrong."""
    leftovers = sorted(p.name for p in ck.glob(".step_*.tmp"))
    try:
        name = (ck / "latest").read_text().strip()
        meta = json.loads((ck / name / "meta.json").read_text())
    except (OSError, ValueError) as err:
        return f"NO: {type(err).__name__}"
    if meta.get("step") != int(name.removeprefix("step_")) or not _readable(ck / name):
        return f"NO: {name} incomplete"
    return f"NO: {', '.join(leftovers)} left" if leftovers else COMPLETE


# --------------------------------------------------------------------------- the peer


def peer_worker(ready: Path) -> None:
    """One rank of the peer: a 4-layer MLP, two layers per stage, trained until stopped."""
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    layers = [nn.Linear(32, 32) for _ in range(4)]
    part = nn.Sequential(*layers[2 * rank : 2 * rank + 2])
    stage = PipelineStage(part, rank, world, torch.device("cpu"))
    schedule = ScheduleGPipe(stage, n_microbatches=2, loss_fn=nn.functional.mse_loss)
    optimizer = torch.optim.SGD(part.parameters(), lr=1e-3)
    x, y = torch.randn(8, 32), torch.randn(8, 32)
    for step in range(100_000):
        if rank == 0:
            schedule.step(x)
        else:
            schedule.step(target=y, losses=[])
        optimizer.step()
        optimizer.zero_grad()
        if rank == 0:
            print(f"step {step + 1}", flush=True)
            if step == 0:
                ready.touch()
    dist.destroy_process_group()


# --------------------------------------------------------------------------- report


def compile_mlp(target: Path) -> Path:
    mlp = pipecompile_command(str(EXAMPLES / "mlp.py"), "--stages", "2", "-q", "-o", str(target))
    run_checked(mlp, timeout=300, OMP_NUM_THREADS="1")
    return target


def row(case: Case, outcomes: list[Outcome], wait: float) -> str:
    times = [o.seconds for o in outcomes]
    if all(t is not None for t in times):
        spread = f" ({min(times):.2f}-{max(times):.2f})" if len(times) > 1 else ""  # type: ignore[type-var]
        took = f"{statistics.median(times):.2f}{spread}"  # type: ignore[type-var]
    else:
        left = sum(t is None for t in times)
        took = f"still running after {wait:.0f} s ({left}/{len(times)} runs)"

    def seen(values: list[str]) -> str:
        return ", ".join(sorted(set(values), key=values.index))

    lines = seen([str(len(o.stderr)) for o in outcomes])
    states = [o.checkpoint for o in outcomes]
    kept = seen(states)
    if kept == COMPLETE:
        kept = f"complete in {len(states)}/{len(states)}, no .step_*.tmp left"
    return (f"{case.label} {took} | {seen([o.status for o in outcomes])} | {lines} "
            f"| {kept} |")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one run of 3 cases")
    parser.add_argument("--repeats", type=int, default=3, help="runs per case")
    parser.add_argument("--wait", type=float, default=60.0, help="seconds a stop may take")
    parser.add_argument("--start-wait", type=float, default=120.0,
                        help="seconds a run may take to save its first step")  # fmt: skip
    parser.add_argument("--peer-worker", type=Path, help=argparse.SUPPRESS)
    if parser.parse_known_args()[0].quick:  # smaller defaults; options given still count
        parser.set_defaults(repeats=1, wait=10.0, start_wait=60.0)
    args = parser.parse_args()
    if args.peer_worker:
        peer_worker(args.peer_worker)
        return 0
    if not sys.platform.startswith("linux"):
        print("this benchmark reads /proc: Linux only", file=sys.stderr)
        return 2
    print(f"machine: {machine()}")
    print(f"command: {command()}")
    print(f"runs per case: {args.repeats}; a stop may take {args.wait:.0f} s\n")
    print("| system | run | stopped by | seconds until no process is left | exit status "
          "| stderr lines | CK/latest |\n|---|---|---|---:|---|---:|---|")  # fmt: skip
    firsts = []
    with tempfile.TemporaryDirectory(prefix="bench-interrupt-") as tmp:
        compiled = compile_mlp(Path(tmp) / "out")
        for case in QUICK_CASES if args.quick else CASES:
            outcomes = [measure(case, Path(tmp), compiled, args.wait, args.start_wait)
                        for _ in range(args.repeats)]  # fmt: skip
            print(row(case, outcomes, args.wait), flush=True)
            firsts.append(f"{case.label.strip('| ').replace(' | ', ', ')}: "
                          f"{(outcomes[-1].stderr or ['(nothing)'])[0][:150]}")  # fmt: skip
    print("\nFirst stderr line of each case's last run:\n")
    for line in firsts:
        print(f"- {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
