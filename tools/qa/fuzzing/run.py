"""One random model through compile, the emitted stages and the checks, classified as
matched, refused, internal, mismatch or invalid."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from fuzzing.generate import Case, Config, generate
from fuzzing.limits import Timeout, causes, failure_words, time_limit

if TYPE_CHECKING:
    from fuzzing.peer import PeerOutcome

REPO = Path(__file__).resolve().parents[3]
CASE_TIMEOUT_S = 120
DIST_TIMEOUT_S = 300
# Causes of internal errors being fixed elsewhere, {name: a phrase of the error chain}, so a long
# run reports them apart from new ones. Both earlier entries (in-place writes to a stage input;
# weights forward never reads, left out of the stages) are fixed.
KNOWN: dict[str, str] = {}


@dataclass
class Outcome:
    """What happened to one seed."""

    seed: int
    verdict: str  # matched, refused, internal, mismatch, invalid
    phase: str = ""  # eager, compile, run, check, distributed
    key: str = ""  # the reason: error class and first words, or the known cause
    detail: str = ""  # the message, report or traceback
    config: str = ""
    features: tuple[str, ...] = ()
    seconds: float = 0.0
    distributed: str = ""  # "", or the verdict of the --nproc run
    peer: PeerOutcome | None = None  # the same model through torch.distributed.pipelining
    source: str = field(default="", repr=False)


def run_case(
    seed: int, *, inplace: bool = True, distributed: bool = False, workdir: Path | None = None
) -> Outcome:
    """Generate seed ``seed``'s model, push it through pipecompile, classify what happened."""
    start = time.perf_counter()
    try:
        case = generate(seed, inplace=inplace)
    except Exception as err:
        outcome = Outcome(seed, "invalid")
        classify(outcome, "invalid", "generate", err)
        return outcome
    outcome = Outcome(seed, "matched", config=str(case.config), features=case.features)
    outcome.source = case.source
    with tempfile.TemporaryDirectory(prefix="fuzz", dir=workdir) as tmp:
        try:
            with time_limit(CASE_TIMEOUT_S):
                _run(case, Path(tmp), outcome, distributed)
        except Timeout as err:
            classify(outcome, "internal", outcome.phase, err)
    outcome.seconds = time.perf_counter() - start
    return outcome


def _run(case: Case, tmp: Path, outcome: Outcome, distributed: bool) -> None:
    from pipecompile.codegen.emit import ModelRef, emit
    from pipecompile.compiler import compile_model
    from pipecompile.errors import InternalError, PipecompileError, RuntimeFailure
    from pipecompile.ir.graph.noise_floor import Tolerance
    from pipecompile.model.model_file import load_model_file
    from pipecompile.runtime.check.asynchronous import check_async_step
    from pipecompile.runtime.check.step import check_step
    from pipecompile.runtime.pipeline import Pipeline

    path = tmp / "model.py"
    path.write_text(case.source)
    outcome.phase = "eager"
    try:
        spec = load_model_file(str(path))
        eager_step(spec)
        spec = load_model_file(str(path))  # a fresh model: the eager step changed buffers
    except Exception as err:
        return classify(outcome, "invalid", "eager", err)
    outcome.phase = "compile"
    out = tmp / "out"
    try:
        compiled = compile_model(spec.model, spec.inputs, **case.config.options())  # type: ignore[arg-type]
        emit(compiled, out, model=ModelRef(path, "build_model", f"fuzz seed {case.seed}"))
    except InternalError as err:
        return classify(outcome, "internal", "compile", err)
    except PipecompileError as err:
        return classify(outcome, "refused", "compile", err)
    except Exception as err:
        return classify(outcome, "internal", "compile", err)
    outcome.phase = "run"
    try:
        pipe = Pipeline.load(out)
        buffers = _buffers_after(spec.model, pipe, spec.inputs)
        args = (pipe, spec.model, spec.inputs, spec.targets, spec.loss_fn)
        if pipe.asynchronous:
            report = check_async_step(*args, tolerance=Tolerance(1e-5, 1e-5))  # type: ignore[arg-type]
        else:
            report = check_step(*args, tolerance=Tolerance(1e-5, 1e-5))  # type: ignore[arg-type]
    except (InternalError, RuntimeFailure) as err:
        return classify(outcome, "internal", "run", err)
    except PipecompileError as err:  # accepted at compile, refused at run: still a bug
        return classify(outcome, "internal", "run", err)
    except Exception as err:
        return classify(outcome, "internal", "run", err)
    failures = list(report.failures)
    if not pipe.asynchronous:  # pipedream's micro-batches see other weights: no reference
        failures += _compare_buffers(pipe.state_dict(), buffers)
    if failures:
        outcome.verdict, outcome.phase = "mismatch", "check"
        outcome.key = "check failed: " + failure_words(failures[0], 6)
        outcome.detail = "\n".join([str(report), *(f"  MISMATCH {f}" for f in failures)])
        return None
    if distributed:
        _run_distributed(out, case.config, outcome)
    return None


