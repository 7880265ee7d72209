"""The first catalogue: stage files, weights, inputs, losses, outputs, output directories,
options, stale compiles, training runs and --weights (89 cases)."""

from __future__ import annotations

from pathlib import Path

from catalogue.case import (
    CHECK,
    COMPILE,
    FORWARD_RETURN,
    INPUTS,
    LOSS,
    RUN,
    TARGETS,
    Case,
    compiled,
    copy,
    delete,
    edit,
    mkdir,
    mlp_variant,
    nothing,
    ran,
    steps,
    truncate,
    write,
)

NO_PARAMS = '''"""A model without parameters."""
import torch


class Act(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x) * 2 + 1


def build_model():
    return Act()


def example_inputs():
    return (torch.randn(8, 32),)


def example_targets():
    return (torch.randn(8, 32),)


def loss_fn(output, target):
    return torch.nn.functional.mse_loss(output, target)
'''

STAGE_CASES = [
    Case("stage-syntax-error", "edited out/stage_1.py, leaving a syntax error",
         edit("out/stage_1.py", "def forward(self, act2):", "def forward(self, act2:"),
         RUN, r"out/stage_1\.py.*line \d+.*SyntaxError.*recompile", quick=True),
    Case("stage-layer-size", "edited a layer's size in out/stage_1.py",
         edit("out/stage_1.py", "in_features=64, out_features=10",
              "in_features=64, out_features=12"),
         RUN, r"stage_1\.safetensors.*fc5\.weight.*\(10, 64\).*\(12, 64\).*recompile"),
    Case("stage-class-renamed", "renamed the class in out/stage_1.py",
         edit("out/stage_1.py", "class Stage1(", "class MyStage("),
         RUN, r"out/stage_1\.py.*no class 'Stage1'.*recompile"),
    Case("stage-bad-import", "added an import of a missing module to out/stage_1.py",
         edit("out/stage_1.py", "import torch\n", "import torch\nimport torchvisionx\n"),
         RUN, r"out/stage_1\.py.*line 8.*torchvisionx.*recompile"),
    Case("stage-file-deleted", "deleted out/stage_1.py",
         delete("out/stage_1.py"), RUN, r"out/stage_1\.py.*missing.*recompile"),
    Case("stage-forward-error", "edited forward() in out/stage_1.py to use a missing layer",
         edit("out/stage_1.py", "self.fc5(act4)", "self.fc6(act4)"),
         RUN, r"stage 1 forward at out/stage_1\.py:\d+: AttributeError.*fc6"),
]  # fmt: skip

WEIGHT_CASES = [
    Case("weights-truncated", "truncated out/stage_1.safetensors (a copy cut short)",
         truncate("out/stage_1.safetensors", 0.5),
         RUN, r"stage 1: weights out/stage_1\.safetensors.*(damaged|truncated).*recompile",
         quick=True),
    Case("weights-empty", "emptied out/stage_1.safetensors (0 bytes)",
         truncate("out/stage_1.safetensors", 0.0),
         RUN, r"stage 1: weights out/stage_1\.safetensors.*empty.*recompile"),
    Case("weights-deleted", "deleted out/stage_1.safetensors",
         delete("out/stage_1.safetensors"),
         RUN, r"stage 1: weights out/stage_1\.safetensors.*missing.*recompile"),
    Case("weights-swapped", "copied out/stage_0.safetensors over out/stage_1.safetensors",
         copy("out/stage_0.safetensors", "out/stage_1.safetensors"),
         RUN, r"stage 1: weights out/stage_1\.safetensors.*fc3\.weight.*recompile"),
]  # fmt: skip

