"""`cuda-graph` and `npu-graph`: the network, and for actions the head too, captured as device
graphs, one per batch-size rung, replayed with one host-to-device and one device-to-host copy.

Small batches on an accelerator are launch-bound: a replayed graph launches once where eager ops
launch every layer (docs/benchmarks.md, "The policy").

Every captured graph is checked against the same program run eagerly on the device, within the
precision's tolerance (`CHECK_ATOL`); a mismatch, or an error in capture or replay, raises
`EngineFailure`, and the agent runs `torch` instead. Capture is lazy (the first call that needs
a rung) or ahead of time (`HuggyAgent.warmup`), and each is timed and logged.

The graph API comes from the device's torch module: `torch.cuda.CUDAGraph` (torch 2.11 and 2.13
alike), `torch.npu.NPUGraph` from torch-npu. Everything device-specific sits behind
`GraphBackend`, so the bookkeeping here also runs on the CPU under a stand-in backend (tests).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Protocol, cast

import numpy as np
import torch
from torch import nn

from huggy_agent.engines.base import (
    ActionHead,
    Engine,
    EngineFailure,
    InputShapes,
    as_float32,
    merge_parts,
    per_row_flags,
)
from huggy_agent.numerics import PRECISION_ACTION_ATOL

logger = logging.getLogger(__name__)

DEFAULT_MAX_RUNG = 16384
"""The largest captured batch; larger batches are chunked."""
CAPTURE_WARMUP_RUNS = 2
"""Eager runs on a side stream before a capture (library handles, workspaces, allocator)."""
CHECK_ATOL = PRECISION_ACTION_ATOL
"""How far a graph's outputs may be from eager torch's on the probe batch, by precision: max abs
difference for actions; for raw network outputs (`forward`), relative to max(1, |eager|). A graph
and eager torch run the same layers in the same precision, so they agree within what any two
correct paths of that precision do."""
CHECK_SEED = 20261201
"""Seeds the probe batch (inputs and noise alike)."""
CHECK_PROBE_ROWS = 64
"""Distinct rows in the probe batch; a larger rung repeats them (every row is compared)."""
GRAPH_CLASSES = {"cuda": "CUDAGraph", "npu": "NPUGraph"}
GRAPH_MODULE_API = ("graph", "graph_pool_handle", "Stream", "stream", "current_stream", "Event",
                    "device")
"""What a device module (torch.cuda, torch.npu) must offer, beside its graph class."""


def rung_ladder(max_rung: int) -> tuple[int, ...]:
    """The captured batch sizes.

    Args:
        max_rung: the largest, a power of two.

    Returns:
        1, 2, 4, ... max_rung.

    Raises:
        ValueError: `max_rung` is not a power of two >= 1.
    """
    if max_rung < 1 or max_rung & (max_rung - 1):
        raise ValueError(f"max_rung must be a power of two >= 1, received {max_rung}")
    return tuple(1 << k for k in range(max_rung.bit_length()))


def rung_for(rows: int, max_rung: int) -> int:
    """The smallest rung that holds a batch.

    Args:
        rows: the batch's rows, 1 <= rows <= max_rung.
        max_rung: the largest rung.

    Returns:
        The power of two >= `rows`.

    Raises:
        ValueError: `rows` is outside [1, max_rung].
    """
    if not 1 <= rows <= max_rung:
        raise ValueError(f"rows must be in [1, {max_rung}], received {rows}")
    return 1 << (rows - 1).bit_length()


@dataclass(frozen=True)
class Chunk:
    """Rows start:stop of a call, replayed on the graph of `rung` rows."""

    start: int
    stop: int
    rung: int

    @property
    def rows(self) -> int:
        return self.stop - self.start


def chunk_plan(rows: int, max_rung: int) -> list[Chunk]:
    """Chunks covering a call's rows in order.

    Args:
        rows: the call's rows.
        max_rung: the largest rung.

    Returns:
        Full chunks of max_rung rows, then the remainder on its rung.
    """
    chunks = [Chunk(start, start + max_rung, max_rung)
              for start in range(0, rows - rows % max_rung, max_rung)]
    if rows % max_rung:
        start = rows - rows % max_rung
        chunks.append(Chunk(start, rows, rung_for(rows - start, max_rung)))
    return chunks


@dataclass(frozen=True)
class RowLayout:
    """Several per-row inputs packed side by side in one float32 row: input i occupies columns
    `spans[i]`, flattened."""

    shapes: tuple[tuple[int, ...], ...]
    spans: tuple[tuple[int, int], ...] = field(init=False)

    def __post_init__(self) -> None:
        spans, offset = [], 0
        for shape in self.shapes:
            spans.append((offset, offset + math.prod(shape)))
            offset += math.prod(shape)
        object.__setattr__(self, "spans", tuple(spans))

    @property
    def width(self) -> int:
        return self.spans[-1][1]

    def pack(self, arrays: Sequence[np.ndarray], chunk: Chunk, dest: np.ndarray) -> None:
        """Copy one chunk of rows of each input into a packed buffer.

        Args:
            arrays: one array per input, of the call's rows.
            chunk: the rows to copy.
            dest: a (rows, width) buffer; its first `chunk.rows` rows are written.
        """
        for (a, b), array in zip(self.spans, arrays, strict=True):
            dest[:chunk.rows, a:b] = array[chunk.start:chunk.stop].reshape(chunk.rows, b - a)

    def unpack(self, packed: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Views of packed rows as the inputs; no copy.

        Args:
            packed: (rows, width).

        Returns:
            One (rows, *shape) view per input.
        """
        rows = packed.shape[0]
        return tuple(packed[:, a:b].view(rows, *shape)
                     for (a, b), shape in zip(self.spans, self.shapes, strict=True))


