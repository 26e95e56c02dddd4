"""References for checking a policy: canonical inputs, and its outputs computed in float64.

The float64 forward pass is the actor itself, moved to float64 on the CPU (normalizers included):
the same operations with about 29 more bits each, which is what a precision report measures
against. Independent references (onnxruntime on the ML-Agents file, recorded values) are the
tests' business.
"""

from __future__ import annotations

import numpy as np
import torch

from huggy_agent.formats import LoadedPolicy
from huggy_agent.heads import ContinuousHead


def canonical_inputs(loaded: LoadedPolicy, count: int = 256, seed: int = 0) -> list[np.ndarray]:
    """Reproducible float32 rows of every observation input of a policy.

    Vectors are drawn from their normalizer's statistics (mean + std * N(0, 1); N(0, 1) without
    one), images from U[0, 1), variable-length inputs as a random number of N(0, 1) entities then
    zero padding. Row 0 of each vector input is all zeros.

    Args:
        loaded: the policy.
        count: rows per input.
        seed: seeds the draws.

    Returns:
        One float32 (count, *shape) array per input, in `obs_i` order.
    """
    rng = np.random.default_rng(seed)
    arrays = []
    for index, arch in enumerate(loaded.arch.inputs):
        observation = arch.input
        shape = (count, *observation.shape)
        if observation.kind == "visual":
            arrays.append(rng.random(shape, dtype=np.float32))
            continue
        values = rng.standard_normal(shape)
        if observation.kind == "variable":
            present = rng.integers(0, observation.shape[0] + 1, count)
            values[np.arange(observation.shape[0])[None, :] >= present[:, None]] = 0.0
        elif arch.normalize:
            prefix = f"network_body.observation_encoder.processors.{index}.normalizer."
            values = (loaded.tensors[prefix + "running_mean"].double().numpy()
                      + loaded.tensors[prefix + "std"].double().numpy() * values)
        if observation.kind == "vector":
            values[0] = 0.0
        arrays.append(values.astype(np.float32))
    return arrays


def canonical_observations(loaded: LoadedPolicy, count: int = 256, seed: int = 0) -> np.ndarray:
    """`canonical_inputs` of a single-input policy, as one array.

    Args:
        loaded: the policy.
        count: rows.
        seed: seeds the draws.

    Returns:
        A float32 (count, *shape) array.

    Raises:
        ValueError: the policy has several observation inputs.
    """
    (array,) = canonical_inputs(loaded, count, seed) if len(loaded.arch.inputs) == 1 else (None,)
    if array is None:
        raise ValueError(f"{loaded.origin}: the policy has {len(loaded.arch.inputs)} observation "
                         "inputs; use canonical_inputs")
    return array


def float64_outputs(loaded: LoadedPolicy, inputs: list[np.ndarray],
                    memory: np.ndarray | None = None) -> tuple[np.ndarray, ...]:
    """The actor's outputs computed in float64 on the CPU.

    Args:
        loaded: the policy.
        inputs: one array per observation input, in `obs_i` order.
        memory: (N, memory_size) for a recurrent policy; None means zeros.

    Returns:
        The outputs in `Actor.forward`'s order, only those the policy has: mu, log_sigma, the
            discrete logits, the new memory.
    """
    actor = loaded.build().double()
    tensors = [torch.from_numpy(np.asarray(a, np.float64)) for a in inputs]
    if loaded.arch.memory_size:
        rows = len(tensors[0])
        tensors.append(torch.zeros(rows, loaded.arch.memory_size, dtype=torch.float64)
                       if memory is None else torch.from_numpy(np.asarray(memory, np.float64)))
    with torch.inference_mode():
        return tuple(o.numpy() for o in actor(*tensors))


def float64_actions(loaded: LoadedPolicy, inputs: list[np.ndarray] | np.ndarray,
                    noise: np.ndarray | None = None) -> np.ndarray:
    """The continuous actions computed in float64 on the CPU.

    Args:
        loaded: a policy with continuous actions.
        inputs: one array per observation input, or one array for a single-input policy.
        noise: standard-normal noise (N, c) for stochastic actions; None for deterministic ones.

    Returns:
        The (N, c) float64 actions.
    """
    if isinstance(inputs, np.ndarray):
        inputs = [inputs]
    mu, log_sigma = float64_outputs(loaded, inputs)[:2]
    noise64 = None if noise is None else torch.from_numpy(noise.astype(np.float64))
    return ContinuousHead(loaded.arch.head).torch(
        (torch.from_numpy(mu), torch.from_numpy(log_sigma)), noise64).numpy()
