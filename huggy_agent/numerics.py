"""The numerical contract: what is exact by construction, and the tolerance of everything else.

Exact by construction (equal bits on every machine, device, batch split and engine):
- the noise of (seed, row) (`huggy_agent.noise`: integer hashing and float64 `+ - * /` only);
- the weights fingerprint of a run, from its `.pt` or its `.onnx` (`agent.weights_fingerprint`:
  stored tensors bit for bit, the derived normalizer std at 8 significant bits).

Within `FP32_ACTION_ATOL` (float32 layers): deterministic and seeded stochastic actions across
batch splits, thread counts, CPU code paths, CPUs, devices, engines, and serving vs in-process.
BLAS libraries pick kernels by CPU model, thread count and matrix shape, and promise no
bit-identical rows across them. The bound is several times the worst difference that
`bench/numerics_matrix.py` has measured (docs/policy.md, "Numbers you can trust").

It holds for observations on the scale the policy was trained on. A policy without a normalizer
fed observations far off that scale moves further (its hidden activations grow with the input,
and so does their rounding); `fp32_action_tolerance` scales the bound for such input.
"""

from __future__ import annotations

import numpy as np

FP32_ACTION_ATOL = 1e-5
"""Max abs difference of fp32 actions (in [-1, 1]) between any two correct paths."""

PRECISION_ACTION_ATOL = {"fp32": FP32_ACTION_ATOL, "fp16": 5e-3, "bf16": 5e-2}
"""Max abs difference of actions from float64 for layers in each precision (`huggy precision`).
Each bound is more than twice the worst error measured (docs/benchmarks.md, "Precision"), so it
also bounds two paths of one precision against each other."""

TRAINING_SCALE = 100.0
"""Observations up to this magnitude (normalized ones are clipped to 5) count as on scale."""


def fp32_action_tolerance(obs: np.ndarray, normalized: bool) -> float:
    """The contract's tolerance for fp32 actions computed from `obs`.

    Args:
        obs: the observations.
        normalized: whether the policy normalizes its observations.

    Returns:
        `FP32_ACTION_ATOL`; for a policy without a normalizer, scaled up in proportion to
            `max |obs| / TRAINING_SCALE` where that exceeds 1.
    """
    if normalized:
        return FP32_ACTION_ATOL
    scale = float(np.max(np.abs(obs))) / TRAINING_SCALE if np.size(obs) else 0.0
    return FP32_ACTION_ATOL * max(1.0, scale)
