"""Run a catalogue of a user's mistakes through the command line and judge every message.

Each case prepares a directory (usually a copy of examples/mlp.py compiled into ``out/``, then
damaged), runs ``pipecompile ARGS`` in it as a user would, and classifies the outcome:

* clear: the expected exit status, no traceback, at most two non-blank stderr lines (more
  for a ``--nproc`` case: two per rank), the first starting ``pipecompile:`` (``pipecompile
  COMMAND:`` for a usage mistake), and the message matching the case's pattern;
* traceback: a Python traceback was printed;
* wrong exit: another exit status;
* unclear: anything else (too long, or it does not name the culprit and the fix);
* silently wrong: it exited 0 where it must fail;
* data lost: a file the case names as the user's changed or disappeared.

Usage::

    python tools/qa/bad_inputs.py                 # every case, each in a subprocess
    python tools/qa/bad_inputs.py --quick         # a few cases, a few seconds
    python tools/qa/bad_inputs.py --only weights-truncated --show   # one case, with its output
    python tools/qa/bad_inputs.py --in-process    # call surfaces.cli.main() instead (faster)
    python tools/qa/bad_inputs.py --markdown > docs/ERRORS.md

The cases live in ``tools/qa/catalogue/``, one module per area (``basics``, ``files``, ``asked``,
``pretrained``, ``ranks``, ``saved``); ``catalogue/case.py`` holds ``Case`` and the setups. To
add a case, append it to its area's list. A case that may hang or that writes to file descriptor
2 sets ``own_process`` (it always runs in a subprocess, killed after ``timeout`` seconds: a
"hang"); one this machine cannot prepare (a full disk needs root) is skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the catalogue package beside this file

from catalogue.asked import ASKED  # noqa: E402
from catalogue.basics import BASICS  # noqa: E402
from catalogue.case import (  # noqa: E402
    HANG,
    MLP,
    Case,
    Outcome,
    Unavailable,
    run_in_process,
    run_subprocess,
)
from catalogue.coupling import COUPLING  # noqa: E402
from catalogue.doors import DOORS  # noqa: E402
from catalogue.files import FILES  # noqa: E402
from catalogue.generating import GENERATING  # noqa: E402
from catalogue.pretrained import PRETRAINED  # noqa: E402
from catalogue.ranks import RANKS  # noqa: E402
from catalogue.saved import SAVED  # noqa: E402
from catalogue.shapes import SHAPES  # noqa: E402
from catalogue.tracing import TRACING  # noqa: E402

TEST = "tests/test_bad_inputs.py::test_case"

AREAS: dict[str, list[Case]] = {
    "basics": BASICS, "files": FILES, "asked": ASKED, "pretrained": PRETRAINED, "ranks": RANKS,
    "saved": SAVED, "shapes": SHAPES, "tracing": TRACING, "generating": GENERATING,
    "doors": DOORS, "coupling": COUPLING,
}  # fmt: skip
CASES: list[Case] = [case for cases in AREAS.values() for case in cases]
VERDICTS = ("clear", "unclear", "wrong exit", "traceback", "silently wrong", "data lost", "hang")


# -- bases: prepared once, copied per case -----------------------------------------------


def build_mlp(d: Path) -> None:
    """examples/mlp.py as mlp.py, compiled into out/ (2 stages, 2 micro-batches)."""
    shutil.copyfile(MLP, d / "mlp.py")
    argv = ["mlp.py", "--stages", "2", "--microbatches", "2", "-q", "-o", "out"]
    result = run_in_process(argv, d)
    if result.status != 0:
        raise SystemExit(f"bad_inputs: compiling the base failed:\n{result.stderr}")


def build_gpt(d: Path) -> None:
    """examples/gpt.py as gpt.py, compiled into out/ with --generate (2 stages)."""
    shutil.copyfile(MLP.parent / "gpt.py", d / "gpt.py")
    result = run_in_process(["gpt.py", "--stages", "2", "--generate", "-q", "-o", "out"], d)
    if result.status != 0:
        raise SystemExit(f"bad_inputs: compiling the gpt base failed:\n{result.stderr}")


BASES: dict[str, Callable[[Path], None]] = {"mlp": build_mlp, "gpt": build_gpt}


class Workspace:
    """A temporary directory holding each base (built on first use) and each case's copy,
    prepared once (the tests give a refused case's copy to every door: refused, it is left as
    it was)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.bases: dict[str, Path] = {}
        self.cases: dict[str, Path] = {}
        self._lock = threading.Lock()

    def prepare(self, case: Case) -> Path:
        d = self.root / "cases" / case.id
        with self._lock:  # a setup may run pipecompile in this process, which changes directory
            if case.id in self.cases:
                return d
            self.cases[case.id] = d
            if case.base is None:
                d.mkdir(parents=True)
            else:
                shutil.copytree(self.base(case.base), d, symlinks=True)
            case.setup(d)
        return d

    def base(self, name: str) -> Path:
        if name not in self.bases:
            d = self.root / "bases" / name
            d.mkdir(parents=True)
            BASES[name](d)
            self.bases[name] = d
        return self.bases[name]


