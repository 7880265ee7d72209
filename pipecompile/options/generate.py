"""The options of `pipecompile generate`, declared once (as run's are, ``options/fields``): the
command's flags are made from these fields, ``CompiledPipeline.generate`` takes the same
options as keywords (each field's ``api`` name), and both hand them whole to
``GenerateJob.build``, which makes every refusal (so one refused at a door is refused at the
other, in the same words). The prompt sources and the printing are the command's own."""

from __future__ import annotations

from dataclasses import dataclass

from pipecompile.options.fields import option

__all__ = ["GenerateFlags"]


@dataclass
class GenerateFlags:
    """What `pipecompile generate` and ``CompiledPipeline.generate`` were asked; None: not
    given (``GenerateJob.build`` tells the defaults apart)."""

    prompt_ids: list[str] = option(
        "--prompt-ids",
        repeat=True,
        metavar="IDS",
        api=None,
        help="a prompt's token ids, comma-separated (repeatable)",
    )
    prompt: list[str] = option(
        "--prompt",
        repeat=True,
        metavar="TEXT",
        api=None,
        help="a prompt's text (needs --tokenizer, or the model file's encode_text; repeatable)",
    )
    prompts: str | None = option(
        "--prompts",
        metavar="FILE",
        api=None,
        help="one prompt a line: token ids, or text with a tokenizer",
    )
    tokenizer: str | None = option(
        "--tokenizer", metavar="DIR", api=None, help="a Hugging Face tokenizer directory"
    )
    max_new_tokens: int = option(
        "--max-new-tokens",
        default=20,
        check=int,
        metavar="T",
        help="new tokens per sequence at most (default 20)",
    )
    temperature: float | None = option(
        "--temperature",
        check=float,
        metavar="T",
        help="sample at this temperature (default: greedy)",
    )
    top_k: int | None = option(
        "--top-k", check=int, metavar="K", help="sample among the K likeliest tokens"
    )
    top_p: float | None = option(
        "--top-p", check=float, metavar="P", help="sample among the likeliest tokens of mass P"
    )
    seed: int = option(
        "--seed", default=0, check=int, metavar="S", help="the sampling seed (default 0)"
    )
    eos: int | None = option(
        "--eos",
        check=int,
        metavar="ID",
        api="eos_token_id",
        help="a sequence ends at this token (default: the model's own, as Hugging Face's "
        "generate takes it from its generation config)",
    )
    nproc: int | None = option(
        "--nproc", check=int, metavar="N", help="one rank per stage, N the stages"
    )
    train_state: str | None = option(
        "--train-state",
        metavar="DIR",
        path=True,
        help="the weights of a `run --save DIR` (its newest step) instead",
    )
    device: str | None = option(
        "--device",
        choices=("auto", "cpu", "cuda"),
        help="where the stages run: cuda = on the GPUs, a rank's stage on a GPU of its own "
        "where there are enough (NCCL between them), else ranks share them (hidden states "
        "pass through host memory); auto (the default): cuda if every rank (or this "
        "process) gets a GPU of its own, else cpu",
    )
    timeout: float | None = option(
        "--timeout",
        check=float,
        metavar="S",
        help="--nproc: stop when no tokens come back for S seconds (default 600)",
    )
    threads: int | None = option(
        "--threads",
        check=int,
        metavar="N",
        help="intra-op threads (each rank's with --nproc; default: in one process the cores "
        "other programs leave idle, as run chooses them; with --nproc each rank's share)",
    )
    allow_stale: bool = option(
        "--allow-stale",
        switch=True,
        help="generate even though the model file changed since compiling",
    )
    quiet: bool = option("-q", "--quiet", switch=True, api=None, help="print only the tokens")