class Event(Protocol):
    def synchronize(self) -> None: ...


class GraphBackend(Protocol):
    """The device side of the graph engine: streams, memory pools, capture, pinned memory."""

    device: torch.device

    def new_stream(self) -> Any:
        """A new stream on the device.

        Returns:
            The stream.
        """
        ...

    def new_pool(self) -> Any:
        """A new graph memory pool on the device.

        Returns:
            The pool's handle.
        """
        ...

    def current_stream(self) -> Any:
        """The device's current stream.

        Returns:
            The stream.
        """
        ...

    def use_stream(self, stream: Any) -> AbstractContextManager[Any]:
        """Make `stream` the current stream inside a `with` block.

        Args:
            stream: a stream of the device.

        Returns:
            The context manager.
        """
        ...

    def wait(self, stream: Any, other: Any) -> None:
        """Work queued later on `stream` waits for the work queued so far on `other`.

        Args:
            stream: the stream that waits.
            other: the stream waited for.
        """
        ...

    def capture(self, fn: Callable[[], tuple[torch.Tensor, ...]], pool: Any
                ) -> tuple[Callable[[], None], tuple[torch.Tensor, ...]]:
        """Capture a function into a graph.

        Args:
            fn: the function to capture; its inputs are static device tensors.
            pool: the memory pool the graph allocates from.

        Returns:
            The graph's replay and its static outputs.
        """
        ...

    def host_buffer(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """A page-locked host tensor.

        Args:
            shape: its shape.
            dtype: its dtype.

        Returns:
            The tensor, uninitialised.
        """
        ...

    def record(self, stream: Any) -> Event:
        """An event marking the work queued so far on a stream.

        Args:
            stream: a stream of the device.

        Returns:
            The event, to synchronize on.
        """
        ...


class DeviceGraphs:
    """`GraphBackend` on a torch device module with CUDA's graph API (torch.cuda, torch.npu).

    Args:
        device: the device.
        module: its torch module (`torch.cuda`, `torch.npu`).
        graph_class: the module's graph class (`CUDAGraph`, `NPUGraph`).
    """

    def __init__(self, device: torch.device, module: ModuleType, graph_class: type) -> None:
        self.device = device
        self._module = module
        self._graph_class = graph_class

    def new_stream(self) -> Any:
        """See `GraphBackend.new_stream`.

        Returns:
            A new stream on the device.
        """
        return self._module.Stream(device=self.device)

    def new_pool(self) -> Any:
        """See `GraphBackend.new_pool`.

        Returns:
            A new graph memory pool's handle.
        """
        return self._module.graph_pool_handle()

    def current_stream(self) -> Any:
        """See `GraphBackend.current_stream`.

        Returns:
            The device's current stream.
        """
        return self._module.current_stream(self.device)

    def use_stream(self, stream: Any) -> AbstractContextManager[Any]:
        """See `GraphBackend.use_stream`.

        Args:
            stream: a stream of the device.

        Returns:
            The module's stream context manager.
        """
        return cast(AbstractContextManager[Any], self._module.stream(stream))

    def wait(self, stream: Any, other: Any) -> None:
        """See `GraphBackend.wait`.

        Args:
            stream: the stream that waits.
            other: the stream waited for.
        """
        stream.wait_stream(other)

    def capture(self, fn: Callable[[], tuple[torch.Tensor, ...]], pool: Any
                ) -> tuple[Callable[[], None], tuple[torch.Tensor, ...]]:
        """See `GraphBackend.capture`: warm-up runs on a side stream (`CAPTURE_WARMUP_RUNS`), then the
        capture.

        Args:
            fn: the function to capture; its inputs are static device tensors.
            pool: the memory pool the graph allocates from.

        Returns:
            The graph's replay and its static outputs.
        """
        module = self._module
        with module.device(self.device):
            side = module.Stream(device=self.device)
            side.wait_stream(module.current_stream(self.device))
            with module.stream(side):
                for _ in range(CAPTURE_WARMUP_RUNS):
                    fn()
            module.current_stream(self.device).wait_stream(side)
            graph = self._graph_class()
            with module.graph(graph, pool=pool):
                outputs = fn()
        return graph.replay, outputs

    def host_buffer(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """See `GraphBackend.host_buffer`.

        Args:
            shape: its shape.
            dtype: its dtype.

        Returns:
            A pinned, uninitialised host tensor.
        """
        return torch.empty(shape, dtype=dtype, pin_memory=True)

    def record(self, stream: Any) -> Event:
        """See `GraphBackend.record`.

        Args:
            stream: a stream of the device.

        Returns:
            The event recorded on it.
        """
        event = self._module.Event()
        event.record(stream)
        return cast(Event, event)


def graph_backend(device_type: str, module: ModuleType | None) -> tuple[ModuleType, type] | None:
    """The graph API of a device module, where it has one.

    Args:
        device_type: `cuda` or `npu`.
        module: `torch.cuda`, `torch.npu`, or None where absent.

    Returns:
        (module, graph class) when the module offers graph capture for `device_type`; None
            otherwise, and then graphs are not available there.
    """
    graph_class = getattr(module, GRAPH_CLASSES.get(device_type, ""), None)
    if module is None or graph_class is None:
        return None
    if not all(hasattr(module, name) for name in GRAPH_MODULE_API):
        return None
    return module, graph_class


def device_graphs(device: torch.device) -> DeviceGraphs | None:
    """The graph backend of a device.

    Args:
        device: a torch device.

    Returns:
        Its backend, or None where its torch module has no graph capture.
    """
    found = graph_backend(device.type, getattr(torch, device.type, None))
    return None if found is None else DeviceGraphs(device, *found)


def probe_rows(width: int) -> np.ndarray:
    """The probe batch's distinct packed rows: seeded standard-normal values, on the scale of
    normalized observations and of the noise.

    Args:
        width: the packed row's width.

    Returns:
        (`CHECK_PROBE_ROWS`, width) float32.
    """
    return np.random.default_rng(CHECK_SEED).standard_normal((CHECK_PROBE_ROWS, width),
                                                             dtype=np.float32)


def output_mismatch(graph: Sequence[torch.Tensor], eager: Sequence[torch.Tensor],
                    tolerance: float, relative: bool) -> str | None:
    """Compare a graph's outputs with eager torch's.

    Args:
        graph: the graph's outputs.
        eager: eager torch's outputs of the same program and inputs.
        tolerance: the largest difference allowed.
        relative: compare relative to max(1, |eager|) rather than as a max abs difference.

    Returns:
        None when every output is within `tolerance` (equal infinities, and NaN where eager has
            NaN, agree); else what differs, naming the first output that does.
    """
    graph_shapes = [tuple(output.shape) for output in graph]
    eager_shapes = [tuple(output.shape) for output in eager]
    if graph_shapes != eager_shapes:
        return f"outputs of shapes {graph_shapes}, eager torch {eager_shapes}"
    worst = []
    for got, want in zip(graph, eager, strict=True):
        got, want = got.float(), want.float()
        difference = (got - want).abs()
        if relative:
            difference = difference / want.abs().clamp(min=1.0)
        agree = (got == want) | (got.isnan() & want.isnan())
        difference = torch.where(agree, 0.0, difference.nan_to_num(nan=math.inf, posinf=math.inf))
        worst.append(difference.max() if difference.numel() else difference.new_zeros(()))
    for index, value in enumerate(torch.stack(worst).tolist() if worst else []):
        if not value <= tolerance:
            kind = "relative difference" if relative else "max abs difference"
            return (f"output {index} differs from eager torch by {value:.3g} ({kind}; "
                    f"tolerance {tolerance:g})")
    return None


@dataclass(frozen=True, eq=False)
class _Program:
    """A function of packed per-row inputs: `forward` keeps its outputs on the device, `act`
    programs return one per-row output (the actions) that comes back to the host."""

    kind: str
    layout: RowLayout
    fn: Callable[[tuple[torch.Tensor, ...]], tuple[torch.Tensor, ...]]

    @property
    def to_host(self) -> bool:
        return self.kind != "forward"


@dataclass
class _Captured:
    replay: Callable[[], None]
    outputs: tuple[torch.Tensor, ...]
    per_row: tuple[bool, ...]


class _Slot:
    """One stream, one memory pool, and per program: a device input buffer of max_rung rows, a
    pinned host input buffer, a pinned host output buffer (act programs) and captured rungs."""

    def __init__(self, backend: GraphBackend) -> None:
        self.stream = backend.new_stream()
        self.pool = backend.new_pool()
        self.device_inputs: dict[_Program, torch.Tensor] = {}
        self.host_inputs: dict[_Program, tuple[torch.Tensor, np.ndarray]] = {}
        self.host_outputs: dict[_Program, tuple[torch.Tensor, np.ndarray]] = {}
        self.graphs: dict[tuple[_Program, int], _Captured] = {}
        self.reading: dict[_Program, Event] = {}
        """Copies from a host input buffer that nothing has waited for yet (forward programs)."""


@dataclass(frozen=True)
class _Pending:
    """A chunk whose actions are on their way to `host` (a pinned buffer's numpy view)."""

    event: Event
    chunk: Chunk
    host: np.ndarray

    def finish(self, result: np.ndarray) -> None:
        """Wait for the copy, then put the chunk's rows into `result`."""
        self.event.synchronize()
        result[self.chunk.start:self.chunk.stop] = self.host[:self.chunk.rows]


# How `GraphEngine` runs a call:
# - Rungs: powers of two up to `max_rung`. A batch of N <= max_rung rows is padded to the smallest
#   rung >= N; a larger one runs in chunks of max_rung rows and a padded remainder.
# - Programs: `forward` (the network's outputs, left on the device for `distribution`), `act`
#   (network and head: the actions) and `act+noise` (the host noise as one more per-row input).
# - Buffers: a program's per-row inputs are packed side by side in one row of a pinned host buffer
#   (network inputs, then the noise), so a call copies exactly its N rows to the device in one
#   copy, and the actions come back in one copy. Rung r's graph reads the first r rows of the
#   program's device input buffer; rows past N keep earlier (finite) values, and no row depends
#   on another.
# - Slots: two independent sets of stream, memory pool, buffers and graphs. Calls of up to
#   max_rung rows use slot 0; chunked calls alternate slots, so packing and copying one chunk
#   overlaps the compute of the previous one. Graphs of one slot share its pool and never run
#   concurrently.
# - Check: every captured graph is replayed once on a fixed probe batch (seeded Gaussian inputs,
#   and seeded noise for `act+noise`) and its outputs are compared with the same program run
#   eagerly on the same device, within the precision's tolerance (`CHECK_ATOL`).


class GraphEngine(Engine):
    """Replays captured graphs of the network. `ladder` holds the batch sizes it captures;
    `capture_seconds` how long each (program kind, rung) took to capture, `check_seconds` to check
    against eager torch.

    Args:
        net: the network.
        input_shapes: the feature shape of each input.
        device: the device the graphs run on.
        head: the agent's action head, captured with the network for actions.
        backend: the device's graph API.
        max_rung: the largest captured batch, a power of two; larger batches are chunked.
        precision: the layers' precision, which picks the check's tolerance.

    Raises:
        ValueError: an unknown precision, or `max_rung` not a power of two.
    """

    name = "graph"

    def __init__(self, net: nn.Module, input_shapes: InputShapes, device: torch.device,
                 head: ActionHead, backend: GraphBackend,
                 max_rung: int = DEFAULT_MAX_RUNG, precision: str = "fp32") -> None:
        super().__init__(net, input_shapes, device, head)
        if precision not in CHECK_ATOL:
            raise ValueError(f"unknown precision {precision!r}; expected one of "
                             f"{', '.join(CHECK_ATOL)}")
        self.ladder = rung_ladder(max_rung)
        self.max_rung = max_rung
        self.backend = backend
        self.precision = precision
        self.capture_seconds: dict[tuple[str, int], float] = {}
        self.check_seconds: dict[tuple[str, int], float] = {}
        self._programs: dict[tuple[str, tuple[int, ...] | None], _Program] = {}
        self._slots: list[_Slot] = []
        self._probes: dict[int, np.ndarray] = {}
        self._lock = threading.Lock()

    def describe(self) -> str:
        """The engine and how it runs, in one line.

        Returns:
            The device, the rungs, how many graphs were captured, and the chunking.
        """
        return (f"{self.name} on {self.device}, {len(self.ladder)} rungs of 1-{self.max_rung} rows "
                f"({len(self.capture_seconds)} graphs captured, each checked against eager "
                "torch), larger batches chunked over 2 streams")

    # --- programs, slots, capture -----------------------------------------------------------

    def _program(self, kind: str, noise_shape: tuple[int, ...] | None = None) -> _Program:
        key = (kind, noise_shape)
        program = self._programs.get(key)
        if program is None:
            program = self._programs[key] = self._make_program(kind, noise_shape)
        return program

    def _make_program(self, kind: str, noise_shape: tuple[int, ...] | None) -> _Program:
        net, head, count = self.net, self.head, len(self.input_shapes)
        if kind == "forward":
            return _Program(kind, RowLayout(self.input_shapes),
                            lambda views: as_float32(net(*views)))
        if noise_shape is None:
            return _Program(kind, RowLayout(self.input_shapes),
                            lambda views: (head.torch(as_float32(net(*views)), None),))
        return _Program(kind, RowLayout((*self.input_shapes, noise_shape)),
                        lambda views: (head.torch(as_float32(net(*views[:count])), views[count]),))

    def _slot(self, index: int) -> _Slot:
        while len(self._slots) <= index:
            self._slots.append(_Slot(self.backend))
        return self._slots[index]

    def _captured(self, slot: _Slot, program: _Program, rung: int) -> _Captured:
        captured = slot.graphs.get((program, rung))
        if captured is not None:
            return captured
        if program not in slot.device_inputs:
            shape = (self.max_rung, program.layout.width)
            slot.device_inputs[program] = torch.zeros(shape, device=self.device)
            host = self.backend.host_buffer(shape, torch.float32)
            slot.host_inputs[program] = (host, host.numpy())
        views = program.layout.unpack(slot.device_inputs[program][:rung])
        start = time.perf_counter()
        with self._failures(rung, f"capturing its {program.kind} graph"):
            replay, outputs = self.backend.capture(lambda: program.fn(views), slot.pool)
        seconds = time.perf_counter() - start
        per_row = per_row_flags(outputs, rung)
        if program.to_host:
            if len(outputs) != 1 or not per_row[0]:
                raise ValueError(f"the {program.kind} program must return one per-row output, "
                                 f"returned shapes {[tuple(o.shape) for o in outputs]}")
            if program not in slot.host_outputs:
                host = self.backend.host_buffer((self.max_rung, *outputs[0].shape[1:]),
                                                outputs[0].dtype)
                slot.host_outputs[program] = (host, host.numpy())
        self.capture_seconds[(program.kind, rung)] = seconds
        captured = _Captured(replay, outputs, per_row)
        start = time.perf_counter()
        self._check(slot, program, captured, rung)
        self.check_seconds[(program.kind, rung)] = time.perf_counter() - start
        logger.info("captured %s for %d rows on %s in %.1f ms, checked in %.1f ms", program.kind,
                    rung, self.device, 1e3 * seconds, 1e3 * self.check_seconds[(program.kind, rung)])
        slot.graphs[(program, rung)] = captured
        return captured

    @contextmanager
    def _failures(self, rows: int, doing: str) -> Iterator[None]:
        """Any error raised inside, other than an `EngineFailure`, as an `EngineFailure` of
        batch size `rows` whose cause says what was being done."""
        try:
            yield
        except EngineFailure:
            raise
        except Exception as error:
            raise EngineFailure(self.name, rows, f"{doing} raised {type(error).__name__}: "
                                f"{error}") from error

    def _check(self, slot: _Slot, program: _Program, captured: _Captured, rung: int) -> None:
        """Replay the new graph on the probe batch and compare it with the program run eagerly
        on the same inputs and device; raises `EngineFailure` on a mismatch or an error."""
        width = program.layout.width
        if width not in self._probes:
            self._probes[width] = probe_rows(width)
        host, host_array = slot.host_inputs[program]
        host_array[:rung] = np.resize(self._probes[width], (rung, width))
        device_input, caller = slot.device_inputs[program], self.backend.current_stream()
        with self.backend.use_stream(slot.stream):
            self.backend.wait(slot.stream, caller)
            device_input[:rung].copy_(host[:rung], non_blocking=True)
            with self._failures(rung, f"replaying its {program.kind} graph"):
                captured.replay()
            with self._failures(rung, f"checking its {program.kind} graph"):
                eager = program.fn(program.layout.unpack(device_input[:rung]))
                mismatch = output_mismatch(captured.outputs, eager, CHECK_ATOL[self.precision],
                                           relative=not program.to_host)
        if mismatch is not None:
            raise EngineFailure(self.name, rung, f"its {program.kind} graph failed the check "
                                f"against eager torch ({self.precision}): {mismatch}")

    # --- calls --------------------------------------------------------------------------------

    def _replay(self, slot: _Slot, program: _Program, captured: _Captured,
                arrays: Sequence[np.ndarray], chunk: Chunk, caller: Any) -> None:
        """Pack the chunk's rows on the host, then on the slot's stream: one copy in, replay.

        The host buffer is rewritten only once the previous copy from it has finished: act
        programs wait for their whole chunk before reusing a slot, forward programs (whose
        outputs stay on the device) for the copy recorded here.
        """
        reading = slot.reading.pop(program, None)
        if reading is not None:
            reading.synchronize()
        host, host_array = slot.host_inputs[program]
        program.layout.pack(arrays, chunk, host_array)
        with self.backend.use_stream(slot.stream):
            self.backend.wait(slot.stream, caller)  # earlier work on these buffers (fill, clones)
            slot.device_inputs[program][:chunk.rows].copy_(host[:chunk.rows], non_blocking=True)
            if not program.to_host:
                slot.reading[program] = self.backend.record(slot.stream)
            with self._failures(chunk.rung, f"replaying its {program.kind} graph"):
                captured.replay()

    def _copy_out(self, slot: _Slot, program: _Program, captured: _Captured,
                  chunk: Chunk) -> _Pending:
        """On the slot's stream: one copy of the chunk's actions to the pinned host buffer."""
        host, host_array = slot.host_outputs[program]
        with self.backend.use_stream(slot.stream):
            host[:chunk.rows].copy_(captured.outputs[0][:chunk.rows], non_blocking=True)
            return _Pending(self.backend.record(slot.stream), chunk, host_array)

    def forward(self, inputs: Sequence[np.ndarray]) -> tuple[torch.Tensor, ...]:
        """The network's outputs on the device (see `Engine.forward`).

        Args:
            inputs: one (N, *feature_shape) float32 array per input.

        Returns:
            Copies of the outputs on the device (the graphs' own outputs are overwritten next call).

        Raises:
            EngineFailure: a graph failed its check, or capture or replay raised; the engine is not to
                be used after that.
        """
        program = self._program("forward")
        rows = len(inputs[0])
        with self._lock, torch.inference_mode(), self._failures(rows, "running its forward graphs"):
            slot, caller = self._slot(0), self.backend.current_stream()
            parts: list[tuple[torch.Tensor, ...]] = []
            per_row: tuple[bool, ...] = ()
            for chunk in chunk_plan(rows, self.max_rung):
                captured = self._captured(slot, program, chunk.rung)
                per_row = per_row or captured.per_row
                self._replay(slot, program, captured, inputs, chunk, caller)
                self.backend.wait(caller, slot.stream)
                parts.append(tuple(
                    output[:chunk.rows].clone() if row else output.clone()
                    for output, row in zip(captured.outputs, captured.per_row, strict=True)))
            return merge_parts(parts, per_row)

    def act(self, inputs: Sequence[np.ndarray], noise: np.ndarray | None) -> np.ndarray:
        """The actions for a batch, network and head replayed as one graph per chunk (see `Engine.act`).

        Args:
            inputs: one (N, *feature_shape) float32 array per input.
            noise: host noise for every row, or None for deterministic actions.

        Returns:
            (N, *action) actions on the host.

        Raises:
            EngineFailure: a graph failed its check, or capture or replay raised; the engine is not to
                be used after that.
        """
        program = (self._program("act") if noise is None
                   else self._program("act+noise", tuple(noise.shape[1:])))
        arrays = tuple(inputs) if noise is None else (*inputs, noise)
        rows = len(arrays[0])
        with (self._lock, torch.inference_mode(),
              self._failures(rows, f"running its {program.kind} graphs")):
            caller = self.backend.current_stream()
            pending: dict[int, _Pending] = {}
            result = np.empty(0)
            for index, chunk in enumerate(chunk_plan(rows, self.max_rung)):
                slot = self._slot(index % 2)
                if index % 2 in pending:  # the slot's previous chunk, before its buffers are reused
                    pending.pop(index % 2).finish(result)
                captured = self._captured(slot, program, chunk.rung)
                if index == 0:
                    row_shape = tuple(captured.outputs[0].shape[1:])
                    result = np.empty((rows, *row_shape), dtype=slot.host_outputs[program][1].dtype)
                self._replay(slot, program, captured, arrays, chunk, caller)
                pending[index % 2] = self._copy_out(slot, program, captured, chunk)
            for waiting in sorted(pending.values(), key=lambda p: p.chunk.start):
                waiting.finish(result)
        return result


class _DeviceGraphEngine(GraphEngine):
    """A graph engine on the device type `device_type`, with that device's own graph API."""

    device_type: str
    requirement: str
    """What the engine needs, for the error when it cannot run."""

    def __init__(self, net: nn.Module, input_shapes: InputShapes, device: torch.device,
                 head: ActionHead, max_rung: int = DEFAULT_MAX_RUNG,
                 precision: str = "fp32") -> None:
        backend = device_graphs(device) if device.type == self.device_type else None
        if backend is None:
            raise ValueError(f"the {self.name} engine needs {self.requirement}, not {device}")
        super().__init__(net, input_shapes, device, head, backend, max_rung, precision)


class CudaGraphEngine(_DeviceGraphEngine):
    """`cuda-graph`: graphs captured with torch.cuda.CUDAGraph."""

    name = "cuda-graph"
    device_type = "cuda"
    requirement = "a CUDA device"


class NpuGraphEngine(_DeviceGraphEngine):
    """`npu-graph`: graphs captured with torch-npu's NPUGraph (untested on Ascend hardware)."""

    name = "npu-graph"
    device_type = "npu"
    requirement = "an NPU whose torch-npu offers NPUGraph"
