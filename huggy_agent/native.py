"""The package's compiled kernels (`huggy_agent/_native.c`), built at install where a C compiler
is found: the host noise (bit-identical to `huggy_agent.noise`'s numpy), the `native` engine's
single-observation MLP (with its row helper, a second core for one observation's pass), and the
reader of the HTTP API's common act body (`json_obs_row`, straight into a float32 row). Where
they were not built, `KERNELS` is None and numpy, onnxruntime, torch and orjson do the same work,
slower.
"""

from __future__ import annotations

import importlib
from types import ModuleType


def _load() -> ModuleType | None:
    """The compiled submodule `huggy_agent._native` (a file of its own, not the package's
    `__init__`), or None where it was not built."""
    try:
        return importlib.import_module("huggy_agent._native")
    except ImportError:  # installed without a C compiler
        return None


KERNELS = _load()
"""The compiled module, or None."""


def mlp_kernels() -> tuple[str, ...]:
    """The compiled MLP kernels this CPU runs.

    Returns:
        Fastest first: `avx2` (x86-64 with AVX2 and FMA) and `generic` (any CPU); empty where the
            kernels were not built.
    """
    return () if KERNELS is None else tuple(KERNELS.kernels())


def noise_kernels() -> tuple[str, ...]:
    """The compiled noise kernels this CPU runs.

    Returns:
        Fastest first: `avx2` (x86-64 with AVX2; the kernels use no fused multiply-add, so FMA is
            not needed) and `generic`; empty where the kernels were not built.
    """
    return () if KERNELS is None else tuple(KERNELS.noise_kernels())
