"""Hugging Face transformers: 40-odd architectures, each from a tiny config with random weights
(``AutoConfig.for_model(model_type, ...)``: 2 layers, hidden 64, vocab 128, ``use_cache=False``,
every dropout and layer-drop rate 0), with a head that gives a loss: a causal LM (next-token
cross-entropy on ``input_ids`` (8, 16)), a sequence classifier (3 labels), an encoder-decoder LM
(``input_ids`` and ``decoder_input_ids``), an image classifier (``pixel_values`` (8, 3, 32, 32),
10 labels), the bare model (mean square of ``last_hidden_state`` against a target), a
contrastive dual encoder (CLIP, SigLIP: ``input_ids`` and ``pixel_values``, CLIP's loss over the
whole batch in ``loss_fn``) or an image encoder beside a language model (LLaVA: 16 image tokens
in ``input_ids``, next-token cross-entropy)."""

from __future__ import annotations

from dataclasses import dataclass, field

from zoos.common import Model, model_file

ZOO = "hf"
QUICK = ("gpt2",)
TEXT = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 128,
    "vocab_size": 128,
    "max_position_embeddings": 64,
    "use_cache": False,
    "pad_token_id": 0,
    "bos_token_id": 0,
    "eos_token_id": 0,
}
GQA = {"num_key_value_heads": 4, "head_dim": 16}  # the Llama family's own names
SEQ2SEQ = {
    "d_model": 64,
    "encoder_layers": 2,
    "decoder_layers": 2,
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 4,
    "encoder_ffn_dim": 128,
    "decoder_ffn_dim": 128,
    "vocab_size": 128,
    "max_position_embeddings": 64,
    "use_cache": False,
    "pad_token_id": 0,
    "bos_token_id": 0,
    "eos_token_id": 0,
    "decoder_start_token_id": 0,
}
T5 = {
    "d_model": 64,
    "d_kv": 16,
    "d_ff": 128,
    "num_layers": 2,
    "num_decoder_layers": 2,
    "num_heads": 4,
    "vocab_size": 128,
    "use_cache": False,
    "pad_token_id": 0,
    "eos_token_id": 0,
    "decoder_start_token_id": 0,
}
VIT = {
    "image_size": 32,
    "patch_size": 8,
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 128,
    "num_labels": 10,
}
TOWER = {
    "vocab_size": 128,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "max_position_embeddings": 32,
}
VISION = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "image_size": 32,
    "patch_size": 8,
}
LM = {**TOWER, "num_key_value_heads": 2, "use_cache": False}
STAGES4 = {"hidden_sizes": [16, 32, 64, 128], "depths": [1, 1, 1, 1], "num_labels": 10}


@dataclass(frozen=True)
class Recipe:
    """A model type, its head (``causal``, ``classify``, ``seq2seq``, ``image``, ``base``) and
    the config's settings."""

    model_type: str
    head: str
    settings: dict[str, object] = field(default_factory=dict)


def _text(model_type: str, head: str = "causal", **more: object) -> Recipe:
    """The tiny text settings with ``more`` (a setting given as None is left out)."""
    settings = {**TEXT, **more}
    return Recipe(model_type, head, {k: v for k, v in settings.items() if v is not None})