# -- running -----------------------------------------------------------------------------


def judge(case: Case, outcome: Outcome) -> Outcome:
    """Classify ``outcome`` as clear, traceback, wrong exit or unclear."""
    outcome.case = case
    lines = [ln for ln in outcome.stderr.splitlines() if ln.strip()]
    outcome.lines = lines
    if outcome.status == HANG:
        outcome.verdict, outcome.reason = "hang", f"still running after {case.timeout:g} s"
    elif "Traceback (most recent call last)" in outcome.stdout + outcome.stderr:
        outcome.verdict, outcome.reason = "traceback", _last_error(lines)
    elif outcome.status == 0 and case.status != 0:
        outcome.verdict, outcome.reason = "silently wrong", f"exit 0, expected {case.status}"
    elif outcome.status != case.status:
        outcome.verdict = "wrong exit"
        outcome.reason = f"exit {outcome.status}, expected {case.status}"
    elif case.status == 0:
        _judge_success(case, outcome)
    elif not lines or not re.match(r"pipecompile( \w+)?:", lines[0]):  # usage: `pipecompile run:`
        outcome.verdict, outcome.reason = "unclear", "no `pipecompile:` message on stderr"
    elif len(lines) > case.max_lines:
        outcome.verdict = "unclear"
        outcome.reason = f"{len(lines)} stderr lines, at most {case.max_lines} expected"
    elif not re.search(case.message, " ".join(lines), re.S):
        outcome.verdict, outcome.reason = "unclear", f"message does not match {case.message!r}"
    else:
        outcome.verdict = "clear"
    return outcome


def _judge_success(case: Case, outcome: Outcome) -> None:
    """A case that must succeed: nothing on stderr but up to ``max_lines`` notes (what
    ``--force`` kept), the message in the notes and the report on stdout."""
    notes = [ln for ln in outcome.lines if ln.startswith("pipecompile: note: ")]
    noise = [ln for ln in outcome.lines if ln not in notes]
    if noise or len(notes) > case.max_lines:
        outcome.verdict, outcome.reason = "unclear", f"stderr: {(noise or notes)[0][:100]}"
    elif not re.search(case.message, "\n".join([*notes, outcome.stdout]), re.S):
        outcome.verdict, outcome.reason = "unclear", f"stdout does not match {case.message!r}"
    else:
        outcome.verdict = "clear"
        outcome.lines = notes + [ln.strip() for ln in outcome.stdout.splitlines() if ln.strip()]


def _last_error(lines: list[str]) -> str:
    errors = [ln for ln in lines if re.match(r"^\w+(\.\w+)*(Error|Exception|Failure)\b", ln)]
    return (errors or lines or [""])[-1][:160]


