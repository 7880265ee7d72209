"""Give every refusal of the catalogue's runs to every door a job starts through, and compare.

The cases are the catalogue's runs (tools/qa/catalogue: ``pipecompile run out ...`` refused
with status 2) that `pipecompile run` refuses before it runs anything (found by stopping the
command where the run would start: a case refused later, by a stage file, the data or the
loss, fails in the loop every door shares and is no refusal of options). Each is given to

- `pipecompile run` (``cli.main`` in this process, as the catalogue runs it): the reference;
- ``rank``: the job a rank builds from its argv (``RunJob.from_argv`` with the ranks started,
  then rank 0's check of where the run writes), what the worker does under torchrun;
- ``fit``: ``pipecompile.load(out).fit(...)``, where every option given is a keyword of it;
- ``torchrun``: the worker module under a real ``torchrun --standalone`` (with ``--torchrun``):
  rank 0 prints the message once, every rank records status 2, no step runs;

and every door must print the same message (each door's own spelling of a switch, such as
``force=True`` for ``--force``, read as the flag). A door that cannot express a case says why
(``NOT_AT``).

Usage::

    python tools/qa/doors.py                  # every case; torchrun for two of them
    python tools/qa/doors.py --torchrun all   # torchrun for every case a rank can express
    python tools/qa/doors.py --quick          # four cases, torchrun for one
    # the torchrun door against an older worker (a checkout of another commit):
    git worktree add /tmp/before 3a1ff3d && ln -s /tmp/before/passes /tmp/before/pipecompile/passes
    python tools/qa/doors.py --torchrun all --worker-path /tmp/before
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bad_inputs and its catalogue

import bad_inputs  # noqa: E402
from catalogue.case import Case, inside, run_in_process  # noqa: E402

ERROR = "pipecompile: error: "
ACCEPTED = "ACCEPTED"
RUN_ONLY = "`pipecompile run` only: "
# A door that cannot express a case: the door, and why.
NOT_AT = {
    "timeout-without-nproc": ("rank", "a rank always has ranks, whose waits --timeout bounds"),
    "device-without-nproc": ("rank", "a rank always has ranks, which --device places"),
    "dp-without-nproc": ("rank", "a rank always has ranks, which --dp groups"),
    "fault-instruction-one-process": ("rank", "a rank's faults at instructions fire"),
    "max-restarts-without-save": ("rank", RUN_ONLY + "torchrun restarts with its own flag"),
    "max-restarts-without-nproc": ("rank", RUN_ONLY + "torchrun restarts with its own flag"),
    "nproc-zero": ("rank", RUN_ONLY + "torchrun counts the ranks itself"),
    "run-recompute": ("rank", "a compile option: the worker's parser does not know it"),
}
RUN_CASES = [
    c for c in bad_inputs.CASES
    if c.argv[:2] == ("run", "out") and c.status == 2 and not c.own_process and c.base == "mlp"
    and c.cleanup is None  # a full disk, mounted for the case: found while saving, not before
]  # fmt: skip
TORCHRUN_SAMPLE = ("shard-grads-split-backward", "fault-no-such-instruction")
QUICK = ("shard-grads-split-backward", "save-every-without-save", "fault-rank-beyond",
         "check-accumulate")  # fmt: skip


@dataclass
class Row:
    """One case at every door: what `run` said (None: refused later, while running) and
    what each other door said (absent: it cannot express the case)."""

    case: Case
    run: str | None
    doors: dict[str, str] = field(default_factory=dict)

    @property
    def differ(self) -> list[str]:
        """The doors whose message is not `run`'s."""
        if self.run is None:
            return []
        return [d for d, line in self.doors.items() if said(line) != said(self.run)]


def said(line: str) -> str:
    """A door's refusal as the others print it: without the program's name (``pipecompile:
    error:``, ``pipecompile run: error:``, the worker's ``python -m ...: error:``) and the
    usage's pointer to --help, each door's own spelling of a switch as the flag."""
    text = line.split(" error: ", 1)[-1].split(" (see `", 1)[0]
    return text.replace("pass force=True", "pass --force").replace(
        "pass allow_stale=True", "pass --allow-stale"
    )


class _WouldRun(Exception):
    """Raised where `pipecompile run` would start running: its checks all passed."""


