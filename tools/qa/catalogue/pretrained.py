"""--weights: every model tensor loaded or named, prefixes resolved as from_pretrained resolves
them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from catalogue.case import COMPILE, MLP, Case, Setup, mlp_variant, nothing, steps, write


def mlp_pretrained(
    path: str, rename: Callable[[str], str] = lambda n: n, drop: tuple[str, ...] = ()
) -> Setup:
    """examples/mlp.py's weights saved to ``path`` with each name renamed, some dropped."""

    def run(d: Path) -> None:
        import runpy

        import torch
        from safetensors.torch import save_file

        model: torch.nn.Module = runpy.run_path(str(MLP))["build_model"]()
        state = {rename(k): v for k, v in model.state_dict().items() if k not in drop}
        save_file(state, str(d / path))

    return run


GPT2 = """
import torch
from transformers import GPT2Config, GPT2LMHeadModel, GPT2Model

CONFIG = GPT2Config(vocab_size=32, n_positions=16, n_embd=16, n_layer=2, n_head=2,
                    resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False,
                    tie_word_embeddings=TIED, bos_token_id=0, eos_token_id=0)


def build_model():
    return CLASS(CONFIG)


def example_inputs():
    return (torch.randint(0, 32, (2, 8), generator=torch.Generator().manual_seed(0)),)
"""


def gpt2_file(cls: str = "GPT2LMHeadModel", tied: bool = True) -> Setup:
    """A tiny Hugging Face GPT-2 (``cls``) as model.py."""
    return write("model.py", GPT2.replace("CLASS", cls).replace("TIED", str(tied)))


def gpt2_pretrained(
    path: str, cls: str = "GPT2Model", shard: str | None = None, n_embd: int | None = None
) -> Setup:
    """model.py's configuration (with ``n_embd`` when given) as a ``cls`` saved by Hugging
    Face (``save_pretrained``, in shards of ``shard`` when given) into directory ``path``."""

    def run(d: Path) -> None:
        import runpy

        import transformers

        transformers.logging.set_verbosity_error()
        config = runpy.run_path(str(d / "model.py"))["CONFIG"]
        config.n_embd = n_embd or config.n_embd
        model = getattr(transformers, cls)(config)
        model.save_pretrained(d / path, max_shard_size=shard or "5GB")

    return run


MISSING = mlp_pretrained("ck.safetensors", drop=("fc3.bias",))
EXTRA_PREFIX = mlp_pretrained("ck.safetensors", rename=lambda n: f"model.{n}")
OTHER_NAMES = mlp_pretrained("ck.safetensors", rename=lambda n: n.replace("fc", "layer"))
WRAPPED = mlp_variant(
    ("def build_model() -> nn.Module:", "class Wrapped(nn.Module):\n    def __init__(self):\n"
     "        super().__init__()\n        self.net = MLP()\n\n    def forward(self, x):\n"
     "        return self.net(x)\n\n\ndef build_model() -> nn.Module:"),
    ("    model = MLP()\n", "    model = Wrapped()\n"),
)  # fmt: skip
MODEL = ("model.py", "--stages", "2", "-q", "-o", "o")
WEIGHTS = (*MODEL, "--weights", "ck")
NOTE = "pipecompile: note: "

