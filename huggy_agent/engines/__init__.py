"""How a built network is run: `torch` (eager, the reference), `onnxruntime` (CPU), `cuda-graph`,
`npu-graph`, and `auto`, which picks one of them by a fixed rule (`auto_engine`).

An engine knows nothing of the network's shape, only "float32 inputs of these feature shapes in,
a tuple of outputs out" (see `base`). Heavy imports (onnxruntime, torch.onnx) happen in the engine
that needs them.
"""

from __future__ import annotations

import torch
from torch import nn

from huggy_agent.engines.base import ActionHead, Engine, InputShapes
from huggy_agent.engines.graphs import CudaGraphEngine, NpuGraphEngine, device_graphs
from huggy_agent.engines.onnx_runtime import OnnxRuntimeEngine, onnxruntime_available
from huggy_agent.engines.torch_eager import TorchEngine

ENGINES: dict[str, type[Engine]] = {
    "torch": TorchEngine,
    "onnxruntime": OnnxRuntimeEngine,
    "cuda-graph": CudaGraphEngine,
    "npu-graph": NpuGraphEngine,
}
ENGINE_NAMES = ("auto", *ENGINES)


def auto_engine(device_type: str, precision: str, *, onnxruntime: bool, graphs: bool) -> str:
    """The engine `auto` runs for a device kind and precision; a fixed rule, never a timing.

    - cpu: `onnxruntime` for fp32 where it is installed, else `torch` (onnxruntime's CPU kernels
      are not used for fp16/bf16 layers);
    - cuda, npu: the device's graph engine where its torch module offers graph capture
      (`graphs`), else `torch`.

    The same engine serves every batch size on a device; the measurements behind the rule are
    in the README ("Engines").
    """
    if device_type == "cpu":
        return "onnxruntime" if onnxruntime and precision == "fp32" else "torch"
    if device_type in ("cuda", "npu") and graphs:
        return f"{device_type}-graph"
    return "torch"


def resolve_engine(name: str, device: torch.device, precision: str) -> str:
    """`name` as a concrete engine for `device` and `precision` (`auto` resolved).

    Raises ValueError for an unknown name and for an engine that cannot run there.
    """
    if name not in ENGINE_NAMES:
        raise ValueError(f"unknown engine {name!r}; expected one of {', '.join(ENGINE_NAMES)}")
    if name == "auto":
        return auto_engine(device.type, precision,
                           onnxruntime=device.type == "cpu" and onnxruntime_available(),
                           graphs=device.type != "cpu" and device_graphs(device) is not None)
    if name == "onnxruntime":
        if device.type != "cpu" or precision != "fp32":
            raise ValueError(f"the onnxruntime engine runs fp32 on the CPU, not {precision} on "
                             f"{device}; use engine='torch' or 'auto'")
        if not onnxruntime_available():
            raise ValueError("the onnxruntime engine needs onnxruntime: pip install "
                             "'huggy-agent[onnx]'")
    graph_device = {"cuda-graph": "cuda", "npu-graph": "npu"}.get(name)
    if graph_device is not None and (device.type != graph_device or device_graphs(device) is None):
        raise ValueError(f"the {name} engine needs a {graph_device} device with graph capture, "
                         f"not {device}; use engine='torch' or 'auto'")
    return name


def create_engine(name: str, net: nn.Module, input_shapes: InputShapes, device: torch.device,
                  precision: str, head: ActionHead) -> Engine:
    """The engine `name` (`auto` resolved by `resolve_engine`) running `net` on `device`."""
    return ENGINES[resolve_engine(name, device, precision)](net, input_shapes, device, head)


__all__ = ["ENGINES", "ENGINE_NAMES", "ActionHead", "Engine", "InputShapes", "auto_engine",
           "create_engine", "resolve_engine"]
