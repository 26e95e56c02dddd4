"""`onnxruntime`: an ONNX export of the loaded network (its raw outputs only: for a policy, mu and
log-sigma) run by onnxruntime on the CPU; the head and the host noise stay in the agent.

At one observation a large share of `InferenceSession.run`'s time goes to per-call work (name
checks, dictionaries, output allocation), so each batch size keeps an IO binding whose input and
output buffers are bound once: a call copies its rows in and runs.
"""

from __future__ import annotations

import io
import threading
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from huggy_agent.engines.base import (
    ActionHead,
    Engine,
    InputShapes,
    chunk_bounds,
    per_row_flags,
)

OPSET = 17
PROBE_ROWS = 3
"""Rows of the probe batch that tells per-row outputs (PROBE_ROWS rows) from shared ones (1)."""
CHUNK_ROWS = 1024
"""Larger batches run in chunks of this many rows (activations stay in the CPU's cache)."""
CACHED_BINDINGS = 32
"""IO bindings kept, one per batch size, the oldest dropped first."""


def onnxruntime_available() -> bool:
    """Whether onnxruntime imports (it is the optional `onnx` extra).

    Returns:
        True when it imports.
    """
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        return False
    return True


@dataclass(frozen=True)
class ExportedNetwork:
    """An ONNX model of a network: inputs `input_<i>`, outputs `output_<j>`, and for each output
    whether it is per-row, its row (or whole, if shared) shape and its numpy dtype."""

    model: bytes
    per_row: tuple[bool, ...]
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[np.dtype, ...]


def export_network(net: nn.Module, input_shapes: InputShapes) -> ExportedNetwork:
    """Trace a network into ONNX with a dynamic batch dimension on every input and per-row output.

    Args:
        net: a float32 network on the CPU.
        input_shapes: the feature shape of each input.

    Returns:
        The model, and for each output whether it is per-row, its shape and its dtype.

    Raises:
        ValueError: `net` is not float32 on the CPU.
    """
    params = [*net.parameters(), *net.buffers()]
    if any(p.device.type != "cpu" or (p.is_floating_point() and p.dtype != torch.float32)
           for p in params):
        raise ValueError("the onnxruntime engine runs float32 networks on the CPU; this one has "
                         f"{sorted({f'{p.dtype} on {p.device}' for p in params})}")
    probe = tuple(torch.zeros(PROBE_ROWS, *shape) for shape in input_shapes)
    with torch.inference_mode():
        outputs = net(*probe)
    per_row = per_row_flags(outputs, PROBE_ROWS)
    input_names = [f"input_{i}" for i in range(len(input_shapes))]
    output_names = [f"output_{j}" for j in range(len(outputs))]
    batch = {0: "batch"}
    dynamic = {name: batch for name in input_names}
    dynamic.update({name: batch for name, row in zip(output_names, per_row, strict=True)
                    if row})
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
        torch.onnx.export(net, probe, buffer,  # type: ignore[arg-type]  # a file object works
                          input_names=input_names, output_names=output_names,
                          dynamic_axes=dynamic, opset_version=OPSET, dynamo=False)
    shapes = tuple(tuple(o.shape[1:]) if row else tuple(o.shape)
                   for o, row in zip(outputs, per_row, strict=True))
    dtypes = tuple(np.dtype(str(o.dtype).removeprefix("torch.")) for o in outputs)
    return ExportedNetwork(buffer.getvalue(), per_row, shapes, dtypes)


class _Binding:
    """An IO binding for one batch size: input and output buffers bound once."""

    def __init__(self, session: object, exported: ExportedNetwork, input_shapes: InputShapes,
                 rows: int) -> None:
        import onnxruntime as ort

        self.io = session.io_binding()  # type: ignore[attr-defined]
        self.inputs = [np.zeros((rows, *shape), dtype=np.float32) for shape in input_shapes]
        for index, array in enumerate(self.inputs):
            self.io.bind_ortvalue_input(f"input_{index}", ort.OrtValue.ortvalue_from_numpy(array))
        self.outputs = tuple(
            np.empty((rows, *shape) if row else shape, dtype=dtype) for row, shape, dtype
            in zip(exported.per_row, exported.shapes, exported.dtypes, strict=True))
        for index, array in enumerate(self.outputs):
            self.io.bind_output(f"output_{index}", "cpu", 0, array.dtype, list(array.shape),
                                array.ctypes.data)


