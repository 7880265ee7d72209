"""A small CLIP: an image encoder and a text encoder side by side, trained with a contrastive loss.

The model returns one image embedding and one text embedding per sample; ``loss_fn`` compares
every image of the batch with every text (a batch x batch similarity matrix) and asks each
image to pick its own caption and each caption its own image. That loss mixes the samples of
the batch: the compile finds so (its summary's "batch coupling" line) and every run computes it
once a step on all micro-batches' embeddings joined, so the pipeline trains exactly the model's
objective, equal to eager on the whole batch (``pipecompile run OUT --check``):

    pipecompile examples/clip.py --stages 2 --microbatches 4 -o out/clip
    pipecompile run out/clip --check
    pipecompile run out/clip --steps 20
"""

import torch
import torch.nn.functional as F
from torch import nn

BATCH_SIZE = 16
IMAGE_SIZE = 16
PATCH = 4
VOCAB = 256
TEXT_LENGTH = 12
WIDTH = 64
EMBED = 32
TEMPERATURE = 0.07


class Mixer(nn.Module):
    """``depth`` residual MLP blocks over a sequence of ``width`` features, mean-pooled."""

    def __init__(self, width: int, depth: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(width), nn.Linear(width, 2 * width), nn.GELU(),
                          nn.Linear(2 * width, width))
            for _ in range(depth)
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = x + block(x)
        return x.mean(dim=1)


class ImageEncoder(nn.Module):
    """Patches of the image, embedded, then mixed."""

    def __init__(self, width: int = WIDTH, depth: int = 2) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, width, PATCH, stride=PATCH)
        self.mixer = Mixer(width, depth)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.mixer(self.patch(pixels).flatten(2).transpose(1, 2))  # (batch, patches, .)


class TextEncoder(nn.Module):
    """Token and position embeddings, then mixed."""

    def __init__(self, width: int = WIDTH, depth: int = 2) -> None:
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, width)
        self.positions = nn.Parameter(torch.randn(TEXT_LENGTH, width) * 0.02)
        self.mixer = Mixer(width, depth)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.mixer(self.tokens(ids) + self.positions)


class CLIP(nn.Module):
    """Both encoders, each projected to ``EMBED`` features and normalised."""

    def __init__(self) -> None:
        super().__init__()
        self.image = ImageEncoder()
        self.text = TextEncoder()
        self.image_projection = nn.Linear(WIDTH, EMBED, bias=False)
        self.text_projection = nn.Linear(WIDTH, EMBED, bias=False)

    def forward(self, pixels: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        image = F.normalize(self.image_projection(self.image(pixels)), dim=-1)
        text = F.normalize(self.text_projection(self.text(ids)), dim=-1)
        return image, text


def build_model() -> nn.Module:
    """Build the model deterministically, in training mode."""
    torch.manual_seed(0)
    return CLIP().train()


def example_inputs() -> dict[str, torch.Tensor]:
    """A deterministic batch of images and their captions' token ids."""
    g = torch.Generator().manual_seed(1234)
    return {
        "pixels": torch.randn(BATCH_SIZE, 3, IMAGE_SIZE, IMAGE_SIZE, generator=g),
        "ids": torch.randint(0, VOCAB, (BATCH_SIZE, TEXT_LENGTH), generator=g),
    }


def example_targets() -> tuple[torch.Tensor, ...]:
    """No targets: sample k's image and caption are the pair to find."""
    return ()


def loss_fn(output: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """CLIP's symmetric contrastive loss over the whole batch."""
    image, text = output
    logits = image @ text.t() / TEMPERATURE
    labels = torch.arange(len(image), device=image.device)
    return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.t(), labels)) / 2


if __name__ == "__main__":
    _model = build_model()
    print(loss_fn(_model(**example_inputs())).item())