INPUT_CASES = [
    Case("input-shape", "ran with --model whose example_inputs() has another feature size",
         mlp_variant(("IN_FEATURES = 32", "IN_FEATURES = 16")),
         (*RUN, "--model", "model.py"),
         r"input 'x' has shape \(8, 16\).*compiled for \(8, 32\)", quick=True),
    Case("input-no-batch-dim", "ran with --model whose example_inputs() lacks the batch dim",
         mlp_variant((INPUTS, "return (torch.randn(IN_FEATURES, generator=g),)")),
         (*RUN, "--model", "model.py"),
         r"input 'x' has shape \(32,\).*compiled for \(8, 32\)"),
    Case("input-no-batch-dim-check", "the input without its batch dim, under run --check",
         mlp_variant((INPUTS, "return (torch.randn(IN_FEATURES, generator=g),)")),
         (*CHECK, "--model", "model.py"),
         r"input 'x' has shape \(32,\).*compiled for \(8, 32\).*lacks the batch dimension"),
    Case("input-missing", "ran --check with --model whose forward() names its input differently",
         mlp_variant(("def forward(self, x: torch.Tensor)", "def forward(self, y: torch.Tensor)"),
                     ("x = self.act1(self.fc1(x))", "x = self.act1(self.fc1(y))")),
         (*CHECK, "--model", "model.py"), r"inputs lack 'x' \(given: 'y'\).*compiled for"),
    Case("input-key-unknown", "ran with --model whose example_inputs() names another input",
         mlp_variant((INPUTS, 'return {"y": torch.randn(BATCH_SIZE, IN_FEATURES, generator=g)}')),
         (*RUN, "--model", "model.py"), r"example_inputs\(\) has keys \['y'\] that"),
    Case("check-other-model", "ran --check with --model of another model (other layer sizes)",
         mlp_variant(("IN_FEATURES = 32", "IN_FEATURES = 16")),
         (*CHECK, "--model", "model.py"),
         r"eager model does not fit.*fc1\.weight is \(64, 16\) in MLP but \(64, 32\) in out"),
    Case("input-dtype", "ran with --model whose example_inputs() are float64",
         mlp_variant((INPUTS, "return (torch.randn(BATCH_SIZE, IN_FEATURES, generator=g, "
                              "dtype=torch.float64),)")),
         (*RUN, "--model", "model.py"), r"input 'x'.*float64.*compiled for.*float32"),
    Case("input-dtype-check", "example_inputs() are float64, under run --check",
         mlp_variant((INPUTS, "return (torch.randn(BATCH_SIZE, IN_FEATURES, generator=g, "
                              "dtype=torch.float64),)")),
         (*CHECK, "--model", "model.py"), r"input 'x'.*float64.*compiled for.*float32"),
]  # fmt: skip

TRAINING_CASES = [
    Case("targets-batch", "example_targets() has another batch size than the inputs",
         mlp_variant((TARGETS, "return (torch.randn(6, OUT_FEATURES, generator=g),)")),
         (*RUN, "--model", "model.py"), r"target 0 has shape \(6, 10\).*batch.*8"),
    Case("targets-batch-check", "example_targets() has another batch size, under run --check",
         mlp_variant((TARGETS, "return (torch.randn(6, OUT_FEATURES, generator=g),)")),
         (*CHECK, "--model", "model.py"), r"target 0 has shape \(6, 10\).*batch.*8"),
    Case("loss-not-scalar", "loss_fn returns a tensor per sample (reduction='none')",
         mlp_variant((LOSS, 'return F.mse_loss(output, target, reduction="none")')),
         (*RUN, "--model", "model.py"), r"loss_fn.*model\.py.*shape \(4, 10\).*scalar"),
    Case("loss-not-scalar-check", "loss_fn returns a tensor per sample, under run --check",
         mlp_variant((LOSS, 'return F.mse_loss(output, target, reduction="none")')),
         (*CHECK, "--model", "model.py"), r"loss_fn.*model\.py.*shape \(\d, 10\).*scalar"),
    Case("loss-fn-arity", "loss_fn takes one argument but there is one target",
         mlp_variant(("def loss_fn(output: torch.Tensor, target: torch.Tensor)",
                      "def loss_fn(output: torch.Tensor)"),
                     (LOSS, "return output.pow(2).mean()")),
         (*RUN, "--model", "model.py"),
         r"loss_fn \(model\.py:\d+\) takes 1 argument.*with 2.*output.*target"),
    Case("loss-fn-arity-check", "loss_fn takes one argument, under run --check",
         mlp_variant(("def loss_fn(output: torch.Tensor, target: torch.Tensor)",
                      "def loss_fn(output: torch.Tensor)"),
                     (LOSS, "return output.pow(2).mean()")),
         (*CHECK, "--model", "model.py"),
         r"loss_fn \(model\.py:\d+\) takes 1 argument.*with 2.*output.*target"),
    Case("loss-fn-raises", "loss_fn fails inside (a shape mismatch in the user's code)",
         mlp_variant((LOSS, "return (output @ target).mean()")),
         (*RUN, "--model", "model.py"), r"loss_fn.*model\.py:\d+.*RuntimeError"),
    Case("no-params-check", "run --check on a model without parameters",
         compiled(write("model.py", NO_PARAMS)), CHECK,
         r"no trainable parameters.*check passed", status=0, base=None),
]  # fmt: skip

