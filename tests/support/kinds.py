"""Inputs, masks and the onnxruntime reference for policies of every kind (shared by the tests
of policy kinds and of the ONNX export)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort

from huggy_agent_client.spec import ActorSpec


def random_inputs(spec: ActorSpec, rows: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Vectors N(0, 2^2), images U[0, 1), variable-length inputs with a random number of
    non-zero entities then zero padding (as the fixtures' own verification draws them)."""
    arrays = []
    for observation in spec.inputs:
        shape = (rows, *observation.shape)
        if observation.kind == "vector":
            arrays.append((2 * rng.standard_normal(shape)).astype(np.float32))
        elif observation.kind == "visual":
            arrays.append(rng.random(shape, dtype=np.float32))
        else:
            values = rng.standard_normal(shape).astype(np.float32)
            present = rng.integers(0, observation.shape[0] + 1, rows)
            values[np.arange(observation.shape[0])[None, :] >= present[:, None]] = 0.0
            arrays.append(values)
    return arrays


def random_masks(spec: ActorSpec, rows: int, rng: np.random.Generator) -> np.ndarray:
    """(rows, sum of branches) bool, True = allowed: each action with probability 0.7, and at
    least one per branch."""
    mask = rng.random((rows, spec.mask_size)) < 0.7
    start = 0
    for size in spec.discrete_branches:
        mask[np.arange(rows), start + rng.integers(0, size, rows)] = True
        start += size
    return mask


def onnx_feed(session: ort.InferenceSession, inputs: list[np.ndarray], mask: np.ndarray | None,
              memory: np.ndarray | None) -> dict[str, np.ndarray]:
    feed = {f"obs_{i}": array for i, array in enumerate(inputs)}
    names = {i.name for i in session.get_inputs()}
    if "action_masks" in names:
        feed["action_masks"] = (np.ones((len(inputs[0]), session.get_inputs()[-1].shape[-1]))
                                if mask is None else mask).astype(np.float32)
    if "recurrent_in" in names:
        feed["recurrent_in"] = memory[:, None, :]
    return feed


def run_onnx(session: ort.InferenceSession, inputs: list[np.ndarray], mask: np.ndarray | None,
             memory: np.ndarray | None) -> dict[str, np.ndarray]:
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, onnx_feed(session, inputs, mask, memory)),
                    strict=True))