RECIPES: dict[str, Recipe] = {
    "gpt2": _text("gpt2"),
    "gpt_neo": _text("gpt_neo", num_layers=2, attention_types=[[["global", "local"], 1]]),
    "gptj": _text("gptj", rotary_dim=16),
    "codegen": _text("codegen", rotary_dim=16),
    "gpt_neox": _text("gpt_neox"),
    "gpt_bigcode": _text("gpt_bigcode"),
    "opt": _text("opt", word_embed_proj_dim=64, ffn_dim=128),
    "bloom": _text("bloom"),
    "llama": _text("llama", **GQA),
    "mistral": _text("mistral", **GQA),
    "mixtral": _text("mixtral", **GQA, num_local_experts=4),
    "qwen2_moe": _text(
        "qwen2_moe",
        **GQA,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=64,
        shared_expert_intermediate_size=64,
    ),
    "olmoe": _text("olmoe", **GQA, num_experts=4, num_experts_per_tok=2),
    "qwen2": _text("qwen2", **GQA),
    "qwen3": _text("qwen3", **GQA),
    "phi": _text("phi"),
    "phi3": _text("phi3", **GQA),
    "gemma": _text("gemma", **GQA),
    "gemma2": _text("gemma2", **GQA),
    "falcon": _text("falcon"),
    "stablelm": _text("stablelm", **GQA),
    "starcoder2": _text("starcoder2", **GQA),
    "olmo": _text("olmo", **GQA),
    "cohere": _text("cohere", **GQA),
    "biogpt": _text("biogpt"),
    "xglm": _text("xglm", ffn_dim=128),
    "mpt": _text("mpt"),
    "granite": _text("granite", **GQA),
    "mamba": _text("mamba"),
    "bert": _text("bert", "classify"),
    "roberta": _text("roberta", "classify"),
    "xlm-roberta": _text("xlm-roberta", "classify"),
    "camembert": _text("camembert", "classify"),
    "distilbert": _text("distilbert", "classify", dim=64, n_layers=2, n_heads=4, hidden_dim=128),
    "albert": _text("albert", "classify", embedding_size=32),
    "electra": _text("electra", "classify", embedding_size=32),
    "deberta": _text("deberta", "classify"),
    "deberta-v2": _text("deberta-v2", "classify"),
    "mpnet": _text("mpnet", "classify"),
    "mobilebert": _text(
        "mobilebert",
        "classify",
        embedding_size=32,
        true_hidden_size=64,
        intra_bottleneck_size=64,
        num_feedforward_networks=1,
    ),
    "squeezebert": _text("squeezebert", "classify", embedding_size=64),
    "funnel": _text(
        "funnel",
        "classify",
        block_sizes=[1, 1],
        d_model=64,
        n_head=4,
        d_head=16,
        d_inner=128,
        num_hidden_layers=None,  # block_sizes says it
        hidden_size=None,
        num_attention_heads=None,
    ),
    "layoutlm": _text("layoutlm", "classify"),
    "convbert": _text("convbert", "classify", embedding_size=64),
    "roformer": _text("roformer", "classify", embedding_size=64),
    "ernie": _text("ernie", "classify"),
    "bart": Recipe("bart", "seq2seq", SEQ2SEQ),
    "mbart": Recipe("mbart", "seq2seq", SEQ2SEQ),
    "pegasus": Recipe("pegasus", "seq2seq", SEQ2SEQ),
    "marian": Recipe("marian", "seq2seq", SEQ2SEQ),
    "blenderbot": Recipe("blenderbot", "seq2seq", SEQ2SEQ),
    "t5": Recipe("t5", "seq2seq", T5),
    "vit": Recipe("vit", "image", VIT),
    "deit": Recipe("deit", "image", {**VIT, "architectures": ["DeiTForImageClassification"]}),
    "beit": Recipe("beit", "image", VIT),
    "dinov2": Recipe("dinov2", "image", VIT),
    "convnext": Recipe("convnext", "image", STAGES4),
    "resnet": Recipe("resnet", "image", {**STAGES4, "embedding_size": 16}),
    "regnet": Recipe("regnet", "image", {**STAGES4, "embedding_size": 16, "groups_width": 8}),
    "swin": Recipe(
        "swin",
        "image",
        {
            "image_size": 32,
            "patch_size": 2,
            "embed_dim": 16,
            "depths": [1, 1],
            "num_heads": [2, 2],
            "window_size": 4,
            "num_labels": 10,
        },
    ),
    "bert-base": _text("bert", "base"),
    # models as graphs: two encoders side by side (the contrastive loss in loss_fn, over the
    # whole batch), and an image encoder beside a language model
    "clip": Recipe("clip", "contrastive", {"text_config": TOWER, "vision_config": VISION}),
    "siglip": Recipe("siglip", "contrastive", {"text_config": TOWER, "vision_config": VISION}),
    "llava": Recipe(
        "llava",
        "multimodal",
        {
            "vision_config": {**VISION, "model_type": "clip_vision_model"},
            "text_config": {"model_type": "llama", **LM},
            "image_token_index": 127,
            "vision_feature_layer": -1,
        },
    ),
}

AUTO = {
    "causal": "AutoModelForCausalLM",
    "classify": "AutoModelForSequenceClassification",
    "seq2seq": "AutoModelForSeq2SeqLM",
    "image": "AutoModelForImageClassification",
    "base": "AutoModel",
    "contrastive": "AutoModel",
    "multimodal": "AutoModelForImageTextToText",
}

CONFIG = """
import transformers
from transformers import AutoConfig, {auto}

transformers.logging.set_verbosity_error()

MODEL_TYPE = {model_type!r}
SETTINGS = {settings!r}
VOCAB = 128
SEQ = 16
LABELS = 3
SIZE = 32
CLASSES = 10


def _config():
    config = AutoConfig.for_model(MODEL_TYPE, **SETTINGS)
    for key, value in config.to_dict().items():
        if "drop" in key and isinstance(value, float):  # dropout and layer-drop rates
            setattr(config, key, 0.0)
    return config


def _build() -> nn.Module:
    return {auto}.from_config(_config())


def _ids(rows: int, length: int, seed: int) -> torch.Tensor:
    return torch.randint(1, VOCAB, (rows, length), generator=torch.Generator().manual_seed(seed))
"""