OUTPUT_CASES = [
    Case("output-batch-not-first", "forward() returns its output transposed (batch last)",
         compiled(mlp_variant((FORWARD_RETURN, "return self.fc5(x).t()"),
                              (LOSS, 'return F.mse_loss(output.t(), target, reduction="mean")'))),
         CHECK, r"output 0 \(\w+\) has the batch in dimension 1.*\(10, 4\).*\(10, 8\)",
         base=None),
    Case("output-scalar", "forward() returns an extra scalar output (2 micro-batches); --check",
         compiled(mlp_variant((FORWARD_RETURN, "y = self.fc5(x)\n        return y, y.mean()"),
                              (LOSS, 'return F.mse_loss(output[0], target, reduction="mean")'))),
         CHECK, r"check passed", status=0, base=None),
]  # fmt: skip

NPROC_CASES = [
    Case("nproc-stage-syntax-error", "edited out/stage_1.py, leaving a syntax error; --nproc 2",
         edit("out/stage_1.py", "def forward(self, act2):", "def forward(self, act2:"),
         (*RUN, "--nproc", "2"), r"rank 1: error:.*out/stage_1\.py.*line \d+.*recompile",
         max_lines=4),
    Case("nproc-weights-truncated", "truncated out/stage_1.safetensors; --nproc 2",
         truncate("out/stage_1.safetensors", 0.5),
         (*RUN, "--nproc", "2"), r"rank 1: error:.*out/stage_1\.safetensors.*recompile",
         max_lines=4),
    Case("nproc-input-batch", "ran --nproc 2 with inputs of another batch size than a "
         "--dynamic none compile", steps(
             ran("mlp.py", "--stages", "2", "--microbatches", "2", "--dynamic", "none", "-q",
                 "-o", "out", "--force"),
             mlp_variant(("BATCH_SIZE = 8", "BATCH_SIZE = 16"))),
         (*RUN, "--nproc", "2", "--model", "model.py"),
         r"input 'x' has shape \(16, 32\).*compiled for \(8, 32\).*batch size differs "
         r"\(16, not 8\), and it was compiled with --dynamic none", max_lines=4),
    Case("nproc-other-batch-default", "ran --nproc 2 with inputs of another batch size than "
         "compiled (no flag: the batch varies)", mlp_variant(("BATCH_SIZE = 8", "BATCH_SIZE = 16")),
         ("run", "out", "--nproc", "2", "--model", "model.py", "--steps", "1"),
         r"step 1/1  loss \d",
         status=0, own_process=True),  # rank 0's lines reach file descriptor 1, not sys.stdout
    Case("nproc-weights-swapped", "copied stage_0's weights over stage_1's; --nproc 2 --check",
         copy("out/stage_0.safetensors", "out/stage_1.safetensors"),
         (*CHECK, "--nproc", "2"), r"rank 1: error:.*out/stage_1\.safetensors.*recompile",
         max_lines=4),
]  # fmt: skip