def refused_by_run(case: Case, d: Path) -> str | None:
    """`pipecompile run`'s refusal of ``case`` made before the run starts (its first line),
    or None when the run would start."""
    from pipecompile.surfaces import run_command

    def would_run(*_: object) -> int:
        raise _WouldRun

    # nothing runs and nothing is written, not even the train state's lock
    with (
        mock.patch.object(run_command, "_run_here", would_run),
        mock.patch.object(run_command, "holding", would_run),
    ):
        outcome = run_in_process(case.argv, d, case.env)
    if "_WouldRun" in outcome.stderr:
        return None
    lines = [ln for ln in outcome.stderr.splitlines() if ln.startswith("pipecompile")]
    if outcome.status != 2 or not lines:
        raise AssertionError(f"{case.id}: run ended {outcome.status}:\n{outcome.stderr}")
    return lines[0]


def rank_args(case: Case) -> tuple[list[str], int]:
    """The worker's argv for ``case`` (the directory and options, without `run`'s own
    --nproc) and the ranks torchrun would start (--nproc, else the program's 2)."""
    args, ranks = list(case.argv[1:]), 2
    if "--nproc" in args:
        k = args.index("--nproc")
        ranks = int(args[k + 1])
        del args[k : k + 2]
    return args, ranks


def rank_door(case: Case, d: Path) -> str:
    """What a rank does with ``case``'s argv: build the job (rank 0 also checks where it
    writes); the line it prints, or ACCEPTED."""
    from pipecompile.errors import PipecompileError
    from pipecompile.runtime.job.run import RunJob

    args, ranks = rank_args(case)
    usage = io.StringIO()
    with inside(d, case.env), contextlib.redirect_stderr(usage):
        try:
            job = RunJob.from_argv(args, started=ranks, local_ranks=ranks)
            job.check_places()
        except PipecompileError as err:
            return ERROR + str(err)
        except SystemExit:  # argparse: the worker's usage error
            return usage.getvalue().strip().splitlines()[-1]
    return ACCEPTED


def _value(text: str) -> object:
    """A flag's text as a keyword's value (a whole number, a number, or the text)."""
    for kind in (int, float):
        with contextlib.suppress(ValueError):
            return kind(text)
    return text


def fit_keywords(case: Case) -> dict[str, object] | None:
    """``case``'s options as ``fit()`` keywords, each value as a caller would write it; None
    where it gives one of `run`'s own (fit runs in this process: --check, --nproc, ... have
    no keyword)."""
    from pipecompile.options.fields import declared
    from pipecompile.options.run import TrainFlags

    fields = {flag: (f, o) for f, o in declared(TrainFlags) for flag in o.flags}
    keywords: dict[str, object] = {"epochs": None}  # `run` without --epochs: --steps, or 1
    rest = iter(list(case.argv[2:]))
    for arg in rest:
        if arg not in fields:
            return None  # `run`'s own, or no option of either
        f, o = fields[arg]
        if o.api == "progress":
            continue
        keywords[o.api or f.name] = True if o.switch else _value(next(rest))
    return keywords


def fit_door(case: Case, d: Path, keywords: dict[str, object]) -> str:
    """``fit(**keywords)`` of the compiled directory on the model file's example batch."""
    import pipecompile
    from pipecompile.errors import PipecompileError
    from pipecompile.model.model_file import load_model_file

    spec = load_model_file(str(d / "mlp.py"))
    with inside(d, case.env):
        try:
            pipe = pipecompile.load("out")  # as `run out` names it
            pipe.fit([(spec.inputs, spec.targets)], spec.loss_fn, **keywords)
        except PipecompileError as err:
            return ERROR + str(err)
    return ACCEPTED


WORKER_PATH: list[str] = []  # --worker-path: the checkout whose worker torchrun starts


