"""Device and precision resolution: NPU (torch-npu) > CUDA > CPU, with a guarded torch-npu import.

torch-npu installed without Ascend's CANN toolkit breaks `import torch`, and importing it fails in
several ways, so detection treats ImportError, RuntimeError and OSError alike as "no NPU".
"""

from __future__ import annotations

import functools

import torch

PRECISIONS: dict[str, torch.dtype] = {"fp32": torch.float32, "fp16": torch.float16,
                                      "bf16": torch.bfloat16}
DEVICE_KINDS = ("auto", "cpu", "cuda", "npu")


@functools.cache
def npu_available() -> bool:
    """Whether torch-npu imports and reports at least one NPU (checked once per process).

    Returns:
        True when an NPU is usable; False when torch-npu is missing, fails to import, or finds none.
    """
    try:
        import torch_npu  # noqa: F401
    except (ImportError, RuntimeError, OSError):
        return False
    return bool(torch.npu.is_available())  # type: ignore[attr-defined]


def available_devices() -> list[str]:
    """The kinds of device usable in this process, best first.

    Returns:
        A sublist of `["npu", "cuda", "cpu"]`, always ending with `cpu`.
    """
    kinds = []
    if npu_available():
        kinds.append("npu")
    if torch.cuda.is_available():
        kinds.append("cuda")
    return [*kinds, "cpu"]


def resolve_device(spec: str | torch.device = "auto") -> torch.device:
    """The device a spelling names, checked to be present here.

    Args:
        spec: `auto` (the best available device: NPU, then CUDA, then CPU), `cpu`, `cuda[:N]` or
            `npu[:N]`, or a `torch.device`.

    Returns:
        The device; `cuda` and `npu` without an index mean index 0.

    Raises:
        ValueError: an unknown spelling.
        RuntimeError: the device is not here (no usable NPU, no CUDA, or no CUDA device `N`).
    """
    if isinstance(spec, torch.device):
        spec = str(spec)
    kind, _, index = spec.partition(":")
    if kind not in DEVICE_KINDS or (index and not index.isdigit()):
        raise ValueError(f"unknown device {spec!r}; expected one of auto, cpu, cuda[:N], npu[:N]")
    if kind == "auto":
        kind = available_devices()[0]
    if kind == "npu" and not npu_available():
        raise RuntimeError(f"device {spec!r} requested but no NPU is usable here (torch-npu is not "
                           "installed, or it found no Ascend NPU); available: "
                           f"{', '.join(available_devices())}")
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError(f"device {spec!r} requested but CUDA is not available; available: "
                               f"{', '.join(available_devices())}")
        if index and int(index) >= torch.cuda.device_count():
            raise RuntimeError(f"device {spec!r} requested but only {torch.cuda.device_count()} "
                               "CUDA device(s) exist")
    return torch.device(f"{kind}:{index}" if index else (kind if kind == "cpu" else f"{kind}:0"))


def resolve_precision(name: str) -> torch.dtype:
    """The torch dtype of the policy's layers for a precision name.

    Args:
        name: `fp32`, `fp16` or `bf16`.

    Returns:
        `torch.float32`, `torch.float16` or `torch.bfloat16`.

    Raises:
        ValueError: any other name.
    """
    if name not in PRECISIONS:
        raise ValueError(f"unknown precision {name!r}; expected one of {', '.join(PRECISIONS)}")
    return PRECISIONS[name]