RESIDUAL = '''"""A residual MLP: stage 1 takes a value named `add`."""
import torch


class Residual(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(16, 16), torch.nn.Linear(16, 16)
        self.c = torch.nn.Linear(16, 4)

    def forward(self, x):
        h = x + torch.relu(self.a(x))
        h = h + torch.relu(self.b(h))
        return self.c(h)


def build_model():
    return Residual()


def example_inputs():
    return (torch.randn(8, 16),)
'''

OUTPUT_DIR_CASES = [
    Case("out-foreign-manifest", "-o webapp/, a folder with its own manifest.json and index.html",
         steps(write("webapp/manifest.json", '{"name": "app"}\n'),
               write("webapp/index.html", "hi")),
         (*COMPILE, "-o", "webapp"), r"webapp.*is not a pipecompile output.*index\.html.*--force",
         quick=True, intact=("webapp/manifest.json", "webapp/index.html")),
    Case("out-user-files", "recompiled into out/ after adding NOTES.md and results/ to it",
         steps(write("out/NOTES.md", "notes"), mkdir("out/results"),
               write("out/results/run1.txt", "0.5")),
         (*COMPILE, "-o", "out", "--stages", "3"), r"NOTES\.md, results/.*--force",
         intact=("out/NOTES.md", "out/results/run1.txt", "out/stage_1.py")),
    Case("out-train-state-inside", "run out --save out/train-state (a recompile would delete it)",
         nothing, ("run", "out", "--save", "out/train-state"), r"inside out.*recompile replaces"),
    Case("out-is-a-file", "-o naming an existing file", write("notes.txt", "mine"),
         (*COMPILE, "-o", "notes.txt"), r"notes\.txt.*is a file", intact=("notes.txt",)),
    Case("out-under-a-file", "-o under an existing file", write("notes.txt", "mine"),
         (*COMPILE, "-o", "notes.txt/out"), r"cannot create output directory.*notes\.txt",
         intact=("notes.txt",)),
    Case("out-name-too-long", "-o with a 300-character name", nothing,
         (*COMPILE, "-o", "x" * 300), r"too long; choose a shorter -o"),
    Case("export-overwrite", "export -o onto an existing file", write("mine.safetensors", "x"),
         ("export", "out", "-o", "mine.safetensors"),
         r"the file exists and pipecompile export did not write it; it is never replaced",
         intact=("mine.safetensors",)),
    Case("export-onto-dir", "export -o naming the compiled directory (a sharded export)",
         nothing, ("export", "out", "-o", "out"),
         r"export -o out: the directory holds .*which an export did not write; pass --force",
         intact=("out/stage_0.safetensors",)),
    Case("viz-onto-file", "viz -o naming a file", write("mine.svg", "mine"),
         ("viz", "out", "-o", "mine.svg"), r"is a file; name a directory", intact=("mine.svg",)),
]  # fmt: skip


def _other_weights(d: Path) -> None:
    import torch
    from safetensors.torch import save_file

    save_file({"fc1.weight": torch.zeros(3, 3)}, str(d / "other.safetensors"))


WEIGHTS_CASES = [
    Case(
        "weights-missing",
        "--weights naming a path that does not exist",
        nothing,
        (*COMPILE, "-o", "w", "--weights", "nowhere"),
        r"--weights nowhere does not exist",
    ),
    Case(
        "weights-damaged",
        "--weights naming a file that is not safetensors",
        write("broken.safetensors", "not a safetensors file"),
        (*COMPILE, "-o", "w", "--weights", "broken.safetensors"),
        r"broken\.safetensors is not a readable safetensors file.*truncated",
        intact=("broken.safetensors",),
    ),
    Case(
        "weights-other-model",
        "--weights of another model (a tensor of another shape)",
        _other_weights,
        (*COMPILE, "-o", "w", "--weights", "other.safetensors"),
        r"fc1\.weight is \[3, 3\] in other\.safetensors but \[\d+, 32\] in the model",
    ),
    Case(
        "weights-empty-dir",
        "--weights naming a directory without pretrained weights",
        write("empty/NOTES.md", "x"),
        (*COMPILE, "-o", "w", "--weights", "empty"),
        r"--weights empty holds neither model\.safetensors\.index\.json nor",
    ),
]