def torchrun_door(case: Case, d: Path) -> str:
    """The worker under a real torchrun: rank 0's line when it refused as a rank must (once,
    every rank recording status 2, no step run), ACCEPTED when the run ended 0, else what went
    otherwise."""
    args, ranks = rank_args(case)
    metrics = d / "out" / "metrics.jsonl"
    before = metrics.read_bytes() if metrics.exists() else None
    with tempfile.TemporaryDirectory(prefix="pipecompile-doors-") as statuses:
        argv = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node", str(ranks), "-m", "pipecompile.runtime.distributed.worker",
                *args]  # fmt: skip
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PIPECOMPILE_STATUS_DIR": statuses}
        env.update(case.env)
        if WORKER_PATH:
            env["PYTHONPATH"] = os.pathsep.join([*WORKER_PATH, env.get("PYTHONPATH", "")])
        done = subprocess.run(argv, cwd=d, capture_output=True, text=True, env=env, timeout=240)
        recorded = {
            p.name: json.loads(p.read_text())["status"] for p in Path(statuses).glob("rank*.json")
        }
    if done.returncode == 0:
        return ACCEPTED
    usage = [ln for ln in done.stderr.splitlines() if ": error: argument" in ln]
    if usage:  # argparse's, on every rank
        return usage[0]
    ours = [ln for ln in done.stderr.splitlines() if ln.startswith("pipecompile:")]
    after = metrics.read_bytes() if metrics.exists() else None
    if len(ours) != 1 or done.returncode == 0 or after != before:
        return f"exit {done.returncode}, {len(ours)} lines: {done.stderr[-2000:]}"
    if recorded != {f"rank{r}.json": 2 for r in range(ranks)}:
        return f"rank statuses {recorded}"
    return ours[0]


def judge(case: Case, space: object, *, torchrun: bool) -> Row:
    """``case`` at every door that can express it."""
    d = space.prepare(case)
    row = Row(case, refused_by_run(case, d))
    if row.run is None:
        return row
    not_here = NOT_AT.get(case.id, ("", ""))[0]
    if not_here != "rank":
        row.doors["rank"] = rank_door(case, d)
        if torchrun:
            row.doors["torchrun"] = torchrun_door(case, d)
    keywords = fit_keywords(case)
    if keywords is not None and not_here != "fit":
        row.doors["fit"] = fit_door(case, d, keywords)
    return row


def table(rows: list[Row]) -> str:
    width = max(len(r.case.id) for r in rows)
    lines = [f"{'case':<{width}}  rank  fit   torchrun  run's message"]
    for r in rows:
        if r.run is None:
            lines.append(
                f"{r.case.id:<{width}}  (refused while running, by the loop every door shares)"
            )
            continue
        cells = [
            "-" if door not in r.doors else ("same" if door not in r.differ else "DIFF")
            for door in ("rank", "fit", "torchrun")
        ]
        lines.append(f"{r.case.id:<{width}}  {cells[0]:<4}  {cells[1]:<4}  {cells[2]:<8}  "
                     f"{said(r.run)[:90]}")  # fmt: skip
    for r in rows:
        for door in r.differ:
            lines.append(f"\n{r.case.id} at {door}: {r.doors[door]}\n  run: {r.run}")
    return "\n".join(lines)


def summary(rows: list[Row]) -> str:
    refused = [r for r in rows if r.run is not None]
    doors = sum(len(r.doors) for r in refused)
    differ = sum(len(r.differ) for r in refused)
    accepted = sum(line == ACCEPTED for r in refused for line in r.doors.values())
    return (
        f"{len(refused)} refusals made before a run starts ({len(rows) - len(refused)} other "
        f"cases fail while running), given to {doors} other doors: {differ} differ, of which "
        f"{accepted} accepted at a door where `run` refuses"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK)}")
    parser.add_argument("--torchrun", choices=("all", "sample", "none"), default="sample",
                        help="cases given to a real torchrun (sample: "
                        f"{', '.join(TORCHRUN_SAMPLE)})")  # fmt: skip
    parser.add_argument("--worker-path", metavar="DIR",
                        help="torchrun starts the worker of the pipecompile checkout at DIR "
                        "(another commit's), to compare")  # fmt: skip
    args = parser.parse_args(argv)
    if args.worker_path:
        WORKER_PATH.append(str(Path(args.worker_path).resolve()))
    cases = [c for c in RUN_CASES if not args.quick or c.id in QUICK]
    sample = TORCHRUN_SAMPLE[:1] if args.quick else TORCHRUN_SAMPLE
    rows = []
    with tempfile.TemporaryDirectory(prefix="pipecompile-doors-") as tmp:
        space = bad_inputs.Workspace(Path(tmp).resolve())
        for case in cases:
            torchrun = args.torchrun == "all" or args.torchrun == "sample" and case.id in sample
            rows.append(judge(case, space, torchrun=torchrun))
    print(table(rows))
    print(summary(rows))
    return 1 if any(r.differ for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
