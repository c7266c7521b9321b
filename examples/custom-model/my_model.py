"""A model of your own for dacflnode: any ``torch.nn.Module``.

dacflnode builds it from the name ``"my_model:OrientationNet"`` (``package.module:Class``, the
module importable from ``sys.path``) as ``OrientationNet(input_shape=(C, H, W), num_classes=K)``;
a constructor that takes neither keyword is called without them. Every node starts from the
same weights (the run's seed is set before each build), and every floating-point parameter and
batch-norm statistic is what the nodes mix (docs/model-state.md).
"""

from __future__ import annotations

import torch
from torch import nn


class OrientationNet(nn.Module):
    """Two 3×3 convolutions with batch norm, global average pooling, one linear layer: small
    enough to train many nodes on a CPU, and independent of the image size."""

    def __init__(self, input_shape: tuple[int, int, int], num_classes: int) -> None:
        super().__init__()
        channels = input_shape[0]
        self.features = nn.Sequential(
            nn.Conv2d(channels, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        )
        self.head = nn.Linear(16, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.head(self.features(x).mean(dim=(2, 3)))
        return logits
