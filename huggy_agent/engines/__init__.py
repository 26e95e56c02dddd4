"""How a built network is run: `torch` (eager, the reference), `onnxruntime` (CPU), `native`
(CPU, MLP policies), `cuda-graph`, `npu-graph`, and `auto`, which picks one of them by a fixed
rule (`auto_engine`).

An engine knows nothing of the network's shape, only "float32 inputs of these feature shapes in,
a tuple of outputs out" (see `base`), except `native`, which freezes an MLP policy's layers into
compiled kernels. Heavy imports (onnxruntime, torch.onnx) happen in the engine that needs them.

Graph engines check every graph they capture against eager torch; one that fails its check or
raises in capture or replay raises `EngineFailure`, and the agent runs `torch` from then on.
"""

from __future__ import annotations

import torch
from torch import nn

from huggy_agent.actor import mlp_policy
from huggy_agent.engines.base import ActionHead, Engine, EngineFailure, InputShapes
from huggy_agent.engines.graphs import CudaGraphEngine, NpuGraphEngine, device_graphs
from huggy_agent.engines.native import NATIVE_ROWS, NativeEngine
from huggy_agent.engines.onnx_runtime import OnnxRuntimeEngine, onnxruntime_available
from huggy_agent.engines.torch_eager import TorchEngine
from huggy_agent.native import mlp_kernels

ENGINES: dict[str, type[Engine]] = {
    "torch": TorchEngine,
    "onnxruntime": OnnxRuntimeEngine,
    "native": NativeEngine,
    "cuda-graph": CudaGraphEngine,
    "npu-graph": NpuGraphEngine,
}
ENGINE_NAMES = ("auto", *ENGINES)
GRAPH_ENGINES: dict[str, type[CudaGraphEngine] | type[NpuGraphEngine]] = {
    "cuda-graph": CudaGraphEngine,
    "npu-graph": NpuGraphEngine,
}


def auto_choice(device_type: str, precision: str, *, onnxruntime: bool, graphs: bool,
                native: bool = False) -> tuple[str, str]:
    """The engine `auto` picks on a device kind and precision, by a fixed rule, never a timing.

    - cpu: `native` for fp32 where `native` says so (an MLP policy, and the compiled kernels
      run here with AVX2: `native_fits`); else `onnxruntime` for fp32 where it is installed;
      else `torch` (onnxruntime's CPU kernels are not used for fp16/bf16 layers);
    - cuda, npu: the device's graph engine where its torch module offers graph capture
      (`graphs`), else `torch`.

    The same engine serves every batch size on a device (`native` hands batches over
    `NATIVE_ROWS` rows to onnxruntime, or torch); the measurements behind the rule are in
    docs/benchmarks.md ("The policy").

    Args:
        device_type: `cpu`, `cuda` or `npu`.
        precision: `fp32`, `fp16` or `bf16`.
        onnxruntime: whether onnxruntime is installed.
        graphs: whether the device's torch module offers graph capture.
        native: whether `native_fits` the network.

    Returns:
        (engine, why it was picked).
    """
    if device_type == "cpu":
        if precision != "fp32":
            return "torch", f"auto: torch for {precision} layers on the CPU (onnxruntime runs fp32)"
        if native:
            batches = "onnxruntime" if onnxruntime else "torch"
            return "native", ("auto: native for an MLP policy on a CPU with AVX2 (compiled "
                              f"kernels for {NATIVE_ROWS} observation, {batches} for larger "
                              "batches)")
        if onnxruntime:
            return "onnxruntime", "auto: onnxruntime for fp32 on the CPU"
        return "torch", "auto: torch on the CPU (onnxruntime is not installed)"
    if device_type in ("cuda", "npu") and graphs:
        return (f"{device_type}-graph", f"auto: {device_type}-graph on {device_type}, each "
                "captured batch size checked against eager torch")
    return "torch", f"auto: torch on {device_type} (its torch module offers no graph capture)"


def native_fits(net: nn.Module | None) -> bool:
    """Whether `auto` runs a network on the CPU with `native`.

    Args:
        net: the network, or None.

    Returns:
        True for an MLP policy where the compiled kernels run with AVX2 (their `generic` kernel,
            for other CPUs, is slower than onnxruntime; it runs when asked for by name).
    """
    if net is None or "avx2" not in mlp_kernels():
        return False
    try:
        mlp_policy(net)
    except ValueError:
        return False
    return True


