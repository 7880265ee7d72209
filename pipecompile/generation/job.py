"""One generation as one value: ``GenerateJob.build`` reads the directory's decoding plan and
makes every refusal generation's options declare (stale model file, sampling, token counts,
ranks, ``--timeout``, faults) before anything is built or any rank starts. `pipecompile
generate` and ``CompiledPipeline.generate`` both build it this way, so an option refused at one
is refused at the other.

Example:
    >>> flags = GenerateFlags(max_new_tokens=8, nproc=2)
    >>> job = GenerateJob.build(Path("out"), [[464, 318]], flags)  # doctest: +SKIP
    >>> job.timeout                                                     # doctest: +SKIP
    600.0
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from pipecompile.generation.places import generation_device
from pipecompile.generation.sampler import Sampling
from pipecompile.generation.session import plan_of
from pipecompile.generation.step_trace import GenerateError
from pipecompile.ir.records.generation_plan import GenerationPlan
from pipecompile.ir.records.manifest import Manifest, read_manifest
from pipecompile.model.model_file import check_fresh
from pipecompile.options.generate import GenerateFlags
from pipecompile.runtime.process.faults import FAULT_ENV, Fault, read_faults

__all__ = ["GenerateJob", "sampling_of", "TIMEOUT_S"]

TIMEOUT_S = 600.0  # --nproc: seconds rank 0 waits for tokens, when --timeout is not given


@dataclass(frozen=True)
class GenerateJob:
    """A generation, checked: the directory and its plan, the prompts and how to continue
    them, and where (``nproc`` ranks, one per stage; None: this process)."""

    directory: Path
    manifest: Manifest
    plan: GenerationPlan
    prompts: list[list[int]]
    max_new_tokens: int
    sampling: Sampling = Sampling()
    eos: tuple[int, ...] = ()  # a sequence ends at any of these (--eos, else the model's own)
    nproc: int | None = None
    train_state: Path | None = None
    timeout: float = TIMEOUT_S  # --nproc: seconds rank 0 waits for the last stage's tokens
    faults: tuple[Fault, ...] = ()
    pad: int = 0  # what pads a sequence that ended early (the model's own, else the first EOS)
    threads: int | None = None  # --threads: intra-op threads (a rank's); None: as run chooses
    flags: GenerateFlags | None = None  # what it was built from: each rank builds it again
    device: str = "cpu"  # "cpu" or "cuda" (``generation.places``)

    @classmethod
    def build(
        cls,
        directory: Path,
        prompts: list[list[int]],
        flags: GenerateFlags | None = None,
        local_ranks: int | None = None,
    ) -> GenerateJob:
        """The generation of ``prompts`` through ``directory`` as ``flags`` ask
        (``options/generate``: the command's flags, or ``CompiledPipeline.generate``'s
        keywords), every refusal made. Greedy unless a temperature, top-k or top-p is given;
        ``eos``: the id a sequence ends at (None: the model's own, as Hugging Face's
        ``generate`` takes it from its generation config; none for a model without);
        ``timeout``: None not given (``TIMEOUT_S`` under ``nproc``); ``threads``: None in one
        process the cores other programs leave idle, measured between turns (as `run` does),
        with ``nproc`` each rank's share of the cores; ``local_ranks``: the job's ranks on this
        machine (None: ``nproc``, else this process alone), which ``--device auto`` gives a
        GPU each where there are enough.

        Raises:
            GenerateError: naming the option or the directory, and what to do.
        """
        flags = flags if flags is not None else GenerateFlags()
        sampling = sampling_of(flags.temperature, flags.top_k, flags.top_p, flags.seed)
        max_new_tokens, eos, nproc = flags.max_new_tokens, flags.eos, flags.nproc
        timeout, threads = flags.timeout, flags.threads
        train_state = Path(flags.train_state) if flags.train_state is not None else None
        directory = Path(directory)
        manifest = read_manifest(directory)
        plan = plan_of(directory, manifest)
        if not flags.allow_stale:
            check_fresh(
                directory,
                manifest,
                allowed="pass --allow-stale (allow_stale=True) to generate with",
            )
        if threads is not None and threads < 1:
            raise GenerateError(f"--threads {threads}: give 1 or more")
        if not max_new_tokens >= 0:
            raise GenerateError(f"--max-new-tokens {max_new_tokens}: give 0 or more new tokens")
        _check_ranks(directory, plan, nproc, timeout)
        faults = _faults(nproc)
        here = local_ranks if local_ranks is not None else (nproc or 1)
        device = generation_device(flags.device, here)
        own = model_stops(directory, manifest)
        stops = (eos,) if eos is not None else own.eos
        pad = own.pad if own.pad is not None else (stops[0] if stops else 0)
        return cls(
            directory,
            manifest,
            plan,
            prompts,
            max_new_tokens,
            sampling,
            stops,
            nproc,
            train_state,
            timeout if timeout is not None else TIMEOUT_S,
            faults,
            pad,
            threads,
            flags,
            device,
        )


@dataclass(frozen=True)
class Stops:
    """A model's own end of sequence and padding, as its configs give them."""

    eos: tuple[int, ...] = ()
    pad: int | None = None