def run_case(case: Case, space: Workspace, *, in_process: bool) -> Outcome:
    """Prepare ``case``, run it (in this process only if ``in_process`` and the case allows),
    judge it, and check its user's files; a case this machine cannot prepare is skipped."""
    try:
        d = space.prepare(case)
    except Unavailable as why:
        return Outcome(case, 0, "", "", verdict="skipped", reason=str(why))
    except Exception as err:  # a setup step failed: the case cannot be judged (a bug here,
        # or, run against an older pipecompile, a flag it did not have yet)
        return Outcome(case, 0, "", "", verdict="setup failed", reason=str(err)[-300:])
    try:
        before = {path: _read(d / path) for path in case.intact}
        if in_process and not case.own_process:
            outcome = run_in_process(case.argv, d, case.env)
        else:
            outcome = run_subprocess(case.argv, d, timeout=case.timeout, env=case.env)
    finally:
        if case.cleanup is not None:
            case.cleanup(d)
    outcome.stderr = outcome.stderr.replace(f"{d}/", "").replace(str(d), ".")
    judge(case, outcome)
    lost = [path for path, data in before.items() if _read(d / path) != data]
    if lost:
        outcome.verdict, outcome.reason = "data lost", f"changed or removed: {', '.join(lost)}"
    return outcome


def _read(path: Path) -> bytes | None:
    return path.read_bytes() if path.is_file() else None


def run_cases(cases: Sequence[Case], *, in_process: bool, jobs: int = 1) -> list[Outcome]:
    with tempfile.TemporaryDirectory(prefix="pipecompile-bad-") as tmp:
        space = Workspace(Path(tmp).resolve())
        for name in {c.base for c in cases if c.base is not None}:
            space.base(name)
        if in_process or jobs <= 1:
            return [run_case(c, space, in_process=in_process) for c in cases]
        with ThreadPoolExecutor(jobs) as pool:
            return list(pool.map(lambda c: run_case(c, space, in_process=False), cases))


# -- reports -----------------------------------------------------------------------------


def table(outcomes: Sequence[Outcome]) -> str:
    width = max(len(o.case.id) for o in outcomes)
    rows = [f"{'case':<{width}}  verdict     exit  message"]
    for o in outcomes:
        shown = (o.lines[0] if o.lines else "(nothing printed)") if o.clear else o.reason
        rows.append(f"{o.case.id:<{width}}  {o.verdict:<10}  {o.status:>4}  {shown[:120]}")
    return "\n".join(rows)


def counts(outcomes: Sequence[Outcome]) -> str:
    def n(verdict: str) -> int:
        return sum(o.verdict == verdict for o in outcomes)

    skipped = f", {n('skipped')} skipped (this machine cannot prepare them)" if n("skipped") else ""
    if n("setup failed"):
        skipped += f", {n('setup failed')} setup failed"
    return (
        f"{len(outcomes)} cases tried: {n('clear')} clear, {n('traceback')} traceback, "
        f"{n('wrong exit')} wrong exit, {n('unclear')} unclear, {n('silently wrong')} silently "
        f"wrong, {n('data lost')} data lost, {n('hang')} hang{skipped}"
    )


def markdown(outcomes: Sequence[Outcome]) -> str:
    rows = [
        "# Errors a user can make, and what pipecompile says",
        "",
        "Every mistake below exits with the status shown and prints the message shown (one",
        "or two lines on stderr, one or two per rank under `--nproc`), never a traceback.",
        "`out/` is examples/mlp.py compiled with `--stages 2 --microbatches 2`; `model.py` is",
        "a variant of it (for the `generate-` cases, examples/gpt.py as `gpt.py`, compiled",
        "with `--stages 2 --generate`). Generated by `tools/qa/bad_inputs.py`; regenerate with",
        "",
        "```bash",
        "python tools/qa/bad_inputs.py --markdown > docs/ERRORS.md",
        "```",
        "",
        f"Last run: {counts(outcomes)}. Stopping a run with Ctrl-C or SIGTERM (no process",
        "left, the last complete saved step kept) is covered by tests/runtime/test_interrupt.py.",
        "",
        "| What the user did | Command | Message | Exit | Test |",
        "| --- | --- | --- | --- | --- |",
    ]
    for o in outcomes:
        message = "<br>".join(f"`` {_cell(ln)} ``" for ln in o.lines) if o.clear else o.verdict
        message = message or "(nothing: it succeeds)"
        env = "".join(f"{name}={value} " for name, value in o.case.env)
        command = _cell(env + "pipecompile " + " ".join(o.case.argv))
        rows.append(
            f"| {_cell(o.case.did)} | `{command}` | {message} | {o.status} | "
            f"`{TEST}[{o.case.id}]` |"
        )
    return "\n".join(rows) + "\n"


