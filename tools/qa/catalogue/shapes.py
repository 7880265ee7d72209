"""Batches of any shape: --dynamic and dynamic_shapes() that cannot hold, --batch-shapes
misused, batches too small for the micro-batches or above a stated maximum."""

from __future__ import annotations

from catalogue.case import CHECK, COMPILE, RUN, Case, compiled, mlp_variant, nothing


def hook(source: str) -> tuple[str, str]:
    """An mlp_variant edit adding ``source`` (hooks) before loss_fn."""
    return ("def loss_fn(", f"{source}\n\n\ndef loss_fn(")


def rows(count: int) -> str:
    """A train_batches() of one batch of ``count`` rows."""
    return (
        "def train_batches():\n    return [((torch.randn("
        f"{count}, IN_FEATURES),), (torch.randn({count}, OUT_FEATURES),))]"
    )


MODEL = ("model.py", "--stages", "2", "-q")
FIXED_VIEW = ("x = self.act1(self.fc1(x))", "x = self.act1(self.fc1(x)).view(8, -1)")
MAXIMUM = 'def dynamic_shapes():\n    return {"x": {0: ("batch", 8)}}'

SHAPES: list[Case] = [
    Case("dynamic-unknown", "compile --dynamic batch,length", nothing,
         (*COMPILE, "--dynamic", "batch,length", "-o", "o"),
         r"--dynamic length: no such dimension to vary; give batch .* and/or seq"),
    Case("dynamic-fixed-by-model", "compile --dynamic batch of a model whose view fixes the batch",
         mlp_variant(FIXED_VIEW), (*MODEL, "--dynamic", "batch", "-o", "o"),
         r"the model cannot take another batch \(batch=16\): .*fails"),
    Case("dynamic-hook-not-a-dict", "dynamic_shapes() returns a list",
         mlp_variant(hook("def dynamic_shapes():\n    return [0]")), (*MODEL, "-o", "o"),
         r"dynamic_shapes\(\) returned list \[0\]; return \{input name: \{dimension:"),
    Case("dynamic-hook-other-input", "dynamic_shapes() names an input the model lacks",
         mlp_variant(hook('def dynamic_shapes():\n    return {"y": {0: "batch"}}')),
         (*MODEL, "-o", "o"), r"dynamic_shapes\(\) names input 'y', which the model does not"),
    Case("batch-shapes-without-check", "run --batch-shapes 4 without --check", nothing,
         (*RUN, "--batch-shapes", "4"), r"--batch-shapes lists the shapes --check checks"),
    Case("batch-shapes-fixed-compile",
         "run --check --batch-shapes 4 of a --dynamic none compile",
         compiled(mlp_variant(), flags=("--dynamic", "none")), (*CHECK, "--batch-shapes", "4"),
         r"--batch-shapes 4: the compile has no dimension that varies .*recompile without "
         r"--dynamic none"),
    Case("batch-shapes-above-maximum", "run --check --batch-shapes 10 when dynamic_shapes() "
         "states at most 8", compiled(mlp_variant(hook(MAXIMUM))),
         (*CHECK, "--batch-shapes", "10"),
         r"--batch-shapes 10: its batch \(input 'x' dim 0\) is 10, above the maximum of 8"),
    Case("dynamic-flag-conflicts-hook", "compile --dynamic seq of a model whose "
         "dynamic_shapes() names dim 1 'width'",
         mlp_variant(hook('def dynamic_shapes():\n    return {"x": {1: "width"}}')),
         (*MODEL, "--dynamic", "seq", "-o", "o"),
         r"--dynamic seq makes dim 1 of input 'x' 'seq', and the model file's dynamic_shapes\(\) "
         r"makes it 'width'"),
    Case("dynamic-none-drops-hook", "compile --dynamic none of a model with dynamic_shapes()",
         mlp_variant(hook(MAXIMUM)), (*MODEL, "--dynamic", "none", "-o", "o"),
         r"--dynamic none keeps every size as traced, but the model file's dynamic_shapes\(\) "
         r"lets 'x' dim 0 \(batch\) vary"),
    Case("batch-fixed-by-model", "compile, no flag, a model whose view fixes the batch "
         "(compiles, with a note)", mlp_variant(FIXED_VIEW), (*MODEL, "-o", "o"),
         r"note: the batch size is fixed at 8 rows \(1 micro-batch of 8\): the view at model\.py"
         r":\d+.* asks for \[8, -1\], 8 rows written as a constant.*write the size from the "
         r"tensor", status=0),
    Case("batch-shapes-arity", "run --check --batch-shapes 4x3 of a --dynamic batch compile",
         compiled(mlp_variant(), flags=("--dynamic", "batch")), (*CHECK, "--batch-shapes", "4x3"),
         r"--batch-shapes: '4x3' is not 1 positive size \(batch\), e\.g\. 8"),
    Case("batch-too-small", "train_batches() gives a batch of 1 row for 2 micro-batches",
         mlp_variant(hook(rows(1))), (*RUN, "--model", "model.py"),
         r"batch 0 \(step 1\): input 'x' has shape \(1, 32\): 1 row along dim 0 cannot fill 2 "
         r"micro-batches"),
    Case("batch-above-maximum", "a batch of 10 rows; dynamic_shapes() states at most 8",
         compiled(mlp_variant(hook(MAXIMUM + "\n\n\n" + rows(10)))),
         (*RUN, "--model", "model.py"),
         r"its batch \(dim 0\) is 10, above the maximum of 8 that the model file's "
         r"dynamic_shapes\(\) states"),
]  # fmt: skip
