"""Observation encoders of ML-Agents (mlagents/trainers/torch_entities/encoders.py), for inference.

Each encoder checks its input shape in its constructor. Visual encoders take channels-first
(N, C, H, W) float inputs, as ML-Agents' ONNX interface does.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from huggy_agent.actor.layers import Swish

NORMALIZER_CLIP = 5.0
VISUAL_ENCODERS = ("simple", "nature_cnn", "resnet", "match3", "fully_connected")
MIN_RESOLUTION = {"fully_connected": 1, "match3": 5, "simple": 20, "nature_cnn": 36, "resnet": 15}


class Normalizer(nn.Module):
    """`clamp((x - running_mean) / std, -5, 5)`, always in float32 whatever the layers' dtype:
    ML-Agents' running variance and step count overflow float16. `std` is
    `sqrt(running_variance / normalization_steps)`, derived once by the loader.

    Args:
        size: values per observation.
    """

    running_mean: torch.Tensor
    std: torch.Tensor

    def __init__(self, size: int) -> None:
        super().__init__()
        self.register_buffer("running_mean", torch.zeros(size))
        self.register_buffer("std", torch.ones(size))

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> Normalizer:
        # Keep the buffers float32 whatever `.to(dtype)` / `.half()` asks; device moves apply.
        mean, std = self.running_mean, self.std
        super()._apply(fn, recurse)  # type: ignore[no-untyped-call]  # torch leaves it untyped
        self.running_mean = mean.to(self.running_mean.device)
        self.std = std.to(self.std.device)
        return self

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """Normalize and clip, in float32.

        Args:
            inputs: (N, size) observations.

        Returns:
            (N, size) float32.
        """
        return torch.clamp((inputs.float() - self.running_mean) / self.std, -NORMALIZER_CLIP,
                           NORMALIZER_CLIP)


class VectorInput(nn.Module):
    """A vector observation, normalized or passed through.

    Args:
        input_size: values per observation.
        normalize: whether it has a `Normalizer`.
    """

    def __init__(self, input_size: int, normalize: bool) -> None:
        super().__init__()
        self.normalizer = Normalizer(input_size) if normalize else None

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """The observation, normalized where there is a normalizer.

        Args:
            inputs: (N, input_size) observations.

        Returns:
            (N, input_size): float32 when normalized, else `inputs` itself.
        """
        return inputs if self.normalizer is None else self.normalizer(inputs)


def conv_output_shape(h_w: tuple[int, int], kernel_size: int, stride: int = 1,
                      padding: int = 0) -> tuple[int, int]:
    """Height and width after a convolution.

    Args:
        h_w: height and width before it.
        kernel_size: the square kernel's side.
        stride: the stride.
        padding: the padding on each side.

    Returns:
        (height, width).
    """
    return tuple(math.floor((d + 2 * padding - (kernel_size - 1) - 1) / stride + 1)  # type: ignore[return-value]
                 for d in h_w)


def pool_out_shape(h_w: tuple[int, int], kernel_size: int) -> tuple[int, int]:
    """Height and width after ML-Agents' stride-2 max pooling.

    Args:
        h_w: height and width before it.
        kernel_size: the square window's side.

    Returns:
        (height, width).
    """
    return (h_w[0] - kernel_size) // 2 + 1, (h_w[1] - kernel_size) // 2 + 1


def _dense(input_size: int, output_size: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(input_size, output_size), nn.LeakyReLU())


class FullyConnectedVisualEncoder(nn.Module):
    """`fully_connected`: flatten, Linear, LeakyReLU.

    Args:
        height, width, initial_channels: the image's shape.
        output_size: width of the encoding.
    """

    def __init__(self, height: int, width: int, initial_channels: int, output_size: int) -> None:
        super().__init__()
        self.input_size = height * width * initial_channels
        self.dense = _dense(self.input_size, output_size)

    def forward(self, visual_obs: torch.Tensor) -> torch.Tensor:
        """Encode images.

        Args:
            visual_obs: (N, C, H, W).

        Returns:
            (N, output_size).
        """
        encoding: torch.Tensor = self.dense(visual_obs.reshape(-1, self.input_size))
        return encoding


class _ConvEncoder(nn.Module):
    """Convolutions with LeakyReLU, flatten, then a dense LeakyReLU layer."""

    SPECS: tuple[tuple[int, int, int], ...] = ()  # (out channels, kernel, stride)

    def __init__(self, height: int, width: int, initial_channels: int, output_size: int) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        channels, h_w = initial_channels, (height, width)
        for out_channels, kernel, stride in self.SPECS:
            layers += [nn.Conv2d(channels, out_channels, (kernel, kernel), (stride, stride)),
                       nn.LeakyReLU()]
            channels, h_w = out_channels, conv_output_shape(h_w, kernel, stride)
        self.final_flat = h_w[0] * h_w[1] * channels
        self.conv_layers = nn.Sequential(*layers)
        self.dense = _dense(self.final_flat, output_size)

    def forward(self, visual_obs: torch.Tensor) -> torch.Tensor:
        hidden = self.conv_layers(visual_obs)
        encoding: torch.Tensor = self.dense(hidden.reshape(-1, self.final_flat))
        return encoding


class SimpleVisualEncoder(_ConvEncoder):
    """`simple`: 16 8x8/4, 32 4x4/2."""

    SPECS = ((16, 8, 4), (32, 4, 2))


class NatureVisualEncoder(_ConvEncoder):
    """`nature_cnn`: 32 8x8/4, 64 4x4/2, 64 3x3/1."""

    SPECS = ((32, 8, 4), (64, 4, 2), (64, 3, 1))


class SmallVisualEncoder(_ConvEncoder):
    """`match3`: 35 3x3/1, 144 3x3/1."""

    SPECS = ((35, 3, 1), (144, 3, 1))


class ResNetBlock(nn.Module):
    """`x + conv(swish(conv(swish(x))))`, 3x3 convolutions with padding 1.

    Args:
        channel: channels in and out.
    """

    def __init__(self, channel: int) -> None:
        super().__init__()
        self.layers = nn.Sequential(Swish(), nn.Conv2d(channel, channel, (3, 3), (1, 1), padding=1),
                                    Swish(), nn.Conv2d(channel, channel, (3, 3), (1, 1), padding=1))

    def forward(self, input_tensor: torch.Tensor) -> torch.Tensor:
        """Apply the block.

        Args:
            input_tensor: (N, channel, H, W).

        Returns:
            A tensor of the same shape.
        """
        residual: torch.Tensor = self.layers(input_tensor)
        return input_tensor + residual


class ResNetVisualEncoder(nn.Module):
    """`resnet`: three stacks (16, 32, 32 channels) of conv, 3x3/2 max pool, two residual
    blocks; then Swish, flatten, dense, ReLU.

    Args:
        height, width, initial_channels: the image's shape.
        output_size: width of the encoding.
    """

    def __init__(self, height: int, width: int, initial_channels: int, output_size: int) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        last = initial_channels
        for channel in (16, 32, 32):
            layers += [nn.Conv2d(last, channel, (3, 3), (1, 1), padding=1),
                       nn.MaxPool2d((3, 3), (2, 2))]
            height, width = pool_out_shape((height, width), 3)
            layers += [ResNetBlock(channel), ResNetBlock(channel)]
            last = channel
        layers.append(Swish())
        self.final_flat_size = last * height * width
        self.dense = nn.Linear(self.final_flat_size, output_size)
        self.sequential = nn.Sequential(*layers)

    def forward(self, visual_obs: torch.Tensor) -> torch.Tensor:
        """Encode images.

        Args:
            visual_obs: (N, C, H, W).

        Returns:
            (N, output_size).
        """
        hidden = self.sequential(visual_obs).reshape(-1, self.final_flat_size)
        return torch.relu(self.dense(hidden))


VISUAL_ENCODER_CLASSES: dict[str, type[nn.Module]] = {
    "simple": SimpleVisualEncoder, "nature_cnn": NatureVisualEncoder,
    "resnet": ResNetVisualEncoder, "match3": SmallVisualEncoder,
    "fully_connected": FullyConnectedVisualEncoder,
}


def visual_encoder(kind: str, shape: tuple[int, int, int], output_size: int) -> nn.Module:
    """The ML-Agents visual encoder of a kind, for an image shape.

    Args:
        kind: one of `VISUAL_ENCODERS`.
        shape: (C, H, W) of the observations.
        output_size: width of the encoding.

    Returns:
        The encoder module.

    Raises:
        ValueError: an unknown kind, or an image smaller than the encoder's minimum resolution.
    """
    if kind not in VISUAL_ENCODER_CLASSES:
        raise ValueError(f"unknown visual encoder {kind!r}; expected one of {VISUAL_ENCODERS}")
    channels, height, width = shape
    if min(height, width) < MIN_RESOLUTION[kind]:
        raise ValueError(f"visual observation {width}x{height} is too small for encoder {kind!r} "
                         f"(minimum side {MIN_RESOLUTION[kind]})")
    return VISUAL_ENCODER_CLASSES[kind](height, width, channels, output_size)
