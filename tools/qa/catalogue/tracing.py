"""Models neither tracer can take: data-dependent control flow in forward, a helper that
torch.fx.wrap keeps opaque and that cannot be traced through, and a view that hard-codes the
example batch, traced on a micro-batch. Each error names the file's line, the module and what
to do (a library's line, and the user's that called it, where the value is read in a library).
And a Hugging Face model built as people build it, whose KV cache no tracer returns:
traced without it, said in a note."""

from __future__ import annotations

from catalogue.case import Case, mlp_variant, nothing, steps, write

MODEL = ("model.py", "--stages", "2", "-q", "-o", "o")
FIRST_LAYER = "        x = self.act1(self.fc1(x))\n"
BRANCH = (FIRST_LAYER, FIRST_LAYER + "        if x.sum() > 0:\n            x = -x\n")
HELPER = (
    "def build_model(",
    'def flip(x):\n    return -x if x.sum() > 0 else x\n\n\ntorch.fx.wrap("flip")\n\n\n'
    "def build_model(",
)
CALL = (FIRST_LAYER, FIRST_LAYER + "        x = flip(x)\n")
FIXED_VIEW = ("x = self.act1(self.fc1(x))", "x = self.act1(self.fc1(x)).view(8, -1)")
LIBRARY = """import torch


def gate(x):
    if x.sum() > 0:  # a value decides, in the library's code
        return x * 2
    return x
"""
USES_LIBRARY = """import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parent / "lib" / "site-packages"))

import torch  # noqa: E402
from torch import nn  # noqa: E402

import blocks  # noqa: E402


class M(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 8)

    def forward(self, x):
        return blocks.gate(self.a(x))


def build_model():
    return M()


def example_inputs():
    return (torch.randn(4, 8),)
"""
HF_CACHE = """import torch
from transformers import GPT2Config, GPT2LMHeadModel


def build_model():  # use_cache left at its default: the forward returns a DynamicCache
    return GPT2LMHeadModel(GPT2Config(vocab_size=32, n_positions=16, n_embd=16, n_layer=2,
                                      n_head=2, bos_token_id=0, eos_token_id=0))


def example_inputs():
    return (torch.randint(0, 32, (4, 8)),)
"""

TRACING: list[Case] = [
    Case("trace-data-dependent", "forward branches on a tensor's value (if x.sum() > 0)",
         mlp_variant(BRANCH), MODEL,
         r"cannot trace MLP:.*model\.py:\d+, in the model's forward: `if x\.sum\(\) > 0:`"
         r".*torch\.where or torch\.cond", max_lines=4),
    Case("trace-wrapped-helper", "forward calls a torch.fx.wrap'd helper that branches on a value",
         mlp_variant(HELPER, CALL), MODEL,
         r"the model's forward calls flip \(model\.py:\d+\), which torch\.fx\.wrap keeps "
         r"opaque .*traced through, they fail.*model\.py:\d+.*`return -x if x\.sum\(\) > 0 "
         r"else x`", max_lines=4),
    Case("trace-view-fixes-batch", "a view hard-codes the example's 8 rows; --microbatches 2",
         mlp_variant(FIXED_VIEW), (*MODEL, "--microbatches", "2"),
         r"cannot trace MLP: the view at .*model\.py:\d+, in the model's forward: "
         r"`x = self\.act1\(self\.fc1\(x\)\)\.view\(8, -1\)` asks for \[8, -1\], the example "
         r"batch's 8 rows .* one micro-batch of 4 rows .*x\.shape\[0\].*--microbatches 1"),
    Case("trace-data-dependent-library", "forward calls a library function (in site-packages) "
         "that branches on a tensor's value",
         steps(write("lib/site-packages/blocks.py", LIBRARY), write("user.py", USES_LIBRARY)),
         ("user.py", "--stages", "2", "-q", "-o", "o"),
         r"cannot trace M:.*site-packages/blocks\.py:5: `if x\.sum\(\) > 0:.*`, called from "
         r".*user\.py:\d+, in the model's forward: `return blocks\.gate\(self\.a\(x\)\)`",
         max_lines=4, base=None),
    Case("trace-hf-use-cache", "GPT2LMHeadModel(config) with use_cache at its default (works)",
         write("hf.py", HF_CACHE), ("hf.py", "--stages", "2", "-q", "-o", "o"),
         r"note: GPT2LMHeadModel returns its KV cache \(config\.use_cache is True\): traced "
         r"without it", status=0, base=None),
    Case("calibration-unknown-flag", "pipecompile calibration --bogus", nothing,
         ("calibration", "--bogus"),
         r"pipecompile calibration: error: unrecognized arguments: --bogus \(see `pipecompile "
         r"calibration --help`\)", base=None),
]  # fmt: skip
