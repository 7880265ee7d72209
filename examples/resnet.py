"""Small hand-written ResNet (BasicBlocks) classification example for pipecompile."""

import torch
import torch.nn.functional as F
from torch import nn

BATCH_SIZE = 8
NUM_CLASSES = 10
IMAGE_SIZE = 16


class BasicBlock(nn.Module):
    """ResNet basic block: conv-BN-ReLU-conv-BN plus shortcut, ReLU after add."""

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.downsample: nn.Module
        if stride != 1 or in_channels != out_channels:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False),
                nn.BatchNorm2d(out_channels),
            )
        else:
            self.downsample = nn.Identity()
        self.relu2 = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = self.downsample(x)
        out = self.relu1(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu2(out + identity)


class ResNet(nn.Module):
    """Stem, three groups of BasicBlocks (width, 2*width, 4*width), pool, fc."""

    def __init__(
        self,
        depth_per_group: int = 1,
        width: int = 16,
        num_classes: int = NUM_CLASSES,
        in_channels: int = 3,
    ) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, padding=1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(),
        )
        groups: list[nn.Module] = []
        channels = width
        for group_idx in range(3):
            out_channels = width * (2**group_idx)
            blocks: list[nn.Module] = []
            for block_idx in range(depth_per_group):
                stride = 2 if group_idx > 0 and block_idx == 0 else 1
                blocks.append(BasicBlock(channels, out_channels, stride))
                channels = out_channels
            groups.append(nn.Sequential(*blocks))
        self.layer1, self.layer2, self.layer3 = groups
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(channels, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        x = self.layer1(x)
        x = self.layer2(x)
        x = self.layer3(x)
        x = self.avgpool(x)
        x = torch.flatten(x, 1)
        return self.fc(x)


def build_resnet(depth_per_group: int = 1, width: int = 16) -> nn.Module:
    """Build a ResNet with ``depth_per_group`` blocks per group, in training mode."""
    torch.manual_seed(0)
    model = ResNet(depth_per_group=depth_per_group, width=width)
    model.train()
    return model


def build_model() -> nn.Module:
    """Build the default small ResNet (1 block per group, width 16)."""
    return build_resnet()


def example_inputs() -> tuple[torch.Tensor, ...]:
    """Return a deterministic (8, 3, 16, 16) float image batch."""
    g = torch.Generator().manual_seed(1234)
    return (torch.randn(BATCH_SIZE, 3, IMAGE_SIZE, IMAGE_SIZE, generator=g),)


def example_targets() -> tuple[torch.Tensor, ...]:
    """Return deterministic (8,) int64 class indices in [0, 10)."""
    g = torch.Generator().manual_seed(5678)
    return (torch.randint(0, NUM_CLASSES, (BATCH_SIZE,), generator=g),)


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Cross-entropy, mean-reduced over the batch."""
    return F.cross_entropy(output, target, reduction="mean")


if __name__ == "__main__":
    _model = build_model()
    print(loss_fn(_model(*example_inputs()), *example_targets()).item())
