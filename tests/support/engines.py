"""What the engine tests share: the engine `auto` picks for an MLP policy on this CPU, and host
noise bits recorded once (the same on every machine, by construction)."""

from __future__ import annotations

from huggy_agent.native import mlp_kernels

AUTO_CPU = "native" if "avx2" in mlp_kernels() else "onnxruntime"
"""What `auto` runs an MLP policy with on this CPU (see `native_fits`)."""

RECORDED_NOISE_BITS = {
    (0, 0): [1046829706, 3206148323, 1069272552, 3212937285],
    (2**64 - 1, 10**12): [3220899446, 1057677471, 1045981931, 1051926344],
}
