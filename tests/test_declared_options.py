"""Each option is declared once, as a dataclass field: it has help, it is a flag of its
command, a keyword of the Python API, and `run --nproc` forwards it to each rank unchanged."""

from __future__ import annotations

import argparse
import dataclasses
import inspect

import pytest
import torch

import pipecompile
from pipecompile.api import CompiledPipeline
from pipecompile.cli import _parser
from pipecompile.compile_options import CompileOptions
from pipecompile.compiler import compile_model
from pipecompile.errors import PipecompileError
from pipecompile.runtime.distributed.worker import _parse, worker_parser
from pipecompile.runtime.option_fields import (
    declared,
    finite_float,
    from_args,
    nonnegative_float,
    nonnegative_int,
    positive_float,
    positive_int,
    settled,
    size,
    to_argv,
)
from pipecompile.runtime.training.loop_options import TrainOptions
from pipecompile.runtime.training.options import RunFlags, TrainFlags

COMMAND = {CompileOptions: "compile", RunFlags: "run", TrainFlags: "run"}


def _command_actions(command: str) -> dict[str, argparse.Action]:
    commands = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    return {a.dest: a for a in commands.choices[command]._actions}


@pytest.mark.parametrize("cls", list(COMMAND), ids=lambda c: c.__name__)
def test_every_option_has_help_and_is_a_flag_of_its_command(cls):
    actions = _command_actions(COMMAND[cls])
    for f, o in declared(cls):
        assert o.help.strip(), f"{cls.__name__}.{f.name} has no help"
        assert f.name in actions, f"{cls.__name__}.{f.name} is no flag of {COMMAND[cls]}"
        assert tuple(actions[f.name].option_strings) == o.flags
        assert actions[f.name].help == o.help


# Compile options with no API keyword, and why (docs/API.md says so too).
COMMAND_LINE_ONLY = {"tune": "it trains each plan with `pipecompile run` from the model file"}


def test_every_compile_option_is_a_keyword_of_compile():
    takes = set(inspect.signature(pipecompile.compile).parameters)
    takes |= set(inspect.signature(compile_model).parameters)  # through **options
    for f, o in declared(CompileOptions):
        if f.name in COMMAND_LINE_ONLY:
            assert o.api is None and f.name not in takes
            continue
        assert o.api is not None, f"{f.name}: every compile option has an API keyword"
        assert (o.api or f.name) in takes, f"--{f.name}: compile() takes no {o.api or f.name}"


def test_every_training_option_is_a_keyword_of_fit():
    takes = set(inspect.signature(CompiledPipeline.fit).parameters)
    takes |= {f.name for f in dataclasses.fields(TrainOptions)}  # through **options
    for f, o in declared(TrainFlags):
        assert o.api is not None, f"{f.name}: every training option has an API keyword"
        assert (o.api or f.name) in takes, f"--{f.name}: fit() takes no {o.api or f.name}"


def test_runs_own_options_are_the_command_lines_only():
    """check, nproc, device, ... choose how `run` runs; fit() runs here, on the local backend."""
    assert all(o.api is None for _, o in declared(RunFlags))


def _sample(f: dataclasses.Field, o, tmp_path) -> object:
    """A value other than ``f``'s default, as the parser would produce it."""
    if o.switch:
        return True
    if o.choices:
        return next(c for c in o.choices if c != f.default)
    if o.path:
        return str(tmp_path / f.name)
    if o.check in (positive_int, nonnegative_int):
        return 3
    if o.check in (positive_float, nonnegative_float, finite_float):
        return 0.25
    if f.name == "batch_shapes":  # checked against the compile's symbols, not at parsing
        return "3x5,8x11"
    raise AssertionError(f"no sample value for {f.name}: add one to _sample")


@pytest.mark.parametrize("cls", [RunFlags, TrainFlags], ids=lambda c: c.__name__)
def test_forwarding_round_trips_every_forwarded_option(cls, tmp_path):
    """parse(forward(options)) == options, one option at a time and all together."""
    forwarded = [(f, o) for f, o in declared(cls) if o.forwarded]
    assert forwarded
    every = {f.name: _sample(f, o, tmp_path) for f, o in forwarded}
    for values in [*({k: v} for k, v in every.items()), every]:
        options = dataclasses.replace(cls(), **values)
        argv = to_argv(options)
        assert argv, values
        for parser in (worker_parser(), _parser()):
            prefix = [] if parser.prog.endswith("worker") else ["run"]
            assert from_args(cls, parser.parse_args([*prefix, "out", *argv])) == options, argv


def test_options_run_keeps_for_itself_are_not_forwarded():
    assert to_argv(RunFlags(nproc=2, stats=True)) == []
    assert not {"nproc", "stats"} & set(vars(worker_parser().parse_args(["out"])))


def test_not_given_is_none_until_settled():
    """Refusals tell a default given from one not given; a rank settles as `run` does."""
    assert RunFlags().atol is None and RunFlags().device is None
    # --atol/--rtol stay None: not given, --check judges by the noise floor (docs/USAGE.md)
    assert settled(RunFlags()) == RunFlags(device="auto", timeout=60.0, dp=1)
    assert settled(RunFlags(timeout=5.0)).timeout == 5.0
    args = _parse(["out"])
    assert (args.atol, args.rtol, args.timeout, args.device) == (None, None, 60.0, "auto")


def test_a_compile_option_parses_to_its_field():
    actions = _command_actions("compile")
    assert actions["memory_budget"].type is size
    args = _parser().parse_args(["compile", "m.py", "--stages", "2", "--split-at", "a"])
    options = from_args(CompileOptions, args)
    # --schedule and --microbatches not given: gpipe and 1, or searched under --devices
    assert (options.stages, options.split_at, options.schedule) == (2, ["a"], None)
    assert options.microbatches is None and options.devices is None


def test_compile_refuses_an_unknown_keyword():
    model = torch.nn.Linear(4, 4)
    with pytest.raises(PipecompileError, match=r"unknown option\(s\) stage_count; it takes "):
        pipecompile.compile(model, torch.randn(2, 4), stages=2, stage_count=2)