class OnnxRuntimeEngine(Engine):
    """onnxruntime's CPU execution provider, sequential execution, all graph optimizations.

    Args:
        net: a float32 network on the CPU.
        input_shapes: the feature shape of each input.
        device: the CPU.
        head: the agent's action head.
        threads: intra-op threads; None: torch's thread count when the engine is made.

    Raises:
        ValueError: `device` is not the CPU, or `net` is not float32 on the CPU.
    """

    name = "onnxruntime"

    def __init__(self, net: nn.Module, input_shapes: InputShapes, device: torch.device,
                 head: ActionHead, threads: int | None = None) -> None:
        if device.type != "cpu":
            raise ValueError(f"the onnxruntime engine runs on the CPU, not on {device}")
        super().__init__(net, input_shapes, device, head)
        import onnxruntime as ort

        self.exported = export_network(net, input_shapes)
        self.threads = threads or torch.get_num_threads()
        options = ort.SessionOptions()
        options.intra_op_num_threads = self.threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.log_severity_level = 3
        self.session = ort.InferenceSession(self.exported.model, options,
                                            providers=["CPUExecutionProvider"])
        self._bindings: dict[int, _Binding] = {}
        self._lock = threading.Lock()

    def _new_binding(self, rows: int) -> _Binding:
        if len(self._bindings) == CACHED_BINDINGS:
            del self._bindings[next(iter(self._bindings))]
        binding = self._bindings[rows] = _Binding(self.session, self.exported, self.input_shapes,
                                                  rows)
        return binding

    def _run(self, inputs: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
        """`inputs` through the session; the arrays returned are the binding's own buffers, valid
        until the next run (call with the lock held)."""
        rows = len(inputs[0])
        binding = self._bindings.get(rows) or self._new_binding(rows)
        for buffer, array in zip(binding.inputs, inputs, strict=True):
            buffer[...] = array  # (np.copyto would go through __array_function__ dispatch)
        self.session.run_with_iobinding(binding.io)
        return binding.outputs

    def _numpy_outputs(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        parts = []
        with self._lock:
            for start, stop in chunk_bounds(len(inputs[0]), CHUNK_ROWS):
                outputs = self._run([array[start:stop] for array in inputs])
                parts.append([output.copy() for output in outputs])
        if len(parts) == 1:
            return parts[0]
        return [np.concatenate([part[index] for part in parts]) if row else parts[0][index]
                for index, row in enumerate(self.exported.per_row)]

    def forward(self, inputs: Sequence[np.ndarray]) -> tuple[torch.Tensor, ...]:
        """The network's outputs for a batch (see `Engine.forward`), in chunks of `CHUNK_ROWS` rows.

        Args:
            inputs: one (N, *feature_shape) float32 array per input.

        Returns:
            The outputs as CPU tensors that own their memory.
        """
        return tuple(torch.from_numpy(output) for output in self._numpy_outputs(inputs))

    def act(self, inputs: Sequence[np.ndarray], noise: np.ndarray | None) -> np.ndarray:
        """The actions for a batch (see `Engine.act`), the head run on each chunk's outputs in place.

        Args:
            inputs: one (N, *feature_shape) float32 array per input.
            noise: host noise for every row, or None for deterministic actions.

        Returns:
            (N, *action) float32 actions.
        """
        rows = len(inputs[0])
        with self._lock:  # the head reads the binding's buffers and returns new arrays
            if rows <= CHUNK_ROWS:
                return self.head.numpy(self._run(inputs), noise)
            return np.concatenate([
                self.head.numpy(self._run([array[start:stop] for array in inputs]),
                                None if noise is None else noise[start:stop])
                for start, stop in chunk_bounds(rows, CHUNK_ROWS)])

    def describe(self) -> str:
        """The engine and how it runs, in one line.

        Returns:
            onnxruntime's version, the thread count and the chunk size.
        """
        return (f"onnxruntime {self._version()} CPU, {self.threads} thread(s), chunks of "
                f"{CHUNK_ROWS} rows")

    @staticmethod
    def _version() -> str:
        import onnxruntime as ort

        return str(ort.__version__)
