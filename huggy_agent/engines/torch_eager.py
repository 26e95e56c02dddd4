"""`torch`: the network in eager PyTorch on any device. The reference every other engine is
compared with."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from huggy_agent.engines.base import Engine, as_float32, chunk_bounds, merge_parts, per_row_flags

CPU_CHUNK_ROWS = 1024
"""On the CPU, larger batches run in chunks of this many rows."""


class TorchEngine(Engine):
    """Eager PyTorch. On the CPU, batches over `CPU_CHUNK_ROWS` run in chunks whose activations
    stay in the CPU's cache, which raises their throughput. Rows agree with an unchunked call within
    the numerical contract, not bit for bit."""

    name = "torch"

    def forward(self, inputs: Sequence[np.ndarray]) -> tuple[torch.Tensor, ...]:
        """The network's outputs for a batch (see `Engine.forward`).

        Args:
            inputs: one (N, *feature_shape) float32 array per input.

        Returns:
            The outputs as float32 tensors on the engine's device.
        """
        with torch.inference_mode():
            tensors = [torch.from_numpy(array).to(self.device) for array in inputs]
            rows = len(tensors[0])
            if self.device.type != "cpu" or rows <= CPU_CHUNK_ROWS:
                return as_float32(self.net(*tensors))
            parts = [as_float32(self.net(*(tensor[start:stop] for tensor in tensors)))
                     for start, stop in chunk_bounds(rows, CPU_CHUNK_ROWS)]
            return merge_parts(parts, per_row_flags(parts[0], CPU_CHUNK_ROWS))