def by_area(outcomes: Sequence[Outcome], before: dict[str, str] | None = None) -> str:
    """A markdown table of verdicts per area; with ``before`` (case id -> verdict, from an
    earlier ``--json``), each cell reads ``before -> now``."""
    verdicts = [v for v in VERDICTS if v != "clear"]
    rows = ["| area | cases | clear | " + " | ".join(verdicts) + " |",
            "| --- | ---: | ---: |" + " ---: |" * len(verdicts)]  # fmt: skip
    areas = {case.id: area for area, cases in AREAS.items() for case in cases}
    for area in [*AREAS, "all"]:
        mine = [o for o in outcomes if area in ("all", areas.get(o.case.id))]

        def cell(verdict: str, mine: list[Outcome] = mine) -> str:
            now = sum(o.verdict == verdict for o in mine)
            if before is None:
                return str(now)
            return f"{sum(before.get(o.case.id) == verdict for o in mine)} -> {now}"

        rows.append(f"| {area} | {len(mine)} | {cell('clear')} | "
                    + " | ".join(cell(v) for v in verdicts) + " |")  # fmt: skip
    return "\n".join(rows)


def _recorded(path: Path) -> list[Outcome]:
    """The outcomes a ``--json`` file recorded (of the cases the catalogue still has)."""
    known = {case.id: case for case in CASES}
    rows = json.loads(path.read_text())
    return [Outcome(known[r["id"]], r["exit"], "", "", verdict=r["verdict"], reason=r["reason"])
            for r in rows if r["id"] in known]  # fmt: skip


def _verdicts(path: str | None) -> dict[str, str] | None:
    return {o.case.id: o.verdict for o in _recorded(Path(path))} if path else None


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def show(o: Outcome) -> str:
    return (
        f"== {o.case.id}: {o.verdict} ({o.reason or 'ok'})\n$ pipecompile "
        f"{' '.join(o.case.argv)}\n-- exit {o.status}; stdout:\n{o.stdout}-- stderr:\n{o.stderr}"
    )


# -- command line ------------------------------------------------------------------------


def select(cases: Sequence[Case], only: Sequence[str], quick: bool) -> list[Case]:
    known = {c.id for c in cases}
    unknown = [i for i in only if i not in known]
    if unknown:
        raise SystemExit(f"bad_inputs: unknown case(s) {', '.join(unknown)}; see --list")
    if only:
        return [c for c in cases if c.id in only]
    return [c for c in cases if c.quick] if quick else list(cases)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="only the few quick cases")
    parser.add_argument("--only", action="append", default=[], metavar="ID",
                        help="run this case (repeatable)")  # fmt: skip
    parser.add_argument("--in-process", action="store_true",
                        help="call surfaces.cli.main(), not a subprocess per case")  # fmt: skip
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="subprocesses at once (default: the CPU count)")  # fmt: skip
    parser.add_argument("--show", action="store_true", help="print each case's full output")
    parser.add_argument("--markdown", action="store_true", help="print docs/ERRORS.md")
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    parser.add_argument("--json", metavar="FILE", help="also write each case's verdict as JSON")
    parser.add_argument("--areas", metavar="JSON",
                        help="run nothing: print the verdicts a --json file recorded, per area, "
                        "as a markdown table")  # fmt: skip
    parser.add_argument(
        "--before",
        metavar="JSON",
        help="with --areas: an earlier --json file; cells read before -> now",
    )
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(f"{c.id:<28} {c.did}" for c in CASES))
        return 0
    if args.areas:
        print(by_area(_recorded(Path(args.areas)), _verdicts(args.before)))
        return 0
    cases = select(CASES, args.only, args.quick)
    outcomes = run_cases(cases, in_process=args.in_process, jobs=args.jobs)
    if args.json:
        rows = [{"id": o.case.id, "verdict": o.verdict, "exit": o.status, "reason": o.reason,
                 "lines": o.lines} for o in outcomes]  # fmt: skip
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    if args.markdown:
        print(markdown(outcomes), end="")
    else:
        for o in outcomes if args.show else ():
            print(show(o))
        print(table(outcomes))
        print(counts(outcomes))
    return 0 if all(o.clear or o.verdict == "skipped" for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
