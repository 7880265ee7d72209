"""Small multi-layer perceptron regression example for pipecompile."""

import torch
import torch.nn.functional as F
from torch import nn

BATCH_SIZE = 8
IN_FEATURES = 32
OUT_FEATURES = 10


class MLP(nn.Module):
    """A plain stack of Linear layers with ReLU/GELU activations."""

    def __init__(
        self,
        in_features: int = IN_FEATURES,
        hidden: int = 64,
        out_features: int = OUT_FEATURES,
    ) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden)
        self.act1 = nn.ReLU()
        self.fc2 = nn.Linear(hidden, hidden)
        self.act2 = nn.GELU()
        self.fc3 = nn.Linear(hidden, hidden)
        self.act3 = nn.ReLU()
        self.fc4 = nn.Linear(hidden, hidden)
        self.act4 = nn.GELU()
        self.fc5 = nn.Linear(hidden, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.act1(self.fc1(x))
        x = self.act2(self.fc2(x))
        x = self.act3(self.fc3(x))
        x = self.act4(self.fc4(x))
        return self.fc5(x)


def build_model() -> nn.Module:
    """Build the MLP deterministically, in training mode."""
    torch.manual_seed(0)
    model = MLP()
    model.train()
    return model


def example_inputs() -> tuple[torch.Tensor, ...]:
    """Return a deterministic (8, 32) float input batch."""
    g = torch.Generator().manual_seed(1234)
    return (torch.randn(BATCH_SIZE, IN_FEATURES, generator=g),)


def example_targets() -> tuple[torch.Tensor, ...]:
    """Return a deterministic (8, 10) float regression target."""
    g = torch.Generator().manual_seed(5678)
    return (torch.randn(BATCH_SIZE, OUT_FEATURES, generator=g),)


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean-squared error, mean-reduced over the batch."""
    return F.mse_loss(output, target, reduction="mean")


if __name__ == "__main__":
    _model = build_model()
    print(loss_fn(_model(*example_inputs()), *example_targets()).item())
