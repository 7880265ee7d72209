"""What pipecompile saved and reads back: a damaged manifest or train state, resuming with
another optimizer or from one step, a model file where a directory belongs, a model file whose
init_weights() raises."""

from __future__ import annotations

from catalogue.case import RUN, Case, ran, steps, truncate, write

SAVED_RUN = ran("run", "out", "-q", "--steps", "2", "--save", "ck", "--save-every", "1")

META_MODEL = '''"""A model built on the meta device whose init_weights() fails."""
import torch


def build_model():
    with torch.device("meta"):
        return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))


def example_inputs():
    return (torch.randn(4, 8),)


def init_weights(module):
    if isinstance(module, torch.nn.Linear):
        module.weight.normal_(0, 1 / module.in_features**0.5)
        raise ValueError("no such scheme: 'xavier-ish'")
'''

SAVED: list[Case] = [
    Case("resume-other-optimizer", "--resume a run trained with AdamW, now with --optimizer sgd",
         SAVED_RUN, (*RUN, "--steps", "3", "--resume", "ck", "--optimizer", "sgd"),
         r"ck/step_2 was trained with AdamW, this run uses SGD.*--optimizer adamw",
         intact=("ck/step_2/__0_0.distcp", "ck/latest")),
    Case("resume-meta-damaged", "--resume where the newest step's meta.json was cut short",
         steps(SAVED_RUN, write("ck/step_2/meta.json", '{"step": ')),
         (*RUN, "--steps", "3", "--resume", "ck"),
         r"ck/step_2/meta\.json is damaged.*JSONDecodeError.*--resume ck/step_1",
         intact=("ck/step_1/meta.json",)),
    Case("resume-meta-other", "--resume where meta.json is another program's JSON",
         steps(SAVED_RUN, write("ck/step_2/meta.json", '{"name": "app"}\n')),
         (*RUN, "--steps", "3", "--resume", "ck"),
         r"ck/step_2 is not a complete step saved by pipecompile.*--resume ck/step_1"),
    Case("resume-one-step", "--resume naming an earlier step directory (ck/step_1), not ck",
         SAVED_RUN, (*RUN, "--steps", "2", "--resume", "ck/step_1"), r"^$", status=0),
    Case("run-a-model-file", "run mlp.py (the model file, not the compiled directory)",
         steps(), ("run", "mlp.py", "-q"),
         r"'mlp\.py' is a model file.*compile it first \(`pipecompile mlp\.py --stages N -o DIR`"),
    Case("manifest-truncated", "out/manifest.json cut short (a copy interrupted)",
         truncate("out/manifest.json", 0.5), RUN, r"out/manifest\.json cannot be read.*recompile"),
    Case("manifest-a-list", "out/manifest.json replaced by a JSON list",
         write("out/manifest.json", "[]\n"), RUN,
         r"out/manifest\.json is not a pipecompile manifest; recompile"),
    Case("init-weights-raises", "the model file's init_weights() raises (a meta-device model)",
         write("meta_model.py", META_MODEL),
         ("meta_model.py", "--stages", "2", "-q", "-o", "mo"),
         r"init_weights\(module\) failed on 0 \(Linear\) at meta_model\.py:\d+: ValueError: "
         r"no such scheme.*fix it, or pass --weights", base=None),
]  # fmt: skip