OPTION_CASES = [
    Case("steps-zero", "run --steps 0", nothing, (*RUN, "--steps", "0"),
         r"--steps: '0' is not a whole number of at least 1", quick=True),
    Case("steps-negative", "run --steps -5", nothing, (*RUN, "--steps", "-5"), r"--steps: '-5'"),
    Case("nproc-zero", "run --nproc 0", nothing, (*RUN, "--nproc", "0"), r"--nproc: '0'"),
    Case("stages-zero", "--stages 0", nothing, (*COMPILE, "-o", "o", "--stages", "0"),
         r"--stages: '0'"),
    Case("microbatches-zero", "--microbatches 0", nothing,
         (*COMPILE, "-o", "o", "--microbatches", "0"), r"--microbatches: '0'"),
    Case("virtual-stages-zero", "--schedule interleaved --virtual-stages 0", nothing,
         ("mlp.py", "--stages", "4", "-o", "o", "--schedule", "interleaved",
          "--virtual-stages", "0"), r"--virtual-stages: '0'"),
    Case("zbv-odd-stages", "--schedule zbv --stages 3 (a V needs two stages per device)",
         nothing, ("mlp.py", "--stages", "3", "-o", "o", "--schedule", "zbv"),
         r"zbv places two stages on each device in a V; --stages 3 must be even"),
    Case("dualpipev-few-microbatches", "--schedule dualpipev with fewer micro-batches than stages",
         nothing, ("mlp.py", "--stages", "4", "-o", "o", "--schedule", "dualpipev",
                   "--microbatches", "2", "-q"),
         r"dualpipev needs at least 2 x devices = 4 micro-batches, one per stage of its V; got "
         r"--microbatches 2"),
    Case("compile-unknown-backend", "run --compile inductr (a typo)", nothing,
         (*RUN, "--compile", "inductr"), r"--compile: invalid choice: 'inductr'"),
    Case("save-every-without-save", "run --save-every 2 without --save", nothing,
         (*RUN, "--save-every", "2"), r"--save-every needs --save"),
    Case("max-restarts-without-save", "run --nproc 2 --max-restarts 3 without --save", nothing,
         (*RUN, "--nproc", "2", "--max-restarts", "3"), r"--max-restarts 3 needs --save DIR"),
    Case("max-restarts-without-nproc", "run --max-restarts 3 --save ck (one process)", nothing,
         (*RUN, "--max-restarts", "3", "--save", "ck"), r"--max-restarts restarts the ranks of"),
    Case("async-save-without-save", "run --async-save without --save", nothing,
         (*RUN, "--async-save"), r"--async-save writes the saves of --save DIR"),
    Case("resume-beyond-steps", "run --resume ck at step 3 with --steps 2",
         ran("run", "out", "-q", "--steps", "3", "--save", "ck"),
         (*RUN, "--steps", "2", "--resume", "ck"), r"after step 3.*--steps greater than 3"),
    Case("atol-negative", "run --check --atol -1", nothing, (*CHECK, "--atol", "-1"),
         r"--atol: '-1' is not a finite number of at least 0"),
    Case("lr-negative", "run --lr -0.1", nothing, (*RUN, "--lr", "-0.1"), r"--lr: '-0.1'"),
    Case("lr-nan", "run --lr nan", nothing, (*RUN, "--lr", "nan"), r"--lr: 'nan'"),
    Case("stages-not-a-number", "--stages two", nothing, (*COMPILE, "-o", "o", "--stages", "two"),
         r"--stages: 'two'"),
    Case("options-before-model", "pipecompile -q mlp.py --stages 2 (a flag first)", nothing,
         ("-q", "mlp.py", "--stages", "2", "-o", "o"), r"^$", status=0),
    Case("calibration-of-a-directory", "calibration --clear out (the machine's calibration, "
         "taken for the directory's)", nothing, ("calibration", "--clear", "out"),
         r"`pipecompile calibration` takes no model or directory \(got out\): the calibration "
         r"is this machine's.*`pipecompile calibration --clear` removes it",
         intact=("out/manifest.json",)),
]  # fmt: skip

