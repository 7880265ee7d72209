"""`pipecompile generate OUT`: continue prompts through a directory compiled with
``--generate``, printing each sequence's new tokens as they come.

Prompts are token ids (``--prompt-ids 464,318,257``, repeatable), text (``--prompt TEXT``,
repeatable) or a file of one prompt a line (``--prompts FILE``: ids, or text). Text needs a
tokenizer: ``--tokenizer DIR`` (a Hugging Face tokenizer directory), or the model file's own
``encode_text(text) -> ids`` and ``decode_tokens(ids) -> text`` functions. With one prompt its
tokens are printed one by one as they come; with several, each sequence's line is printed as
it ends, ``[k]`` its prompt's number. A line on stderr says how many tokens came how fast.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipecompile.generation.step_trace import GenerateError
from pipecompile.options.fields import add_options, from_args
from pipecompile.options.generate import GenerateFlags

__all__ = ["add_generate", "generate_command", "prepared", "generate_parser"]


def add_generate(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("generate", help="continue prompts through a --generate pipeline")
    _arguments(p)
    p.set_defaults(handler=generate_command)


def generate_parser(prog: str) -> argparse.ArgumentParser:
    """The generate command's arguments alone (a torchrun rank's command line)."""
    p = argparse.ArgumentParser(prog=prog, description="a generation rank started by torchrun")
    _arguments(p)
    return p


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("directory", help="a directory written by `pipecompile MODEL --generate`")
    add_options(p, GenerateFlags)


def _ids(text: str, where: str) -> list[int]:
    parts = [t for t in text.replace(",", " ").split() if t]
    try:
        return [int(t) for t in parts]
    except ValueError:
        raise GenerateError(
            f"{where}: {text.strip()[:60]!r} is not token ids (comma-separated whole "
            "numbers); for text use --prompt TEXT or --prompts FILE with --tokenizer DIR"
        ) from None


class _Text:
    """Encoding and decoding of text: a tokenizer's, or the model file's functions."""

    def __init__(self, directory: Path, tokenizer: str | None) -> None:
        self.encode: Callable[[str], list[int]] | None = None
        self.decode: Callable[[list[int]], str] | None = None
        if tokenizer is not None:
            from transformers import AutoTokenizer

            try:
                tok = AutoTokenizer.from_pretrained(tokenizer)
            except Exception as err:
                raise GenerateError(
                    f"--tokenizer {tokenizer} cannot be loaded ({type(err).__name__}: "
                    f"{str(err).splitlines()[0][:160]}): give a tokenizer directory"
                ) from None
            self.encode = lambda text: list(tok.encode(text))
            self.decode = lambda ids: tok.decode(ids)
            return
        module = _model_module(directory)
        encode = getattr(module, "encode_text", None)
        decode = getattr(module, "decode_tokens", None)
        self.encode = encode if callable(encode) else None
        self.decode = decode if callable(decode) else None

    def encoded(self, text: str, where: str) -> list[int]:
        if self.encode is None:
            raise GenerateError(
                f"{where} is text, and there is no tokenizer: pass --tokenizer DIR, or give "
                "token ids (--prompt-ids)"
            )
        return [int(t) for t in self.encode(text)]


def _model_module(directory: Path) -> Any:
    from pipecompile.ir.records.manifest import read_manifest
    from pipecompile.model.model_file import import_file

    manifest = read_manifest(directory)
    if manifest.model is None or not manifest.model.file:
        return None
    path = (directory / manifest.model.file).resolve()
    return import_file(path) if path.is_file() else None


def _prompts(args: argparse.Namespace, text: _Text) -> list[list[int]]:
    prompts = [_ids(s, f"--prompt-ids {s}") for s in args.prompt_ids]
    prompts += [text.encoded(s, f"--prompt {s[:30]!r}") for s in args.prompt]
    if args.prompts:
        path = Path(args.prompts)
        try:
            lines = path.read_text().splitlines()
        except (OSError, UnicodeDecodeError) as err:
            raise GenerateError(f"--prompts {path}: cannot read it ({err})") from None
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            where = f"{path}:{n}"
            numeric = all(t.isdigit() for t in line.replace(",", " ").split())
            prompts.append(_ids(line, where) if numeric else text.encoded(line, where))
    return prompts


def generate_command(args: argparse.Namespace) -> int:
    if args.nproc and getattr(args, "command_line", False):  # before any torch op here
        from pipecompile.runtime.distributed.local_ranks import fork_a_starter

        fork_a_starter()  # the ranks' starter, forked with torch imported (as `run --nproc`)
    from pipecompile.generation.runner import run_generation

    job, show = prepared(args)
    new = run_generation(job, on_token=show.token, on_start=show.begin)
    show.end(new)
    return 0


def prepared(
    args: argparse.Namespace, ranks: int | None = None, local_ranks: int | None = None
) -> tuple[Any, _Printer]:
    """The generation ``args`` ask for, every refusal made (``GenerateJob.build``: the door
    the API and a torchrun rank go through too), its prompts read (text through the
    tokenizer), and the printer of its tokens. ``ranks``: the ranks a launcher started
    (torchrun's world), which ``--nproc`` must name where given; ``local_ranks``: those on
    this machine (torchrun's ``LOCAL_WORLD_SIZE``), which ``--device auto`` counts GPUs for.

    Raises:
        GenerateError: naming the option, the prompt or the directory.
    """
    from pipecompile.generation.job import GenerateJob

    directory = Path(args.directory)
    flags = from_args(GenerateFlags, vars(args))
    if ranks is not None:
        if flags.nproc is not None and flags.nproc != ranks:
            raise GenerateError(
                f"--nproc {flags.nproc}, but the launcher started {ranks} rank(s): drop "
                "--nproc (torchrun's ranks are the generation's), or start as many"
            )
        flags = dataclasses.replace(flags, nproc=ranks)
    # checked before the model file's text hooks are imported
    job = GenerateJob.build(directory, [], flags, local_ranks)
    text = _Text(directory, args.tokenizer)
    prompts = _prompts(args, text)
    job = dataclasses.replace(job, prompts=prompts)
    show = _Printer(prompts, text.decode, args.max_new_tokens, job.eos, quiet=args.quiet)
    return job, show


class _Printer:
    """Streams one sequence's tokens, or prints each of several as it ends; the rate line."""

    def __init__(
        self,
        prompts: list[list[int]],
        decode: Callable[[list[int]], str] | None,
        max_new_tokens: int,
        eos: tuple[int, ...],
        *,
        quiet: bool,
    ) -> None:
        self.prompts, self.decode, self.quiet = prompts, decode, quiet
        self.max_new_tokens, self.eos = max_new_tokens, eos
        self.single = len(prompts) == 1
        self.start = time.perf_counter()
        self.first: float | None = None
        self.last: float | None = None
        self.count = 0
        self.new: dict[int, list[int]] = {}
        self.last_progress = self.start
        self.shown = ""  # a single sequence's text printed so far

    def begin(self) -> None:
        """The stages are built: the clocks start, and a text prompt is echoed."""
        self.start = self.last_progress = time.perf_counter()
        if self.single and self.decode is not None:
            self.shown = "" if self.quiet else self.decode(self.prompts[0])
            sys.stdout.write(self.shown)
            sys.stdout.flush()

    def _text(self, sequence: int, new: list[int]) -> str:
        """A sequence as printed: its prompt and new tokens as text (the prompt only without
        -q), or the new token ids."""
        if self.decode is None:
            return " ".join(map(str, new))
        return self.decode(new if self.quiet else self.prompts[sequence] + new)

    def token(self, sequence: int, token: int) -> None:
        now = time.perf_counter()
        self.first = self.first if self.first is not None else now - self.start
        self.last = now
        self.count += 1
        mine = self.new.setdefault(sequence, [])
        mine.append(token)
        if not self.single and (token in self.eos or len(mine) >= self.max_new_tokens):
            print(f"[{sequence}] {self._text(sequence, mine)}", flush=True)
        if self.single:  # the text so far, decoded whole: tokens that join stay joined
            text = self._text(sequence, mine)
            if self.decode is None:
                sys.stdout.write(f"{token} ")
            elif text.startswith(self.shown) and not text.endswith("\ufffd"):
                sys.stdout.write(text[len(self.shown) :])  # a character cut in two waits
                self.shown = text
            sys.stdout.flush()
        elif not self.quiet and now - self.last_progress > 2.0:
            self.last_progress = now
            rate = self.count / (now - self.start)
            print(f"pipecompile: {self.count} tokens, {rate:.1f} tokens/s", file=sys.stderr)

    def end(self, new: dict[int, list[int]]) -> None:
        if self.single:
            if self.decode is not None and self.new:  # what waited for its next token
                text = self._text(0, self.new[0])
                sys.stdout.write(text[len(self.shown) :] if text.startswith(self.shown) else "")
            print(flush=True)
        for k in sorted(new):
            if not self.single and not new[k]:  # --max-new-tokens 0: nothing came
                print(f"[{k}] ", flush=True)
        seconds = (self.last or time.perf_counter()) - self.start  # to the last token
        if not self.quiet:
            first = f", first token after {self.first * 1000:.0f} ms" if self.first else ""
            print(
                f"pipecompile: {self.count} new tokens for {len(self.prompts)} sequence(s) in "
                f"{seconds:.2f} s: {self.count / max(seconds, 1e-9):.1f} tokens/s{first}",
                file=sys.stderr,
            )