def model_stops(directory: Path, manifest: Manifest) -> Stops:
    """The EOS ids and pad id of the Hugging Face model compiled into ``directory``, from the
    configs it recorded (``generation_config.json`` first, as ``generate`` reads them, then
    ``config.json``); ids outside the vocabulary, which no step can pick, are left out."""
    configs = (manifest.model.configs or {}) if manifest.model is not None else {}
    read: dict = {}
    for name in ("config.json", "generation_config.json"):  # the second wins
        try:
            raw = json.loads((directory / configs[name]).read_text()) if name in configs else {}
        except (OSError, ValueError):  # a damaged config: the directory's other checks say so
            raw = {}
        read.update({k: v for k, v in raw.items() if v is not None})
    vocab = read.get("vocab_size")
    eos = read.get("eos_token_id")
    ids = [eos] if isinstance(eos, int) else [e for e in eos or () if isinstance(e, int)]
    ids = [e for e in ids if vocab is None or 0 <= e < vocab]
    pad = read.get("pad_token_id")
    pad = pad if isinstance(pad, int) and (vocab is None or 0 <= pad < vocab) else None
    return Stops(tuple(ids), pad)


def _check_ranks(
    directory: Path, plan: GenerationPlan, nproc: int | None, timeout: float | None
) -> None:
    if nproc is not None and nproc != plan.stages:
        raise GenerateError(
            f"--nproc {nproc}: generation runs one rank per stage, and {directory} "
            f"has {plan.stages} stage(s): give --nproc {plan.stages}, or drop it to run them "
            "all in this process"
        )
    if timeout is None:
        return
    if not (timeout > 0 and math.isfinite(timeout)):
        raise GenerateError(f"--timeout {timeout:g}: give a positive number of seconds")
    if not nproc or nproc < 2:
        raise GenerateError(
            f"--timeout {timeout:g} bounds how long rank 0 waits for the other ranks' tokens, "
            "and a generation in one process waits on none; drop it, or add --nproc N"
        )


def _faults(nproc: int | None) -> tuple[Fault, ...]:
    """``PIPECOMPILE_FAULT`` for a generation: ``RANK:TURN:turn:KIND`` of a rank that takes
    turns (1 to N-1 of ``--nproc N``: rank 0 is this process, which leads them)."""
    faults = read_faults()
    ranks = nproc or 1
    for f in faults:
        if f.where != "turn":
            why = f"generation fails a rank at a turn (RANK:TURN:turn:KIND), not at {f.where}"
        elif ranks < 2:
            why = "this generation runs in one process; add --nproc N to start ranks"
        elif not 1 <= f.rank < ranks:
            why = f"turns are taken by ranks 1 to {ranks - 1} (rank 0 is this process, which leads)"
        else:
            continue
        raise GenerateError(f"{FAULT_ENV} {f} could never fire: {why}")
    return faults


def sampling_of(
    temperature: float | None, top_k: int | None, top_p: float | None, seed: int | None
) -> Sampling:
    """Greedy unless a temperature, top-k or top-p is given (top-k or top-p alone sample at
    temperature 1).

    Raises:
        GenerateError: a temperature below 0 or not a number, top-k below 1, top-p outside
            (0, 1].
    """
    if temperature is not None and not (temperature >= 0 and math.isfinite(temperature)):
        raise GenerateError(
            f"--temperature {temperature}: give 0 (greedy) or a finite number above 0"
        )
    if top_k is not None and top_k < 1:
        raise GenerateError(f"--top-k {top_k}: give 1 or more")
    if top_p is not None and not 0 < top_p <= 1:
        raise GenerateError(f"--top-p {top_p}: give a probability in (0, 1]")
    sampled = top_k is not None or top_p is not None
    t = temperature if temperature is not None else (1.0 if sampled else 0.0)
    return Sampling(t, top_k, top_p, seed or 0)
