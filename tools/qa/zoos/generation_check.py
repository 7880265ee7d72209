"""Greedy decoding of a compiled causal LM against Hugging Face's ``generate``, token for token:
the zoo's generation column (tools/qa/zoo.py), run as a child process.

    python tools/qa/zoos/generation_check.py MODEL_FILE OUT [--nproc N] [--device cuda]

``OUT`` was compiled from ``MODEL_FILE`` with ``--generate``. Five prompts of different lengths
(1 to 9 tokens, sharing lanes and rows) decode up to 8 new tokens each (the last token of
the vocabulary ends a sequence on both sides) through the directory's
decoding stages (in this process, or on ``--nproc`` ranks; on ``--device``); the model file's
model, built again (same seed, same weights), decodes them with ``generate(do_sample=False)``
on the same device. Prints one JSON line
``{"generation": "ok"}`` or ``{"generation": "wrong: ..."}`` (exit 0 or 1); a refusal or a
crash is pipecompile's own message and exit status."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import torch

NEW = 8
LENGTHS = (1, 9, 4, 6, 2)


def reference(model: torch.nn.Module, prompt: list[int], eos: int) -> list[int]:
    """Hugging Face's greedy tokens, up to and with ``eos`` where it comes."""
    ids = torch.tensor([prompt], device=next(model.parameters()).device)
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=NEW,
            do_sample=False,
            eos_token_id=eos,
            pad_token_id=0,
        )
    tokens = out[0, len(prompt) :].tolist()
    return tokens[: tokens.index(eos) + 1] if eos in tokens else tokens


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_file", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--nproc", type=int, default=None)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = parser.parse_args(argv)
    import pipecompile
    from pipecompile.errors import PipecompileError

    spec = importlib.util.spec_from_file_location("zoo_model", args.model_file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = module.build_model().eval().to(args.device)
    pipe = pipecompile.load(args.out)
    vocab = int(pipe.manifest.generate["vocab"])
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(1, vocab, (n,), generator=g).tolist() for n in LENGTHS]
    eos = vocab - 1  # the same stop on both sides (a random model's own may be outside)
    try:
        got = pipe.generate(
            prompts, max_new_tokens=NEW, eos_token_id=eos, nproc=args.nproc, device=args.device
        )
    except PipecompileError as err:
        print(f"pipecompile: error: {err}")
        return 2
    for k, (prompt, row) in enumerate(zip(prompts, got)):
        want = reference(model, prompt, eos)
        mine = row.tolist()[len(prompt) :]
        if mine != want:
            said = f"prompt {k} ({len(prompt)} tokens): {mine} != {want}"
            print(f"pipecompile: generation differs from Hugging Face's generate: {said}")
            return 1
    print(f"generation equal to Hugging Face's generate on {len(prompts)} prompts")
    return 0


if __name__ == "__main__":
    sys.exit(main())