HEADS = {
    "causal": """

def example_inputs() -> dict[str, torch.Tensor]:
    return {"input_ids": _ids(BATCH, SEQ + 1, 1234)[:, :-1].contiguous()}


def example_targets() -> tuple[torch.Tensor, ...]:
    return (_ids(BATCH, SEQ + 1, 1234)[:, 1:].contiguous(),)


def loss_fn(output, target: torch.Tensor) -> torch.Tensor:
    logits = output.logits
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), target.reshape(-1))
""",
    "seq2seq": """

def example_inputs() -> dict[str, torch.Tensor]:
    return {"input_ids": _ids(BATCH, SEQ, 1234), "decoder_input_ids": _ids(BATCH, SEQ, 4321)}


def example_targets() -> tuple[torch.Tensor, ...]:
    return (_ids(BATCH, SEQ, 5678),)


def loss_fn(output, target: torch.Tensor) -> torch.Tensor:
    logits = output.logits
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), target.reshape(-1))
""",
    "classify": """

def example_inputs() -> dict[str, torch.Tensor]:
    return {"input_ids": _ids(BATCH, SEQ, 1234)}


def example_targets() -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(5678)
    return (torch.randint(0, LABELS, (BATCH,), generator=g),)


def loss_fn(output, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(output.logits, target)
""",
    "image": """

def example_inputs() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1234)
    return {"pixel_values": torch.randn(BATCH, 3, SIZE, SIZE, generator=g)}


def example_targets() -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(5678)
    return (torch.randint(0, CLASSES, (BATCH,), generator=g),)


def loss_fn(output, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(output.logits, target)
""",
    "base": """

def example_inputs() -> dict[str, torch.Tensor]:
    return {"input_ids": _ids(BATCH, SEQ, 1234)}


def example_targets() -> tuple[torch.Tensor, ...]:
    return (torch.randn(BATCH, generator=torch.Generator().manual_seed(5678)),)


def loss_fn(output, target: torch.Tensor) -> torch.Tensor:
    return ((output.last_hidden_state.mean(dim=(1, 2)) - target) ** 2).mean()
""",
}


HEADS["contrastive"] = """

def example_inputs() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1234)
    return {"input_ids": _ids(BATCH, SEQ, 1234),
            "pixel_values": torch.randn(BATCH, 3, SIZE, SIZE, generator=g)}


def example_targets() -> tuple[torch.Tensor, ...]:
    return ()


def loss_fn(output) -> torch.Tensor:
    logits = output.logits_per_image
    labels = torch.arange(len(logits), device=logits.device)
    return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.t(), labels)) / 2
"""
HEADS["multimodal"] = """

IMAGE_TOKENS = (SIZE // 8) ** 2


def example_inputs() -> dict[str, torch.Tensor]:
    ids = _ids(BATCH, SEQ + IMAGE_TOKENS, 1234) % 120
    ids[:, 1 : 1 + IMAGE_TOKENS] = 127
    g = torch.Generator().manual_seed(1234)
    return {"input_ids": ids, "pixel_values": torch.randn(BATCH, 3, SIZE, SIZE, generator=g)}


def example_targets() -> tuple[torch.Tensor, ...]:
    return (_ids(BATCH, SEQ + IMAGE_TOKENS, 4321),)


def loss_fn(output, target: torch.Tensor) -> torch.Tensor:
    logits = output.logits
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), target.reshape(-1))
"""


def names(zoo_dir: str) -> list[str]:
    del zoo_dir  # transformers is in the environment
    return list(RECIPES)


def model(name: str, zoo_dir: str) -> Model:
    del zoo_dir
    if name not in RECIPES:
        raise KeyError(f"no Hugging Face recipe named {name!r}; known: {', '.join(RECIPES)}")
    recipe = RECIPES[name]
    settings = dict(recipe.settings)
    if recipe.head == "classify":
        settings["num_labels"] = 3  # LABELS in the model file
    body = CONFIG.format(auto=AUTO[recipe.head], model_type=recipe.model_type, settings=settings)
    source = model_file(ZOO, name, body + HEADS[recipe.head])
    return Model(ZOO, name, source, generates=recipe.head == "causal")
