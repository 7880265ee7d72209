"""The command line: `pipecompile MODEL --stages N -o OUT` and `pipecompile run OUT`."""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from pathlib import Path
from typing import NoReturn

from pipecompile import __version__
from pipecompile.compiler.options import CompileOptions
from pipecompile.errors import CheckError, ModelFileError, PipecompileError
from pipecompile.ir.sizes import counted
from pipecompile.runtime.load import Emitted
from pipecompile.runtime.notes import note
from pipecompile.runtime.option_fields import (
    HONOURED,
    add_options,
    declared,
    flag_of,
    from_args,
    settled,
    size,
    to_argv,
)
from pipecompile.runtime.training.options import RunFlags, TrainFlags, for_loop, given
from pipecompile.schedules import ORDER, REGISTRY, SYNCHRONOUS, listed

__all__ = ["main"]

COMMANDS = ("compile", "run", "show", "export", "viz", "onnx", "plot", "calibration")


def main(argv: list[str] | None = None, *, command_line: bool = False) -> int:
    """Entry point of the `pipecompile` command; returns the exit status (130 after Ctrl-C or
    SIGTERM). ``command_line``: this process is the command itself, started for it, which has
    run no torch op yet (`run --nproc` then forks its rank starter from itself)."""
    from pipecompile.runtime.interrupt import EXIT_INTERRUPTED, sigterm_as_ctrl_c, user_stop

    try:
        parser = _parser()
        parsed, extra = parser.parse_known_args(
            _with_command(list(sys.argv[1:] if argv is None else argv))
        )
        if extra:
            parser.error(_unknown(extra, parsed.command))
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

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="pipecompile",
        description="Compile a PyTorch model into pipeline stages and a program, and run it.",
        epilog="`pipecompile MODEL ...` is short for `pipecompile compile MODEL ...`.",
    )
    parser.add_argument("--version", action="version", version=f"pipecompile {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    comp = commands.add_parser("compile", help="trace, balance, split and emit a model")
    comp.add_argument(
        "model", help="model file, optionally FILE.py:NAME (default NAME: build_model)"
    )
    add_options(comp, CompileOptions)
    comp.set_defaults(handler=_compile)

    run = commands.add_parser("run", help="train or check a compiled pipeline")
    run.add_argument("directory", help="a directory written by `pipecompile MODEL -o DIR`")
    add_options(run, RunFlags)
    add_options(run, TrainFlags)
    run.set_defaults(handler=_run)

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
    show.set_defaults(handler=_show)

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
    export.set_defaults(handler=_export)

    onnx = commands.add_parser("onnx", help="export every stage of a directory to ONNX")
    onnx.add_argument("directory", help="a directory written by `pipecompile MODEL -o DIR`")
    onnx.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")
    onnx.set_defaults(handler=_onnx)

    viz = commands.add_parser("viz", help="draw the stage and schedule pictures with Graphviz")
    viz.add_argument("directory", help="a directory written by `pipecompile MODEL -o DIR`")
    viz.add_argument("--format", default="svg", choices=("svg", "png", "pdf"))
    viz.add_argument("-o", "--output", help="where to write the pictures (default: DIRECTORY)")
    viz.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")
    viz.set_defaults(handler=_viz)

    plot = commands.add_parser("plot", help="draw a run's loss and throughput curves (SVG)")
    plot.add_argument(
        "source",
        help="a directory `pipecompile run` trained (its metrics.jsonl), "
        "or a metrics file written by run --metrics",
    )
    plot.add_argument("-o", "--output", help="the .svg to write (default: DIRECTORY/training.svg)")
    plot.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")
    plot.set_defaults(handler=_plot)

    calibration = commands.add_parser(
        "calibration", help="show or clear this machine's calibration of the plan search"
    )
    calibration.add_argument(
        "--clear",
        action="store_true",
        help="remove the kept calibrations: the next search (--devices N) measures the "
        "machine again",
    )
    calibration.set_defaults(handler=_calibration)
    return parser


def _calibration(args: argparse.Namespace) -> int:
    from pipecompile.planner.calibration_store import clear_records, describe

    print(clear_records() if args.clear else describe())
    return 0


def _plot(args: argparse.Namespace) -> int:
    from pipecompile.reports.plot import write_plot

    written = write_plot(Path(args.source), Path(args.output) if args.output else None)
    _say(args, f"wrote {written}")
    return 0


def _export(args: argparse.Namespace) -> int:
    from pipecompile.runtime.training.export import (
        SHARD_SIZE,
        export_sharded,
        export_weights,
        is_file_target,
    )

    target = Path(args.output)
    saved = Path(args.train_state) if args.train_state else None
    if is_file_target(target) and args.shard_size is not None:
        raise PipecompileError(
            f"--shard-size applies to a directory export; -o {target} is one .safetensors file "
            "(a single state dict): drop --shard-size, or name a directory"
        )
    if not is_file_target(target):
        notes: list[str] = []
        shard_size = args.shard_size or SHARD_SIZE
        count, shards = export_sharded(
            Path(args.directory),
            target,
            saved,
            shard_size=shard_size,
            force=args.force,
            notes=notes,
        )
        for line in notes:
            note(line)
        print(f"wrote {count} tensors in {counted(shards, 'shard')} to {target}")
        return 0
    count = export_weights(Path(args.directory), target, saved)
    print(f"wrote {count} tensors to {args.output}")
    return 0


def _onnx(args: argparse.Namespace) -> int:
    _write_onnx(args, Path(args.directory))
    return 0


def _write_onnx(args: argparse.Namespace, directory: Path) -> None:
    from pipecompile.interop.onnx_export import export_onnx

    paths = export_onnx(directory, progress=lambda line: _say(args, line))
    _say(args, f"wrote {', '.join(p.name for p in paths)} to {directory}")


def _positive_size(text: str) -> int:
    if size(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is no size to write a shard of; give e.g. 2GB")
    return size(text)


def _say(args: argparse.Namespace, text: str) -> None:
    if not args.quiet:
        print(text, file=sys.stderr)


def _compile(args: argparse.Namespace) -> int:
    from pipecompile.codegen.emit import ModelRef
    from pipecompile.compile_job import check_options, compile_into
    from pipecompile.ir.dynamic import merged_dynamic
    from pipecompile.model.model_configs import model_configs
    from pipecompile.model.model_file import dynamic_shapes, load_model_file, split_ref
    from pipecompile.model.pretrained_files import open_pretrained
    from pipecompile.reports.summary import summary

    options = from_args(CompileOptions, args)
    path, name = split_ref(args.model)
    out = Path(options.output or Path("pipecompile-out") / path.stem)
    searching = check_options(options, out)
    pretrained = open_pretrained(Path(options.weights)) if options.weights else None
    _say(args, f"loading {path}:{name}")
    spec = load_model_file(args.model)
    what = f"the best plan for {options.devices or options.stages} devices"
    _say(args, f"compiling {type(spec.model).__name__} into " + (
        what if searching else f"{options.stages} stages"))  # fmt: skip
    options.dynamic = merged_dynamic(options.dynamic, dynamic_shapes(spec), spec.inputs)
    model_ref = ModelRef(path, name, f"{path.name}:{name}", model_configs(spec.model))
    _, notes = compile_into(spec.model, spec.inputs, options, out, model_ref=model_ref,
                            pretrained=pretrained, model_file=spec.module)  # fmt: skip
    for line in notes:
        note(line)
    _compile_pictures(args, out)
    if options.onnx:
        _write_onnx(args, out)
    if not options.quiet:
        print(summary(out))
    return 0


def _compile_pictures(args: argparse.Namespace, out: Path) -> None:
    """Draw the pictures into the emitted directory; a failure only prints a warning."""
    start = time.perf_counter()
    try:
        from pipecompile.reports.pictures.pictures import write_pictures
        from pipecompile.reports.pictures.render import INSTALL_HINT

        pictures = write_pictures(out)
    except Exception as err:  # pictures are a bonus: never fail a compile over them
        if os.environ.get("PIPECOMPILE_DEBUG"):
            traceback.print_exc()
        print(f"pipecompile: warning: pictures not drawn: {err}", file=sys.stderr)
        return
    _say(args, f"  {'pictures':<22} {(time.perf_counter() - start) * 1000:8.1f} ms")
    if not pictures.drawn:
        _say(
            args,
            f"wrote stages.dot and schedule.dot only. {INSTALL_HINT}, then run "
            f"`pipecompile viz {out}`",
        )


def _viz(args: argparse.Namespace) -> int:
    from pipecompile.reports.pictures.pictures import write_pictures
    from pipecompile.reports.pictures.render import INSTALL_HINT

    if args.output and Path(args.output).exists() and not Path(args.output).is_dir():
        raise PipecompileError(f"viz -o {args.output}: is a file; name a directory")
    pictures = write_pictures(
        Path(args.directory), fmt=args.format, out=Path(args.output) if args.output else None
    )
    if not pictures.drawn:
        written = " and ".join(str(p) for p in pictures.sources)
        raise PipecompileError(f"wrote {written} but cannot draw them. {INSTALL_HINT}")
    _say(args, "wrote " + ", ".join(str(p) for p in pictures.drawn))
    return 0


def _run(args: argparse.Namespace) -> int:
    if args.nproc and args.command_line:  # before anything runs a torch op in this process
        from pipecompile.runtime.distributed.local_ranks import fork_a_starter

        fork_a_starter()
    from pipecompile.model.model_file import recorded_model
    from pipecompile.runtime.load import open_emitted
    from pipecompile.runtime.pipeline import Pipeline

    directory = Path(args.directory)
    emitted = open_emitted(directory, args.program)
    manifest = emitted.manifest
    _check_run_options(args, emitted)
    # None until here, where what was given is known: each option not given takes its default
    vars(args).update(vars(settled(from_args(RunFlags, args))))
    if args.nproc:
        return _run_distributed(args, emitted)
    from pipecompile.runtime.threads import use_threads

    use_threads(args.threads)
    # Only --check builds the model (its eager reference); a run builds just the stages.
    spec = recorded_model(
        args.model, directory, manifest, allow_stale=args.allow_stale, build=args.check
    )
    if spec.loss_fn is None:
        raise ModelFileError(f"{spec.path} needs loss_fn(output, *targets) for `run`")
    pipe = Pipeline.opened(emitted)
    if args.check:
        return _check(args, pipe, spec)
    from pipecompile.model.data_hooks import EVAL, batch_source, example_source
    from pipecompile.runtime.interrupt import EXIT_INTERRUPTED, interrupted_line
    from pipecompile.runtime.training.loop import TrainState, train
    from pipecompile.runtime.training.train_state import remove_partial

    data = batch_source(spec) or example_source(spec)
    options = _train_options(args, directory)
    options.measure_memory = True
    state = TrainState()
    try:
        train(pipe, spec.loss_fn, data, options, eval_data=batch_source(spec, EVAL), state=state)
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM (main turns it into one)
        if options.save is not None:  # a stop between a save's first steps leaves them too
            remove_partial(options.save)
        print(interrupted_line(state.done, state.total, options.save), file=sys.stderr)
        return EXIT_INTERRUPTED
    if args.stats and pipe.last is not None:
        print(_stats_table(pipe, directory, args.program))
    return 0


def _check(args: argparse.Namespace, pipe, spec) -> int:  # type: ignore[no-untyped-def]
    """`run --check`: one step against the eager model."""
    from pipecompile.runtime.check.batch_shapes import checked_shapes
    from pipecompile.runtime.check.eager import check_against_eager

    if spec.targets is None:
        raise ModelFileError(f"{spec.path} needs example_targets() for `run --check`")
    assert spec.model is not None  # built for --check
    pipe.compile_stages(args.compile)
    ok = True
    for label, shaped in checked_shapes(spec, pipe, args.batch_shapes):
        report = check_against_eager(pipe, shaped, lr=args.lr, atol=args.atol, rtol=args.rtol)
        print(f"{label}\n{report}" if label else report)
        ok = ok and report.ok
    if not ok:
        raise CheckError("pipelined results differ from the eager model (see above)")
    return 0


def _check_run_options(args: argparse.Namespace, emitted: Emitted) -> None:
    """Options that contradict each other or the directory, refused before anything runs."""
    directory = emitted.directory
    from pipecompile.codegen.output_dir import inside
    from pipecompile.runtime.training.train_state import latest_step_dir, read_meta

    if args.save_every and not args.save:
        raise PipecompileError("--save-every needs --save DIR (where to write the train state)")
    on_gpus = _uses_cuda(args)  # also refuses --device cuda with too few GPUs
    if args.precision == "fp16" and not on_gpus:
        raise PipecompileError(
            "--precision fp16 needs a GPU (run --nproc N --device cuda): on the CPU, use "
            "--precision bf16"
        )
    _check_program_options(args, emitted)
    if args.save and inside(Path(args.save), directory):
        raise PipecompileError(
            f"--save {args.save} lies inside {directory}, which a recompile replaces; "
            f"save beside it instead, e.g. --save {directory.resolve()}-train-state"
        )
    if args.resume:
        step = read_meta(latest_step_dir(Path(args.resume)))["step"]
        if args.steps is None and args.epochs is None:
            raise PipecompileError(
                f"--resume {args.resume}: the saved step is {step}, and without --steps "
                f"the run has nothing more to do; pass --steps greater than {step}"
            )
        if args.steps is not None and step >= args.steps:
            raise PipecompileError(
                f"--resume {args.resume} continues after step {step}, but --steps {args.steps} "
                f"ends there; pass --steps greater than {step}"
            )
    if not args.check:
        _check_run_places(args, directory)


def _check_run_places(args: argparse.Namespace, directory: Path) -> None:
    """Where the run writes (--save, --metrics), checked before it starts."""
    from pipecompile.runtime.training.loop_options import check_places

    if args.force and not args.save:
        raise PipecompileError("--force lets --save replace another run's train state; drop it")
    replaced = check_places(_train_options(args, directory), force=args.force)
    if replaced:
        note(replaced)


def _uses_cuda(args: argparse.Namespace) -> bool:
    """Whether the run's stages would be on a GPU (only `--nproc` places them there); refuses
    --device cuda with fewer GPUs than ranks before any rank starts."""
    from pipecompile.runtime.distributed.gpus import device_kind

    if not args.nproc:
        return False
    return device_kind(args.device or "auto", args.nproc) == "cuda"


def _check_program_options(args: argparse.Namespace, emitted: Emitted) -> None:
    """Options this run would ignore, and training options the program's schedule cannot
    honour (see training.check_options)."""
    from pipecompile.runtime.training.loop_options import check_options

    _refuse_ignored(args)
    check_options(_train_options(args, emitted.directory), emitted.program)


def _train_options(args: argparse.Namespace, directory: Path) -> TrainFlags:
    return for_loop(from_args(TrainFlags, args), directory)


def _is_not_given(value: object) -> bool:
    return value is None or value is False  # 0 and 0.0 are given values


def _refuse_ignored(args: argparse.Namespace) -> None:
    """Options given that this run would accept and ignore, refused with the reason: each
    option's declaration says which mode it needs (``needs``) and what `--check` or
    `--nproc` cannot honour (``under_check``, ``under_nproc``)."""
    run_given = [o for f, o in declared(RunFlags) if not _is_not_given(getattr(args, f.name))]
    for o in run_given:
        if o.needs and not getattr(args, o.needs):
            mode = flag_of(RunFlags, o.needs)
            raise PipecompileError(f"{o.flag} {o.needs_why}; drop {o.flag}, or add {mode}")
    for o in run_given if args.nproc else ():
        if o.under_nproc:
            raise PipecompileError(f"{o.flag} {o.under_nproc}; drop it with --nproc")
    if not args.check:
        return
    # why `run --check` (one fp32 step of the compiled weights on the example batch, against
    # the eager model) cannot honour an option: each option's declaration says
    why = {f.name: o.under_check for f, o in declared(TrainFlags) if o.under_check != HONOURED}
    cannot = [(flag, why[name]) for flag, name in given(from_args(TrainFlags, args)) if name in why]
    cannot += [(o.flag, o.under_check) for o in run_given if o.under_check]
    if cannot:
        listed = "; ".join(f"{flag}: {why}" for flag, why in cannot)
        them = "it" if len(cannot) == 1 else "them"
        raise PipecompileError(
            f"--check runs one fp32 step of the compiled weights on the example batch against "
            f"the eager model and cannot honour {listed}; drop {them}, or train without --check"
        )


def _stats_table(pipe, directory: Path, program: str | None) -> str:  # type: ignore[no-untyped-def]
    from pipecompile.ir.sizes import format_size
    from pipecompile.reports.show import schedule_report

    predicted, _ = schedule_report(directory, program_path=program, uniform=True)
    assert pipe.last is not None
    stats = pipe.last.stats
    rows = [
        "device   peak in-flight (measured / predicted)   peak activations (measured / predicted)"
    ]
    for d, dev in enumerate(stats.devices):
        want = predicted.get("peak_activation_bytes")
        rows.append(
            f"{d:>6}   {dev.peak_inflight:>14} / {predicted['peak_inflight'][d]:<9}"
            f"                 {format_size(dev.peak_stored):>10} / "
            f"{format_size(want[d]) if want else '-'}"
        )
    balance = pipe.manifest.balance
    timed = balance is not None and balance.unit == "ns"
    predicted_ns = balance.stage_compute if timed else None  # type: ignore[union-attr]
    m = pipe.program.microbatches
    rows.append("stage   compute per micro-batch, forward + backward (measured / predicted)")
    for j in sorted(stats.compute_ns):
        want_ns = predicted_ns[j] if predicted_ns else None
        ratio = ""
        if want_ns and balance.cost == "time":  # type: ignore[union-attr]
            ratio = f"  ({stats.compute_ns[j] / m / want_ns:.2f}x)"
        elif want_ns:
            rate = (balance.model or {})["flops_rate"]  # type: ignore[union-attr]
            ratio = f"  (FLOPs at {rate:g}/s; compile with --balance time to compare)"
        rows.append(
            f"{j:>5}   {stats.compute_ns[j] / m / 1e3:>10.1f} us / "
            f"{'-' if want_ns is None else f'{want_ns / 1e3:.1f} us'}{ratio}"
        )
    return "\n".join(rows)


def _run_distributed(args: argparse.Namespace, emitted: Emitted) -> int:
    from pipecompile.files.names import METRICS
    from pipecompile.runtime.distributed.launch import launch
    from pipecompile.runtime.distributed.placement import Placement

    directory, manifest, program = emitted
    placement = Placement.from_manifest(manifest, program.stage_device)
    _check_mesh(args, program, placement.world)
    if args.shard in ("grads", "params"):
        _check_fully_sharded(args, program, placement, manifest)
    if args.nproc != placement.world * args.dp:  # refused before any rank starts
        raise PipecompileError(
            f"--nproc {args.nproc}: the program runs on {len(program.devices)} devices with "
            f"replicas {list(placement.device_replicas)}, {placement.world} ranks; "
            f"run --nproc {placement.world * args.dp}"
            + (f" (--dp {args.dp} copies of {placement.world})" if args.dp > 1 else "")
        )
    if args.metrics is None:
        args.metrics = str(Path(args.directory) / METRICS)
    ranks = to_argv(from_args(RunFlags, args)) + to_argv(from_args(TrainFlags, args))
    return launch(args.nproc, [args.directory, *ranks])


def _check_mesh(args: argparse.Namespace, program, width: int) -> None:  # type: ignore[no-untyped-def]
    """--dp and --shard, refused where they cannot run (before any rank starts)."""
    if args.dp > 1 and args.nproc % args.dp:
        raise PipecompileError(
            f"--dp {args.dp} does not divide --nproc {args.nproc}: each of the {args.dp} copies "
            f"of the pipeline needs {width} ranks; run --nproc {width * args.dp}"
        )
    if args.dp > 1 and program.asynchronous:
        synchronous = listed(o for o in ORDER if o in SYNCHRONOUS)
        raise PipecompileError(
            f"--dp {args.dp} needs a synchronous schedule: {program.schedule} updates the weights "
            "after each micro-batch, before the copies could average their gradients; compile "
            f"with a synchronous schedule (--schedule {synchronous})"
        )
    if args.dp > 1 and args.check:
        raise PipecompileError(
            "--check compares one pipeline with the eager model; drop --dp (the copies run "
            "the same program)"
        )
    if args.shard is None:
        return
    if args.dp == 1:
        raise PipecompileError(
            f"--shard {args.shard} shards across the data-parallel copies, and there is one; "
            "add --dp D (D copies), or drop --shard"
        )


def _check_fully_sharded(args: argparse.Namespace, program, placement, manifest) -> None:  # type: ignore[no-untyped-def]
    """--shard grads|params: the stages run under FSDP2, which owns each stage's backward
    and gradients; what it cannot run with is refused before any rank starts."""
    from pipecompile.ir.instr import Op
    from pipecompile.runtime.torch_compiled import resolve_backend

    flag = f"--shard {args.shard}"
    if any(instr.op in (Op.I, Op.W) for _, _, instr in program.instructions()):
        raise PipecompileError(
            f"{flag}: {program.schedule} splits each backward in two (I and W), and FSDP "
            "reduces a stage's gradients in one backward; compile with --schedule "
            f"{listed(n for n, s in REGISTRY.items() if s.synchronous and not s.split_backward)}, "
            "or use --shard optimizer"
        )
    if placement.world != len(program.devices):
        raise PipecompileError(
            f"{flag}: the program replicates stages (--replicate, replicas "
            f"{list(placement.device_replicas)}), whose sums FSDP does not make; compile "
            "without --replicate and add copies with --dp, or use --shard optimizer"
        )
    if resolve_backend(args.compile, manifest.compile) is not None:
        raise PipecompileError(
            f"{flag}: the stages' forwards run through torch.compile, which pipecompile does "
            "not combine with FSDP; add --compile off, or use --shard optimizer"
        )


def _show(args: argparse.Namespace) -> int:
    import json

    from pipecompile.reports.show import format_report, schedule_report

    if args.measured is not None:
        from pipecompile.reports.measured import format_measured, measured_report

        if args.program is not None or args.uniform:
            raise PipecompileError(
                "--measured reads the traced run's own program and costs; drop --program "
                "and --uniform"
            )
        figures = measured_report(args.directory, args.measured)
        print(json.dumps(figures, indent=2) if args.json else format_measured(figures))
        return 0
    report, timeline = schedule_report(
        args.directory, program_path=args.program, uniform=args.uniform
    )
    print(json.dumps(report, indent=2) if args.json else format_report(report, timeline))
    return 0