OTHER_MODEL = '''"""Another model: a train state of out/ is not its."""
import torch


def build_model():
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))


def example_inputs():
    return (torch.randn(4, 8),)


def example_targets():
    return (torch.randn(4, 2),)


def loss_fn(output, target):
    return torch.nn.functional.mse_loss(output, target)
'''

STALE_AND_CHECK_CASES = [
    Case("inputs-float64", "compiled a float32 model with float64 example_inputs()",
         mlp_variant((INPUTS, INPUTS.replace("generator=g)", "generator=g).double()"))),
         ("model.py", "--stages", "2", "-q", "-o", "o"), r"node fc1.*float32 and float64"),
    Case("stale-model", "changed the model file (ReLU to GELU) after compiling, then ran",
         edit("mlp.py", "nn.ReLU()", "nn.GELU()"), RUN,
         r"out is stale: .*mlp\.py changed.*recompile.*--allow-stale", quick=True),
    Case("stale-model-check", "changed the model file after compiling, then ran --check",
         edit("mlp.py", "self.fc5 = ", "self.fc6 = nn.Linear(10, 10)\n        self.fc5 = "),
         CHECK, r"is stale"),
    Case("nan-stage-check", "edited out/stage_1.py to output NaN, then ran --check",
         edit("out/stage_1.py", "        return (", "        return (float('nan') * "),
         CHECK, r"pipelined results differ", status=1),
    Case("resume-other-split", "--resume the train state of another split of the same model "
         "(it is keyed by the model's names: it resumes)",
         steps(ran(*COMPILE, "-o", "other", "--split-at", "fc4"),
               ran("run", "out", "-q", "--save", "ck")),
         ("run", "other", "-q", "--steps", "2", "--resume", "ck"), r"^$", status=0),
    Case("resume-other-model", "--resume the train state of another model",
         steps(ran("run", "out", "-q", "--save", "ck"), write("other.py", OTHER_MODEL),
               ran("other.py", "--stages", "2", "-q", "-o", "other")),
         ("run", "other", "-q", "--steps", "2", "--resume", "ck"),
         r"ck/step_1 has no weight '0\.weight' \(and 3 more\) of this model: it was saved from "
         r"another model.*resume it into a compile of the model it was trained on",
         intact=("ck/step_1/.metadata", "ck/latest")),
    Case("export-train-state-other-split", "export --train-state from another split",
         steps(ran(*COMPILE, "-o", "other", "--split-at", "fc4"),
               ran("run", "out", "-q", "--save", "ck")),
         ("export", "other", "--train-state", "ck", "-o", "w.safetensors"),
         r"wrote \d+ tensors to w\.safetensors", status=0),
    Case("train-state-damaged", "--resume from a saved step one of whose files was cut short",
         steps(ran("run", "out", "-q", "--save", "ck"),
               truncate("ck/step_1/__0_0.distcp", 0.5)),
         (*RUN, "--steps", "2", "--resume", "ck"),
         r"train state ck/step_1 cannot be loaded.*a file of it is missing or damaged"),
    Case("train-state-missing-shard", "--resume from a saved step one of whose files was deleted",
         steps(ran("run", "out", "-q", "--save", "ck"), delete("ck/step_1/__0_0.distcp")),
         (*RUN, "--steps", "2", "--resume", "ck"),
         r"train state ck/step_1 cannot be loaded.*a file of it is missing or damaged",
         intact=("ck/step_1/.metadata",)),
    Case("onnx-residual", "onnx on a plain residual MLP (a boundary value named `add`)",
         compiled(write("model.py", RESIDUAL), out="res"), ("onnx", "res", "-q"), r"^$",
         status=0),
]  # fmt: skip

