"""What each `pipecompile` command does, once the command line is parsed (``cli``): one
function per command, taking the parsed arguments and returning the exit status."""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from pathlib import Path

from pipecompile.compiler.options import CompileOptions
from pipecompile.errors import PipecompileError
from pipecompile.ir.records.sizes import counted
from pipecompile.options.fields import from_args
from pipecompile.runtime.process.notes import note

__all__ = ["calibration", "compile_command", "export", "onnx", "plot", "run", "show", "viz"]


def calibration(args: argparse.Namespace) -> int:
    from pipecompile.planner.calibration_store import clear_records, describe

    print(clear_records() if args.clear else describe())
    return 0


def plot(args: argparse.Namespace) -> int:
    from pipecompile.reports.plot import write_plot

    written = write_plot(Path(args.source), Path(args.output) if args.output else None)
    _say(args, f"wrote {written}")
    return 0


def export(args: argparse.Namespace) -> int:
    from pipecompile.runtime.training.export import (
        SHARD_SIZE,
        export_sharded,
        export_weights,
        is_file_target,
    )

    _fresh(args, "export")
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


def onnx(args: argparse.Namespace) -> int:
    _write_onnx(args, Path(args.directory))
    return 0


def _write_onnx(args: argparse.Namespace, directory: Path) -> None:
    from pipecompile.interop.onnx_export import export_onnx

    paths = export_onnx(directory, progress=lambda line: _say(args, line))
    _say(args, f"wrote {', '.join(p.name for p in paths)} to {directory}")


def _fresh(args: argparse.Namespace, what: str) -> None:
    """The compiled directory refused where its model file changed since (as `run` does)."""
    from pipecompile.model.model_file import check_fresh
    from pipecompile.runtime.load import read_manifest

    if not args.allow_stale:
        directory = Path(args.directory)
        check_fresh(directory, read_manifest(directory), allowed=f"pass --allow-stale to {what}")


def _say(args: argparse.Namespace, text: str) -> None:
    if not args.quiet:
        print(text, file=sys.stderr)


def compile_command(args: argparse.Namespace) -> int:
    from pipecompile.codegen.emit import ModelRef
    from pipecompile.ir.graph.dynamic import merged_dynamic
    from pipecompile.model.model_configs import model_configs, unsaved_buffers
    from pipecompile.model.model_file import dynamic_shapes, load_model_file, split_ref
    from pipecompile.model.pretrained_files import open_pretrained
    from pipecompile.reports.summary import summary
    from pipecompile.surfaces.compile_job import check_compile_options, compile_into

    options = from_args(CompileOptions, vars(args))
    path, name = split_ref(args.model)
    out = Path(options.output or Path("pipecompile-out") / path.stem)
    searching = check_compile_options(options, out)
    pretrained = open_pretrained(Path(options.weights)) if options.weights else None
    _say(args, f"loading {path}:{name}")
    spec = load_model_file(args.model)
    what = f"the best plan for {options.devices or options.stages} devices"
    _say(
        args,
        f"compiling {type(spec.model).__name__} into "
        + (what if searching else f"{options.stages} stages"),
    )
    options.dynamic = merged_dynamic(options.dynamic, dynamic_shapes(spec), spec.inputs)
    model_ref = ModelRef(
        path, name, f"{path.name}:{name}", model_configs(spec.model), unsaved_buffers(spec.model)
    )
    _, notes = compile_into(
        spec.model,
        spec.inputs,
        options,
        out,
        model_ref=model_ref,
        pretrained=pretrained,
        model_file=spec.module,
        loss=(spec.loss_fn, spec.targets),
    )
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


def viz(args: argparse.Namespace) -> int:
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


def run(args: argparse.Namespace) -> int:
    from pipecompile.surfaces.run_command import run_directory

    return run_directory(args)


def show(args: argparse.Namespace) -> int:
    import json

    from pipecompile.reports.show import format_report, schedule_report

    if args.allow_stale and args.measured is None:
        raise PipecompileError(
            "--allow-stale lets --measured compare a traced run with a directory whose model "
            "file changed; `show` alone reads only the compiled program: drop --allow-stale"
        )
    if args.measured is not None:
        _fresh(args, "compare the traced run with")
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