def _buffers_after(model: object, pipe: object, inputs: dict[str, object]) -> dict[str, object]:
    """The buffers (BatchNorm statistics, counters, running means) after one step: the eager
    model from the pipeline's weights, run on each micro-batch in turn, as the stages do."""
    import copy

    import torch

    from pipecompile.ir.graph.microbatch import split_microbatches
    from pipecompile.runtime.check.step import fit_weights

    twin = copy.deepcopy(model)
    twin.load_state_dict(fit_weights(pipe, twin))  # type: ignore[arg-type, attr-defined]
    with torch.no_grad():
        for batch in split_microbatches(inputs, pipe.program.microbatches):  # type: ignore[arg-type, attr-defined]
            twin(**batch)  # type: ignore[operator]
    return {n: b.detach().clone() for n, b in twin.named_buffers()}  # type: ignore[attr-defined]


def _compare_buffers(have: dict[str, object], want: dict[str, object]) -> list[str]:
    """A line per buffer of the pipeline that differs from the reference after the step."""
    import torch

    bad = []
    for name, ref in want.items():
        got = have.get(name)
        if got is None:
            continue  # not persistent: not in the state dict
        assert isinstance(got, torch.Tensor) and isinstance(ref, torch.Tensor)
        if got.shape != ref.shape or not torch.allclose(
            got.double(), ref.double(), atol=1e-5, rtol=1e-5
        ):
            bad.append(f"buffer {name} after the step: {got.tolist()} vs eager {ref.tolist()}")
    return bad


def eager_step(spec: object) -> None:
    """Forward, loss and backward of the eager model: the generated model must run."""
    import torch

    model, inputs = spec.model, spec.inputs  # type: ignore[attr-defined]
    loss = spec.loss_fn(model(**inputs), *spec.targets)  # type: ignore[attr-defined]
    if not torch.isfinite(loss):
        raise ValueError(f"the eager loss is {float(loss)}")
    loss.backward()


def _run_distributed(out: Path, config: Config, outcome: Outcome) -> None:
    argv = [sys.executable, "-m", "pipecompile", "run", str(out), "--check", "--lr", "0.001"]
    argv += ["--nproc", str(config.devices), "--timeout", "60"]
    outcome.phase = "distributed"
    try:
        result = subprocess.run(
            argv, capture_output=True, text=True, timeout=DIST_TIMEOUT_S, cwd=REPO
        )
    except subprocess.TimeoutExpired:
        outcome.distributed = outcome.verdict = "internal"
        outcome.key = f"distributed: no result within {DIST_TIMEOUT_S} s"
        return
    text = result.stdout + result.stderr
    if result.returncode == 0 and "check passed" in result.stdout:
        outcome.distributed = "matched"
        outcome.phase = "run"
        return
    mismatch = result.returncode == 1 and "check FAILED" in text
    outcome.distributed = outcome.verdict = "mismatch" if mismatch else "internal"
    lines = [line for line in text.splitlines() if line.strip()]
    reason = next((line for line in lines if line.startswith("pipecompile")), lines[-1:] or [""])
    outcome.key = f"distributed (exit {result.returncode}): " + failure_words(str(reason), 8)
    outcome.detail = text[-4000:]


def classify(outcome: Outcome, verdict: str, phase: str, err: BaseException) -> None:
    outcome.verdict, outcome.phase = verdict, phase
    text = f"{type(err).__name__}: {err}"
    chain = text + "".join(
        f"\n{type(e).__name__}: {e}" for e in causes(err)
    )  # the wrapped errors name the cause
    known = next((name for name, phrase in KNOWN.items() if phrase in chain), None)
    if known:
        outcome.key = f"known: {known}"
    elif verdict == "refused":
        outcome.key = f"{type(err).__name__}: {failure_words(str(err), 10)}"
    else:
        outcome.key = f"{type(err).__name__}: {failure_words(str(err), 8)}{_where(err)}"
    outcome.detail = chain + "\n" + "".join(traceback.format_exception(err))[-6000:]


def _where(err: BaseException) -> str:
    """`` (at FILE:FUNCTION)``: the innermost frame in pipecompile of the deepest cause."""
    deepest = ([err, *causes(err)])[-1]
    frames = traceback.extract_tb(deepest.__traceback__)
    ours = [f for f in frames if "/pipecompile/" in f.filename or "/passes/" in f.filename]
    if not ours:
        return ""
    frame = ours[-1]
    rel = os.path.relpath(frame.filename, REPO)
    return f" (at {rel}:{frame.name})"
