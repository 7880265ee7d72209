"""Two-tower scoring model (a user tower and an item tower, joined by a dot product).

forward() computes the towers layer by layer, interleaved, so the traced order alternates
between them; pipecompile's balancer also tries depth-first orders that finish one tower
before the other and keeps the one whose best split is fastest (here: fewer bytes cross
each stage boundary).
"""

import torch
import torch.nn.functional as F
from torch import nn

BATCH_SIZE = 32
IN_FEATURES = 128


class TwoTowers(nn.Module):
    """Each tower: ``depth`` wide Linear+ReLU layers, then a projection to ``out`` features."""

    def __init__(
        self, in_features: int = IN_FEATURES, width: int = 1024, out: int = 64, depth: int = 4
    ) -> None:
        super().__init__()
        dims = [in_features] + [width] * depth + [out]
        self.user = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims, dims[1:]))
        self.item = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims, dims[1:]))

    def forward(self, user: torch.Tensor, item: torch.Tensor) -> torch.Tensor:
        for user_layer, item_layer in zip(self.user, self.item):
            user = torch.relu(user_layer(user))
            item = torch.relu(item_layer(item))
        return (user * item).sum(dim=-1)


def build_model() -> nn.Module:
    """Build the model deterministically, in training mode."""
    torch.manual_seed(0)
    return TwoTowers().train()


def example_inputs() -> dict[str, torch.Tensor]:
    """A deterministic batch of user and item features."""
    g = torch.Generator().manual_seed(1234)
    return {
        "user": torch.randn(BATCH_SIZE, IN_FEATURES, generator=g),
        "item": torch.randn(BATCH_SIZE, IN_FEATURES, generator=g),
    }


def example_targets() -> tuple[torch.Tensor, ...]:
    """A deterministic score per pair."""
    g = torch.Generator().manual_seed(5678)
    return (torch.randn(BATCH_SIZE, generator=g),)


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean-squared error of the scores."""
    return F.mse_loss(output, target)


if __name__ == "__main__":
    _model = build_model()
    print(loss_fn(_model(**example_inputs()), *example_targets()).item())