BATCHNORM = '''"""A BatchNorm model with a batch of 4."""
import torch


def build_model():
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(),
                               torch.nn.Linear(8, 2))


def example_inputs():
    return (torch.randn(4, 8),)
'''

INPLACE = '''"""Linear and ReLU(inplace=True), three times: three places to cut."""
import torch


def build_model():
    layers = []
    for _ in range(3):
        layers += [torch.nn.Linear(8, 8), torch.nn.ReLU(inplace=True)]
    return torch.nn.Sequential(*layers)


def example_inputs():
    return (torch.randn(4, 8),)
'''

TRAINING_RUN_CASES = [
    Case("loss-nan", "loss_fn returns NaN (training must stop, not go on)",
         mlp_variant((LOSS, 'return F.mse_loss(output, target) * float("nan")')),
         (*RUN, "--model", "model.py", "--steps", "3"),
         r"step 1, micro-batch 0: the loss is nan; training stops", quick=True),
    Case("skip-nonfinite-async", "run --skip-nonfinite on a pipedream compile",
         compiled(nothing, "mlp.py", out="o2", flags=("--schedule", "pipedream")),
         ("run", "o2", "--skip-nonfinite", "-q"),
         r"--skip-nonfinite needs a synchronous schedule: pipedream applies"),
    Case("data-hook-raises", "train_batches() raises",
         mlp_variant(("def loss_fn(", 'def train_batches():\n    raise OSError("no such corpus")'
                      "\n\n\ndef loss_fn(")),
         (*RUN, "--model", "model.py"),
         r"model.py: train_batches\(\) failed: OSError: no such corpus"),
    Case("data-hook-structure", "train_batches() yields (x, y, z) instead of (inputs, targets)",
         mlp_variant(("def loss_fn(", "def train_batches():\n    return [(1, 2, 3)]"
                      "\n\n\ndef loss_fn(")),
         (*RUN, "--model", "model.py"),
         r"train_batches\(\) batch 0 is a tuple of 3; each batch must be a pair"),
    Case("fp16-on-cpu", "run --precision fp16 without a GPU", nothing,
         (*RUN, "--precision", "fp16"), r"--precision fp16 needs a GPU.*bf16", quick=True),
    Case("clip-not-positive", "run --clip-grad-norm 0", nothing,
         (*RUN, "--clip-grad-norm", "0"), r"--clip-grad-norm 0: the norm must be above 0"),
    Case("unknown-lr-schedule", "run --lr-schedule cosin (a typo)", nothing,
         (*RUN, "--lr-schedule", "cosin"),
         r"invalid choice: 'cosin'.*'constant', 'cosine', 'linear'"),
    Case("batchnorm-microbatch-of-one", "BatchNorm in training, --microbatches equal to the batch",
         write("bn.py", BATCHNORM),
         ("bn.py", "--stages", "2", "--microbatches", "4", "-o", "o", "-q"),
         r"micro-batch is too small for BatchNorm.*fewer --microbatches"),
    Case("inplace-too-many-stages", "ReLU(inplace=True) after every Linear, more stages than cuts",
         write("ip.py", INPLACE), ("ip.py", "--stages", "5", "-o", "o", "-q"),
         r"only 3 places.*writing a value in place.*--stages 3 or fewer"),
    Case("2bw-window-not-filled", "--schedule pipedream_2bw --stages 3 --microbatches 8",
         nothing, ("mlp.py", "--stages", "3", "--microbatches", "8", "-o", "o", "--schedule",
                   "pipedream_2bw"),
         r"pipedream_2bw accumulates gradients over windows of 3 micro-batches.*multiple of 3"),
    Case("plan-neither-stages-nor-devices", "compile without --stages or --devices", nothing,
         ("mlp.py", "-o", "o"), r"give --stages N \(the pipeline you want\) or --devices N"),
    Case("plan-memory-limit-none-fits", "--devices 2 --memory-limit 1KB (no plan fits)", nothing,
         ("mlp.py", "--devices", "2", "--memory-limit", "1KB", "-o", "o", "-q"),
         r"no plan on 2 devices fits --memory-limit 1000 B: the smallest peak found is .*"
         r"raise --memory-limit to .* or more, or use more --devices"),
    Case("plan-microbatches-not-divisor", "--devices 2 --microbatches 3 with a batch of 8",
         nothing, ("mlp.py", "--devices", "2", "--microbatches", "3", "-o", "o", "-q"),
         r"--microbatches 3 does not divide the batch of 8 samples; choose one of 1, 2, 4, 8"),
    Case("plan-stages-over-devices", "--devices 2 --stages 4 --schedule 1f1b", nothing,
         ("mlp.py", "--devices", "2", "--stages", "4", "--schedule", "1f1b", "-o", "o", "-q"),
         r"--stages 4 cannot run on --devices 2: 1f1b runs one stage per device \(give "
         r"--devices 4 or more\)"),
    Case("plan-boundaries-over-devices",
         "--devices 2 --schedule 1f1b with three --split-at boundaries", nothing,
         ("mlp.py", "--devices", "2", "--schedule", "1f1b", "--split-at", "fc2", "--split-at",
          "fc3", "--split-at", "fc4", "-o", "o", "-q"),
         r"--devices 2: the 3 requested boundaries .* make 4 stages.*--devices 4 or more"),
    Case("plan-tune-without-search", "--stages 2 --tune 2 (nothing searched to tune)", nothing,
         ("mlp.py", "--stages", "2", "--tune", "2", "-o", "o"),
         r"--tune 2 measures the best plans a search found: give --devices N"),
    Case("plan-replicate-with-devices", "--devices 2 --replicate 1,1", nothing,
         ("mlp.py", "--devices", "2", "--replicate", "1,1", "-o", "o"),
         r"--replicate fixes how stages are replicated.*drop --replicate or the search"),
    Case("plan-async-schedule", "--devices 2 --schedule pipedream (the search is synchronous)",
         nothing, ("mlp.py", "--devices", "2", "--schedule", "pipedream", "-o", "o"),
         r"--schedule pipedream updates weights asynchronously .* prices synchronous schedules "
         r"only: fix the plan with --stages N"),
    Case("plan-v-stages-per-device", "--devices 3 --stages 3 --schedule zbv", nothing,
         ("mlp.py", "--devices", "3", "--stages", "3", "--schedule", "zbv", "-o", "o"),
         r"--stages 3 cannot run on --devices 3: zbv puts two stages on each device \(a V\), "
         r"so up to 3 devices take --stages 4 or 6"),
    Case("plan-memory-limit-count", "--devices 2 --memory-limit 1MB,1MB,1MB", nothing,
         ("mlp.py", "--devices", "2", "--memory-limit", "1MB,1MB,1MB", "-o", "o"),
         r"--memory-limit gives 3 values for --devices 2; give one per device"),
]  # fmt: skip


BASICS: list[Case] = [
    *STAGE_CASES, *WEIGHT_CASES, *INPUT_CASES, *TRAINING_CASES, *OUTPUT_CASES, *NPROC_CASES,
    *OUTPUT_DIR_CASES, *OPTION_CASES, *STALE_AND_CHECK_CASES, *TRAINING_RUN_CASES,
    *WEIGHTS_CASES,
]  # fmt: skip
