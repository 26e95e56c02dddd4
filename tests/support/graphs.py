"""`CpuGraphs`: the graph engine's backend on the CPU, with the semantics of a captured graph
(capture runs the function once and keeps its outputs as the static outputs; replay runs it again
on the same static inputs and writes into those same outputs), so everything else the graph
engine does runs as on an accelerator."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

from huggy_agent import HuggyAgent
from huggy_agent.engines.graphs import GraphEngine


class _Done:
    def synchronize(self) -> None:
        """CPU copies are synchronous: nothing to wait for."""


class CpuGraphs:
    """`GraphBackend` on the CPU: streams and events are no-ops, "pinned" memory is plain."""

    device = torch.device("cpu")

    def __init__(self) -> None:
        self.captures = 0
        self.host_buffers: list[tuple[tuple[int, ...], torch.dtype]] = []

    def new_stream(self) -> object:
        return object()

    def new_pool(self) -> object:
        return object()

    def current_stream(self) -> object:
        return None

    def use_stream(self, stream: Any) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def wait(self, stream: Any, other: Any) -> None:
        pass

    def capture(self, fn: Callable[[], tuple[torch.Tensor, ...]], pool: Any
                ) -> tuple[Callable[[], None], tuple[torch.Tensor, ...]]:
        self.captures += 1
        outputs = fn()

        def replay() -> None:
            for static, fresh in zip(outputs, fn(), strict=True):
                if static is not fresh:  # a parameter returned as it is (PPO's log_sigma)
                    static.copy_(fresh)

        return replay, outputs

    def host_buffer(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        self.host_buffers.append((tuple(shape), dtype))
        return torch.zeros(shape, dtype=dtype)

    def record(self, stream: Any) -> _Done:
        return _Done()


def cpu_graph_engine(agent: HuggyAgent, max_rung: int = 1024) -> GraphEngine:
    """A graph engine over `agent`'s network and head, on the CPU stand-in."""
    return GraphEngine(agent.net, ((agent.obs_size,),), agent.device, agent.head, CpuGraphs(),
                       max_rung)
