"""Building blocks of ML-Agents' actors (mlagents/trainers/torch_entities/layers.py), for inference.

Module and attribute names follow ML-Agents' own, so that a weight's key here reads like its key
in an ML-Agents checkpoint (`seq_layers.0.weight`, `lstm.lstm.weight_ih_l0`, ...).
"""

from __future__ import annotations

import torch
from torch import nn


class Swish(nn.Module):
    """`x * sigmoid(x)` (SiLU)."""

    def forward(self, data: torch.Tensor) -> torch.Tensor:
        """Apply `x * sigmoid(x)`.

        Args:
            data: any tensor.

        Returns:
            A tensor of the same shape.
        """
        return data * torch.sigmoid(data)


class LayerNorm(nn.Module):
    """Layer normalization without gain or bias: `(x - mean) / sqrt(var + 1e-5)` over the last
    dimension, as ML-Agents' attention uses it."""

    def forward(self, layer_activations: torch.Tensor) -> torch.Tensor:
        """Normalize over the last dimension.

        Args:
            layer_activations: any tensor.

        Returns:
            A tensor of the same shape.
        """
        mean = torch.mean(layer_activations, dim=-1, keepdim=True)
        var = torch.mean((layer_activations - mean) ** 2, dim=-1, keepdim=True)
        return (layer_activations - mean) / torch.sqrt(var + 1e-5)


class LinearEncoder(nn.Module):
    """`num_layers` x (Linear -> Swish), all `hidden_size` wide: `seq_layers.{0,2,4,...}`.

    Args:
        input_size: width of the input.
        num_layers: Linear layers.
        hidden_size: width of every layer's output.
    """

    def __init__(self, input_size: int, num_layers: int, hidden_size: int) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for index in range(num_layers):
            layers += [nn.Linear(input_size if index == 0 else hidden_size, hidden_size), Swish()]
        self.seq_layers = nn.Sequential(*layers)

    def forward(self, input_tensor: torch.Tensor) -> torch.Tensor:
        """Run the layers.

        Args:
            input_tensor: (..., input_size).

        Returns:
            (..., hidden_size).
        """
        encoding: torch.Tensor = self.seq_layers(input_tensor)
        return encoding


class LSTM(nn.Module):
    """One LSTM step. Memory (N, memory_size) is [h, c] side by side, each memory_size / 2 wide,
    as ML-Agents' `recurrent_in`/`recurrent_out` carry it; the output is h (N, memory_size / 2).

    Args:
        input_size: width of the input.
        memory_size: width of the memory, h and c together.

    Raises:
        ValueError: `memory_size` is odd.
    """

    def __init__(self, input_size: int, memory_size: int) -> None:
        super().__init__()
        if memory_size % 2:
            raise ValueError(f"LSTM memory_size must be even (h and c halves), got {memory_size}")
        self.hidden_size = memory_size // 2
        self.lstm = nn.LSTM(input_size, self.hidden_size, 1, batch_first=True)

    def forward(self, input_tensor: torch.Tensor, memories: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """One step.

        Args:
            input_tensor: (N, input_size).
            memories: (N, memory_size), [h, c].

        Returns:
            The output h (N, memory_size / 2) and the new memory (N, memory_size), [h, c].
        """
        # (N, in) and (N, m) -> (N, m/2) and (N, m)
        h0 = memories[:, : self.hidden_size].unsqueeze(0).contiguous()  # (1, N, m/2)
        c0 = memories[:, self.hidden_size :].unsqueeze(0).contiguous()
        output, (h1, c1) = self.lstm(input_tensor.unsqueeze(1), (h0, c0))
        return output[:, 0], torch.cat([h1[0], c1[0]], dim=-1)
