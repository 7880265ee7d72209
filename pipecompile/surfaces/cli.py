"""The command line: `pipecompile MODEL --stages N -o OUT` and `pipecompile run OUT`."""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from typing import NoReturn

from pipecompile import __version__
from pipecompile.compiler.options import CompileOptions
from pipecompile.errors import CheckError, PipecompileError
from pipecompile.options.fields import (
    add_options,
    declared,
    size,
)
from pipecompile.options.run import RunFlags, TrainFlags
from pipecompile.surfaces import commands as command

__all__ = ["main"]

COMMANDS = ("compile", "run", "show", "export", "viz", "onnx", "plot", "calibration", "generate")


def main(argv: list[str] | None = None, *, command_line: bool = False) -> int:
    """Entry point of the `pipecompile` command; returns the exit status (130 after Ctrl-C or
    SIGTERM). ``command_line``: this process is the command itself, started for it, which has
    run no torch op yet (`run --nproc` then forks its rank starter from itself)."""
    from pipecompile.runtime.process.interrupt import EXIT_INTERRUPTED, sigterm_as_ctrl_c, user_stop

    try:
        parser = _parser()
        parsed, extra = parser.parse_known_args(
            _with_command(list(sys.argv[1:] if argv is None else argv))
        )
        if extra:  # the command's own usage error, pointing at its own --help
            parser.command(parsed.command).error(_unknown(extra, parsed.command))
    except SystemExit as done:  # --help, --version, or a usage error already printed
        return done.code if isinstance(done.code, int) else 2
    parsed.command_line = command_line
    try:
        with sigterm_as_ctrl_c():
            return parsed.handler(parsed)
    except BrokenPipeError:  # `pipecompile show OUT | head`: the reader left; not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except CheckError as err:
        print(f"pipecompile: {err}", file=sys.stderr)
        return 1
    except PipecompileError as err:
        if os.environ.get("PIPECOMPILE_DEBUG"):
            traceback.print_exc()
        print(f"pipecompile: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # `run` says more itself; elsewhere this line is all there is
        print("pipecompile: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as err:  # a writer that failed again closing its file after the stop
        if user_stop(err) is None:
            raise  # an internal error: its traceback is the report
        print("pipecompile: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def _with_command(args: list[str]) -> list[str]:
    """The arguments with the command first: `pipecompile -q model.py --stages 4` is
    `pipecompile compile -q model.py --stages 4`, and `pipecompile -q run OUT` is `run -q OUT`."""
    if not args or args[0] in COMMANDS or args[0] in ("-h", "--help", "--version"):
        return args
    for k, arg in enumerate(args):
        if arg in COMMANDS and all(a.startswith("-") for a in args[:k]):
            return [arg, *args[:k], *args[k + 1 :]]
    return ["compile", *args]


def _unknown(extra: list[str], command: str) -> str:
    """The usage error for arguments ``command`` does not take: a flag of the other command
    (a compile option given to `run`, a run option to `compile`) is named as such."""
    if command == "calibration" and not extra[0].startswith("-"):
        return (
            f"`pipecompile calibration` takes no model or directory (got {extra[0]}): the "
            "calibration is this machine's, shared by every search; `pipecompile calibration` "
            "shows it, `pipecompile calibration --clear` removes it"
        )
    flags = [a.split("=", 1)[0] for a in extra if a.startswith("--")]
    compile_flags = {o.flag for _, o in declared(CompileOptions)}
    run_flags = {o.flag for cls in (RunFlags, TrainFlags) for _, o in declared(cls)}
    to_run = (
        "{f} is an option of compiling, which fixes the program `run` runs: recompile with it "
        "(`pipecompile MODEL ... {f} ...`), then run"
    )
    to_compile = (
        "{f} is an option of `pipecompile run OUT`, not of compiling: compile first, then "
        "`pipecompile run OUT {f} ...`"
    )
    # the flags only the other command takes, and what to say of one
    others = {
        "run": (compile_flags - run_flags, to_run),
        "compile": (run_flags - compile_flags, to_compile),
    }
    other, said = others.get(command, (set(), ""))
    theirs = [f for f in flags if f in other]
    if theirs:
        return said.format(f=theirs[0])
    return f"unrecognized arguments: {' '.join(extra)}"


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one line (with where to read more), not the usage."""

    commands: argparse._SubParsersAction | None = None

    def command(self, name: str) -> argparse.ArgumentParser:
        """The parser of command ``name`` (this one where it has none of that name)."""
        return self.commands.choices.get(name, self) if self.commands else self

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def _parser() -> _Parser:
    parser = _Parser(
        prog="pipecompile",
        description="Compile a PyTorch model into pipeline stages and a program, and run it.",
        epilog="`pipecompile MODEL ...` is short for `pipecompile compile MODEL ...`.",
    )
    parser.add_argument("--version", action="version", version=f"pipecompile {__version__}")
    commands = parser.commands = parser.add_subparsers(dest="command", required=True)
    _compile_and_run(commands)
    _show_and_export(commands)
    _pictures_and_calibration(commands)
    from pipecompile.surfaces.generate_command import add_generate

    add_generate(commands)
    return parser


def _compile_and_run(commands: argparse._SubParsersAction) -> None:
    comp = commands.add_parser("compile", help="trace, balance, split and emit a model")
    comp.add_argument(
        "model", help="model file, optionally FILE.py:NAME (default NAME: build_model)"
    )
    add_options(comp, CompileOptions)
    comp.set_defaults(handler=command.compile_command)

    run = commands.add_parser("run", help="train or check a compiled pipeline")
    run.add_argument("directory", help="a directory written by `pipecompile MODEL -o DIR`")
    add_options(run, RunFlags)
    add_options(run, TrainFlags)
    run.set_defaults(handler=command.run)


def _show_and_export(commands: argparse._SubParsersAction) -> None:
    show = commands.add_parser("show", help="simulate a compiled pipeline's schedule")
    show.add_argument("directory", help="a directory written by `pipecompile MODEL -o DIR`")
    show.add_argument("--program", help="show this program file instead (verified first)")
    show.add_argument("--json", action="store_true", help="print the figures as JSON")
    show.add_argument(
        "--uniform", action="store_true", help="costs F=1, B=2 (I=W=1) instead of the stages' FLOPs"
    )
    show.add_argument(
        "--measured",
        metavar="TRACE",
        help="where each rank's step went in a `run --trace TRACE`, next to the prediction",
    )
    _allow_stale(show, "--measured: compare")
    show.set_defaults(handler=command.show)

    export = commands.add_parser("export", help="write the weights with the model's names")
    export.add_argument("directory", help="a directory written by `pipecompile MODEL -o DIR`")
    export.add_argument(
        "-o",
        "--output",
        required=True,
        help="a .safetensors file (one state dict), or a directory in the "
        "Hugging Face layout (shards, model.safetensors.index.json)",
    )
    export.add_argument(
        "--shard-size",
        type=_positive_size,
        help="largest shard of a directory export (default 5GB)",
    )
    export.add_argument(
        "--train-state",
        "--checkpoint",
        dest="train_state",
        metavar="DIR",
        help="take the weights of the newest step `run --save DIR` saved "
        "(--checkpoint: its old name)",
    )
    export.add_argument(
        "--force",
        action="store_true",
        help="write into a directory holding other files (they are kept; a "
        "file an export did not write is never replaced)",
    )
    _allow_stale(export, "export")
    export.set_defaults(handler=command.export)


def _pictures_and_calibration(commands: argparse._SubParsersAction) -> None:
    onnx = commands.add_parser("onnx", help="export every stage of a directory to ONNX")
    onnx.add_argument("directory", help="a directory written by `pipecompile MODEL -o DIR`")
    onnx.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")
    onnx.set_defaults(handler=command.onnx)

    viz = commands.add_parser("viz", help="draw the stage and schedule pictures with Graphviz")
    viz.add_argument("directory", help="a directory written by `pipecompile MODEL -o DIR`")
    viz.add_argument("--format", default="svg", choices=("svg", "png", "pdf"))
    viz.add_argument("-o", "--output", help="where to write the pictures (default: DIRECTORY)")
    viz.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")
    viz.set_defaults(handler=command.viz)

    plot = commands.add_parser("plot", help="draw a run's loss and throughput curves (SVG)")
    plot.add_argument(
        "source",
        help="a directory `pipecompile run` trained (its metrics.jsonl), "
        "or a metrics file written by run --metrics",
    )
    plot.add_argument("-o", "--output", help="the .svg to write (default: DIRECTORY/training.svg)")
    plot.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")
    plot.set_defaults(handler=command.plot)

    calibration = commands.add_parser(
        "calibration", help="show or clear this machine's calibration of the plan search"
    )
    calibration.add_argument(
        "--clear",
        action="store_true",
        help="remove the kept calibrations: the next search (--devices N) measures the "
        "machine again",
    )
    calibration.set_defaults(handler=command.calibration)


def _allow_stale(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument(
        "--allow-stale",
        action="store_true",
        help=f"{what} even though the model file changed since compiling",
    )


def _positive_size(text: str) -> int:
    if size(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is no size to write a shard of; give e.g. 2GB")
    return size(text)