PRETRAINED = [
    Case("weights-missing-tensor", "--weights lacking one of the model's tensors (fc3.bias)",
         MISSING, (*COMPILE, "-o", "o", "--weights", "ck.safetensors"),
         r"ck\.safetensors lacks 1 of the model's 10 tensors: fc3\.bias; pass the pretrained "
         r"weights of this model, or --allow-missing"),
    Case("weights-allow-missing", "the same with --allow-missing (works, listed)",
         MISSING, (*COMPILE, "-o", "o", "--weights", "ck.safetensors", "--allow-missing"),
         NOTE + r"--allow-missing: 1 of the model's 10 tensors are not in ck\.safetensors and "
         r"are initialised instead: fc3\.bias", status=0),
    Case("allow-missing-without-weights", "--allow-missing without --weights",
         nothing, (*COMPILE, "-o", "o", "--allow-missing"),
         r"--allow-missing applies to --weights; pass --weights PATH or drop it"),
    Case("weights-other-names", "--weights whose names are all another model's (layer1.*)",
         OTHER_NAMES, (*COMPILE, "-o", "o", "--weights", "ck.safetensors"),
         r"lacks 10 of the model's 10 tensors: fc1\.weight, fc1\.bias, fc2\.weight, \.\.\. "
         r"\(it holds none of them, e\.g\. layer1\.bias\)"),
    Case("weights-other-names-allowed", "the same with --allow-missing (works: all listed)",
         OTHER_NAMES, (*COMPILE, "-o", "o", "--weights", "ck.safetensors", "--allow-missing"),
         NOTE + r"--allow-missing: 10 of the model's 10 tensors are not in ck\.safetensors.*"
         r"fc1\.weight, fc1\.bias.*fc5\.bias", status=0),
    Case("weights-extra-prefix", "--weights with every name under 'model.' (model.fc1.weight)",
         EXTRA_PREFIX, (*COMPILE, "-o", "o", "--weights", "ck.safetensors"),
         NOTE + r"the names in ck\.safetensors carry the extra prefix 'model\.': read with the "
         r"prefix 'model\.' removed", status=0),
    Case("weights-lacking-prefix", "a model wrapping the MLP as .net, --weights of the MLP",
         steps(WRAPPED, mlp_pretrained("ck.safetensors")),
         (*MODEL, "--weights", "ck.safetensors"),
         NOTE + r"the names in ck\.safetensors lack the model's prefix 'net\.' \(weights of "
         r"the base model\): read with the prefix 'net\.' added", status=0),
    Case("weights-hf-base-for-head", "GPT2LMHeadModel, --weights of a GPT2Model (save_pretrained)",
         steps(gpt2_file(), gpt2_pretrained("ck")), WEIGHTS,
         NOTE + r"the names in ck lack the model's prefix 'transformer\.' \(weights of the "
         r"base model\): read with the prefix 'transformer\.' added, as from_pretrained does",
         status=0, base=None),
    Case("weights-hf-base-sharded", "the same, the GPT2Model saved in shards of 20KB",
         steps(gpt2_file(), gpt2_pretrained("ck", shard="20KB")), WEIGHTS,
         NOTE + r"the names in ck lack the model's prefix 'transformer\.'", status=0, base=None),
    Case("weights-hf-head-for-base", "GPT2Model, --weights of a GPT2LMHeadModel (save_pretrained)",
         steps(gpt2_file("GPT2Model"), gpt2_pretrained("ck", "GPT2LMHeadModel")), WEIGHTS,
         NOTE + r"the names in ck carry the extra prefix 'transformer\.': read with the prefix "
         r"'transformer\.' removed", status=0, base=None),
    Case("weights-hf-untied-head-missing",
         "GPT2LMHeadModel with an untied lm_head, --weights of a GPT2Model",
         steps(gpt2_file(tied=False), gpt2_pretrained("ck")), WEIGHTS,
         r"ck lacks 1 of the model's 29 tensors \(read with prefix 'transformer\.' added\): "
         r"lm_head\.weight; pass the pretrained weights of this model, or --allow-missing",
         base=None),
    Case("weights-hf-untied-head-allowed", "the same with --allow-missing (works: head listed)",
         steps(gpt2_file(tied=False), gpt2_pretrained("ck")), (*WEIGHTS, "--allow-missing"),
         NOTE + r"the names in ck lack the model's prefix 'transformer\.'.*" + NOTE
         + r"--allow-missing: 1 of the model's 29 tensors are not in ck and are initialised "
         r"instead: lm_head\.weight", status=0, base=None),
    Case("weights-hf-wrong-size", "GPT2LMHeadModel, --weights of a GPT2Model with n_embd 32",
         steps(gpt2_file(), gpt2_pretrained("ck", n_embd=32)), WEIGHTS,
         r"wte\.weight is \[32, 32\] in .* but \[32, 16\] in the model; the pretrained "
         r"weights are of another model or configuration", base=None),
]  # fmt: skip
