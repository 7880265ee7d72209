"""A plain PyTorch training loop over a pipelined model: the ``@pipecompile.pipeline``
decorator compiles the model into stages on its first call; the loop is unchanged.

Run: ``python examples/train_with_decorator.py``.
"""

import torch
import torch.nn.functional as F
from torch import nn

import pipecompile

BATCH_SIZE = 16
IN_FEATURES = 32


@pipecompile.pipeline(stages=3, microbatches=4, schedule="1f1b")
class Regressor(nn.Module):
    """Four Linear+GELU layers and a linear head, pipelined over 3 stages."""

    def __init__(self, width: int = 128) -> None:
        super().__init__()
        dims = [IN_FEATURES] + [width] * 4
        self.body = nn.Sequential(
            *[m for a, b in zip(dims, dims[1:]) for m in (nn.Linear(a, b), nn.GELU())]
        )
        self.head = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x)).squeeze(-1)


def build_model() -> nn.Module:
    """The decorated model, built deterministically (``pipecompile`` can compile it too)."""
    torch.manual_seed(0)
    return Regressor()


def example_inputs() -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(1)
    return (torch.randn(BATCH_SIZE, IN_FEATURES, generator=g),)


def example_targets() -> tuple[torch.Tensor, ...]:
    (x,) = example_inputs()
    return (x[:, :4].sum(dim=1),)


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(output, target)


def train(steps: int = 20) -> list[float]:
    """Fit a simple function with AdamW; returns the losses."""
    model = build_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    (x,), (y,) = example_inputs(), example_targets()
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)  # the first call compiles the model into 3 stages
        loss.backward()  # runs the schedule's backward, gradients land on model.parameters()
        optimizer.step()
        losses.append(loss.item())
    print(f"compiled into {len(model.pipeline.stages)} stages; schedule "
          f"{model.pipeline.program.schedule}")  # fmt: skip
    return losses


if __name__ == "__main__":
    history = train()
    print(f"loss {history[0]:.4f} -> {history[-1]:.4f}")
