"""Each option is declared once, as a dataclass field: it has help, it is a flag of its
command, a keyword of the Python API, and `run --nproc` forwards it to each rank unchanged."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json

import pytest
import torch

import pipecompile
from pipecompile.compiler.options import CompileOptions
from pipecompile.errors import PipecompileError
from pipecompile.ir.programs.cost_model import CostModel
from pipecompile.options.fields import (
    declared,
    finite_float,
    from_args,
    from_record,
    nonnegative_float,
    nonnegative_int,
    positive_float,
    positive_int,
    settled,
    size,
    to_argv,
    to_record,
)
from pipecompile.options.generate import GenerateFlags
from pipecompile.options.run import RunFlags, TrainFlags
from pipecompile.runtime.job.run import rank_parser
from pipecompile.surfaces.api import CompiledPipeline
from pipecompile.surfaces.cli import _parser

COMMAND = {CompileOptions: "compile", RunFlags: "run", TrainFlags: "run", GenerateFlags: "generate"}


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
    for f, o in declared(CompileOptions):
        if f.name in COMMAND_LINE_ONLY:
            assert o.api is None and f.name not in takes
            with pytest.raises(PipecompileError, match=f"unknown option.*{f.name}"):
                CompileOptions.from_keywords(**{f.name: 1})
            continue
        assert o.api is not None, f"{f.name}: every compile option has an API keyword"
        if o.api == "machine":  # the machine flags are the API's one machine=CostModel(...)
            continue
        keyword = o.api or f.name
        value = object()
        # the keyword reaches its field (the one object compile() hands down), ...
        if keyword != "progress":
            assert getattr(CompileOptions.from_keywords(**{keyword: value}), f.name) is value
        # ... and compile() takes it, by name or through **options
        assert keyword in takes or "options" in takes, f"compile() takes no {keyword}"


# generate's options the Python API has no keyword for: the command's prompt sources and its
# printing (the API takes token ids and returns tensors)
GENERATE_COMMAND_LINE_ONLY = {"prompt_ids", "prompt", "prompts", "tokenizer", "quiet"}


def test_every_generate_option_is_a_keyword_of_the_pipelines_generate():
    """The declarations name the API's keywords; CompiledPipeline.generate takes each, and
    nothing the declarations do not (bar its own: the prompts and the pad id it pads with)."""
    takes = set(inspect.signature(CompiledPipeline.generate).parameters)
    named = set()
    for f, o in declared(GenerateFlags):
        if f.name in GENERATE_COMMAND_LINE_ONLY:
            assert o.api is None, f.name
            continue
        named.add(o.api or f.name)
    assert takes - named == {"self", "input_ids", "pad_token_id"}
    assert named <= takes


def test_the_api_keywords_settle_as_the_flags_do():
    machine = CostModel(bandwidth=1e9, workers=3)
    o = CompileOptions.from_keywords(
        stages=2, pinned={"h.0": 5}, replicas=(2, 1), machine=machine, progress=True,
        checkpoint="always", directory="out", split_at=("h.1",),
    )  # fmt: skip
    flags = _parser().parse_args(
        ["compile", "m.py", "--stages", "2", "--pin-cost", "h.0=5", "--replicate", "2,1",
         "--bandwidth", "1GB/s", "--workers", "3", "--checkpoint", "always", "-o", "out",
         "--split-at", "h.1"]
    )  # fmt: skip
    f = from_args(CompileOptions, vars(flags))
    assert (o.pinned(), o.replicas(2), o.cost_model()) == (f.pinned(), f.replicas(2), machine)
    assert (o.recompute, o.output, o.split_at, o.quiet) == (f.recompute, f.output, ["h.1"], False)
    assert CompileOptions.from_keywords().quiet  # the API prints nothing unless asked
    with pytest.raises(PipecompileError, match="checkpoint is the old name"):
        CompileOptions.from_keywords(recompute="always", checkpoint="except_last")


def test_every_training_option_is_a_keyword_of_fit():
    named = set(inspect.signature(CompiledPipeline.fit).parameters)
    for f, o in declared(TrainFlags):
        assert o.api is not None, f"{f.name}: every training option has an API keyword"
        # fit() names it, or hands it through **options to the TrainFlags field of that name
        assert (o.api or f.name) in named | {f.name}, f"--{f.name}: fit() takes no {o.api}"


def test_fit_hands_its_keywords_to_the_one_options_object(tmp_path):
    pipe = pipecompile.compile(torch.nn.Linear(4, 2), torch.randn(4, 4), stages=1)
    seen = {}

    def train(pipeline, loss_fn, data, options, eval_data=None):
        seen["options"] = options
        raise StopIteration

    import pipecompile.runtime.training.loop as loop

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(loop, "train", train)
        with pytest.raises(StopIteration):
            pipe.fit([(torch.randn(4, 4), torch.randn(4, 2))], torch.nn.functional.mse_loss,
                     steps=2, accumulate=2, measure_memory=True,
                     save=str(tmp_path / "ck"))  # fmt: skip
    options = seen["options"]
    assert isinstance(options, TrainFlags)
    assert (options.steps, options.accumulate, options.measure_memory) == (2, 2, True)
    assert options.save == tmp_path / "ck" and options.quiet


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
        for parser in (rank_parser(), _parser()):
            prefix = [] if parser.prog.endswith("worker") else ["run"]
            parsed = vars(parser.parse_args([*prefix, "out", *argv]))
            assert from_args(cls, parsed) == options, argv
        record = json.loads(json.dumps(to_record(options)))  # what a forked rank receives
        assert from_record(cls, record) == options, record


def test_options_run_keeps_for_itself_are_not_forwarded():
    assert to_argv(RunFlags(nproc=2, stats=True)) == []
    assert to_record(RunFlags(nproc=2, stats=True)) == {}
    assert not {"nproc", "stats"} & set(vars(rank_parser().parse_args(["out"])))


def test_not_given_is_none_until_settled():
    """Refusals tell a default given from one not given; a rank settles as `run` does."""
    assert RunFlags().atol is None and RunFlags().device is None
    # --atol/--rtol stay None: not given, --check judges by the noise floor (docs/USAGE.md)
    assert settled(RunFlags()) == RunFlags(device="auto", timeout=60.0, dp=1, max_restarts=0)
    assert settled(RunFlags(timeout=5.0)).timeout == 5.0
    flags = settled(from_args(RunFlags, vars(rank_parser().parse_args(["out"]))))
    assert (flags.atol, flags.rtol, flags.timeout, flags.device) == (None, None, 60.0, "auto")


def test_a_compile_option_parses_to_its_field():
    actions = _command_actions("compile")
    assert actions["memory_budget"].type is size
    args = _parser().parse_args(["compile", "m.py", "--stages", "2", "--split-at", "a"])
    options = from_args(CompileOptions, vars(args))
    # --schedule and --microbatches not given: gpipe and 1, or searched under --devices
    assert (options.stages, options.split_at, options.schedule) == (2, ["a"], None)
    assert options.microbatches is None and options.devices is None


def test_compile_refuses_an_unknown_keyword():
    model = torch.nn.Linear(4, 4)
    with pytest.raises(PipecompileError, match=r"unknown option\(s\) stage_count; it takes "):
        pipecompile.compile(model, torch.randn(2, 4), stages=2, stage_count=2)
