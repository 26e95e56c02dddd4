"""The numerical contract: what is exact by construction, and the tolerance of everything else.

Exact by construction (equal bits on every machine, device, batch split and engine):
- the noise of (seed, row) (`huggy_agent.noise`: integer hashing and float64 `+ - * /` only);
- the weights fingerprint of a run, from its `.pt` or its `.onnx` (`agent.weights_fingerprint`:
  stored tensors bit for bit, the derived normalizer std at 8 significant bits).

Within `FP32_ACTION_ATOL` (float32 layers): deterministic and seeded stochastic actions across
batch splits, thread counts, CPU code paths, CPUs, devices, engines, and serving vs in-process.
BLAS libraries pick kernels by CPU model, thread count and matrix shape, and promise no
bit-identical rows across them.

How the tolerance was derived (`bench/numerics_matrix.py`): three Huggy runs, each from its `.pt`
and its `.onnx`, 1,025 observations from the normalizer's statistics plus 64 scaled by 1e3, as
one batch, row by row, 1,024 + 1 and 17-row pieces, under the default kernels,
`OMP_NUM_THREADS=1`, `ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2` and
`ATEN_CPU_CAPABILITY=default`. On a 2-core AMD EPYC (AVX2) the worst fp32 action was 1.3e-6 from
float64 and two paths differed by at most 1.8e-6; elsewhere 1.07e-6 was seen between serving and
in-process (Zen 4, AVX-512) and 9.2e-7 between CPU and an H200. 1e-5 is 5.5x the worst.

It holds for observations on the scale the policy was trained on. A policy without a normalizer
fed observations 1,000 times that scale moved by up to 4.7e-5 (its hidden activations grow with
the input, and so does their rounding); `fp32_action_tolerance` scales the bound for such input.
"""

from __future__ import annotations

import numpy as np

FP32_ACTION_ATOL = 1e-5
"""Max abs difference of fp32 actions (in [-1, 1]) between any two correct paths."""

PRECISION_ACTION_ATOL = {"fp32": FP32_ACTION_ATOL, "fp16": 5e-3, "bf16": 5e-2}
"""Max abs difference of actions from float64 for layers in each precision (`huggy precision`).
Each bound is more than twice the worst error measured (`huggy precision`'s output, in docs/benchmarks.md),
so it also bounds two paths of one precision against each other."""

TRAINING_SCALE = 100.0
"""Observations up to this magnitude (normalized ones are clipped to 5) count as on scale."""


def fp32_action_tolerance(obs: np.ndarray, normalized: bool) -> float:
    """The contract's tolerance for actions computed from `obs`: `FP32_ACTION_ATOL`, scaled up
    in proportion to `max |obs| / TRAINING_SCALE` for a policy without a normalizer."""
    if normalized:
        return FP32_ACTION_ATOL
    scale = float(np.max(np.abs(obs))) / TRAINING_SCALE if np.size(obs) else 0.0
    return FP32_ACTION_ATOL * max(1.0, scale)
