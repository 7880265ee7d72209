"""A model whose output holds None fields (a Hugging Face output's unset ``hidden_states``,
LLaVA's nested vision outputs) compiles: the stages return the computed values, the output's
spec puts the Nones back, and what the pipeline returns has the model's structure."""

from __future__ import annotations

import torch
import transformers as tf
from torch import nn

import pipecompile


class _Partly(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, None, tuple[torch.Tensor, None]]:
        h = self.a(x)
        return self.b(h), None, (h, None)


def test_none_fields_come_back_in_their_places():
    model, x = _Partly(), torch.randn(8, 8)
    pipe = pipecompile.compile(model, (x,), stages=2, microbatches=2)
    out, want = pipe(x), model(x)
    assert out[1] is None and out[2][1] is None
    torch.testing.assert_close(out[0], want[0])
    torch.testing.assert_close(out[2][0], want[2][0])


def test_llava_compiles_and_computes_its_logits():
    torch.manual_seed(0)
    vision = tf.CLIPVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        image_size=16,
        patch_size=8,
    )
    text = tf.LlamaConfig(
        num_hidden_layers=2,
        hidden_size=32,
        intermediate_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
        max_position_embeddings=32,
        use_cache=False,
    )
    config = tf.LlavaConfig(vision_config=vision, text_config=text, image_token_index=100,
                            vision_feature_layer=-1)  # fmt: skip
    model = tf.LlavaForConditionalGeneration(config).eval()
    ids = torch.randint(0, 99, (2, 12), generator=torch.Generator().manual_seed(1))
    ids[:, 1:5] = 100  # (16 / 8) ** 2 image tokens
    inputs = {"input_ids": ids, "pixel_values": torch.randn(2, 3, 16, 16)}
    pipe = pipecompile.compile(model, inputs, stages=2)
    torch.testing.assert_close(pipe(**inputs).logits, model(**inputs).logits)