def auto_engine(device_type: str, precision: str, *, onnxruntime: bool, graphs: bool,
                native: bool = False) -> str:
    """The engine of `auto_choice`.

    Args:
        device_type: see `auto_choice`.
        precision: see `auto_choice`.
        onnxruntime: see `auto_choice`.
        graphs: see `auto_choice`.
        native: see `auto_choice`.

    Returns:
        The engine's name.
    """
    return auto_choice(device_type, precision, onnxruntime=onnxruntime, graphs=graphs,
                       native=native)[0]


def resolve_engine(name: str, device: torch.device, precision: str, net: nn.Module | None = None
                   ) -> str:
    """An engine name as a concrete engine for a device and precision.

    Args:
        name: an engine name or `auto`.
        device: where it runs.
        precision: the layers' precision.
        net: the network, for `auto` (never `native` without one).

    Returns:
        The concrete engine's name.

    Raises:
        ValueError: an unknown name, or an engine that cannot run there (naming what it needs).
    """
    return choose_engine(name, device, precision, net)[0]


def choose_engine(name: str, device: torch.device, precision: str, net: nn.Module | None = None
                  ) -> tuple[str, str]:
    """An engine name as a concrete engine, and why it runs.

    Args:
        name: an engine name or `auto`.
        device: where it runs.
        precision: the layers' precision.
        net: the network, for `auto` (never `native` without one).

    Returns:
        (the concrete engine, why).

    Raises:
        ValueError: an unknown name, or an engine that cannot run there (naming what it needs).
    """
    if name not in ENGINE_NAMES:
        raise ValueError(f"unknown engine {name!r}; expected one of {', '.join(ENGINE_NAMES)}")
    cpu = device.type == "cpu"
    if name == "auto":
        return auto_choice(device.type, precision, onnxruntime=cpu and onnxruntime_available(),
                           graphs=not cpu and device_graphs(device) is not None,
                           native=cpu and native_fits(net))
    if name in ("onnxruntime", "native") and (not cpu or precision != "fp32"):
        raise ValueError(f"the {name} engine runs fp32 on the CPU, not {precision} on "
                         f"{device}; use engine='torch' or 'auto'")
    if name == "onnxruntime" and not onnxruntime_available():
        raise ValueError("the onnxruntime engine needs onnxruntime: pip install "
                         "'huggy-agent[onnx]'")
    if name == "native" and not mlp_kernels():
        raise ValueError("the native engine needs the package's compiled kernels, which were "
                         "not built (no C compiler at install); use engine='auto'")
    graph_device = {"cuda-graph": "cuda", "npu-graph": "npu"}.get(name)
    if graph_device is not None and (device.type != graph_device or device_graphs(device) is None):
        raise ValueError(f"the {name} engine needs a {graph_device} device with graph capture, "
                         f"not {device}; use engine='torch' or 'auto'")
    checked = ", each captured batch size checked against eager torch" if graph_device else ""
    return name, f"{name}, as asked{checked}"


def create_engine(name: str, net: nn.Module, input_shapes: InputShapes, device: torch.device,
                  precision: str, head: ActionHead) -> Engine:
    """An engine running a network.

    Args:
        name: an engine name or `auto` (resolved by `resolve_engine`).
        net: the network.
        input_shapes: the feature shape of each input.
        device: where it runs.
        precision: the layers' precision; graph engines check their graphs within its tolerance.
        head: the agent's action head.

    Returns:
        The engine.

    Raises:
        ValueError: as `resolve_engine` raises, or the engine refuses the network (such as `native`
            for a network that is not an MLP policy).
    """
    resolved = resolve_engine(name, device, precision, net)
    if resolved in GRAPH_ENGINES:
        return GRAPH_ENGINES[resolved](net, input_shapes, device, head, precision=precision)
    return ENGINES[resolved](net, input_shapes, device, head)


__all__ = ["ENGINES", "ENGINE_NAMES", "ActionHead", "Engine", "EngineFailure", "InputShapes",
           "NativeEngine", "TorchEngine", "auto_choice", "auto_engine", "choose_engine",
           "create_engine", "native_fits", "resolve_engine"]
