"""The graph engine's bookkeeping on the CPU (rungs, padding, chunking, packed buffers, slots),
under a stand-in backend, and the real cuda-graph engine where CUDA exists.

`CpuGraphs` implements `GraphBackend` on the CPU with the semantics of a captured graph: capture
runs the function once and keeps its outputs as the static outputs; replay runs it again on the
same static inputs and writes into those same outputs. Everything else is the engine's own code.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import torch

from huggy_agent import HuggyAgent
from huggy_agent.engines.graphs import (
    Chunk,
    GraphEngine,
    RowLayout,
    chunk_plan,
    rung_for,
    rung_ladder,
)
from huggy_agent.engines.torch_eager import TorchEngine
from huggy_agent.noise import gaussian_noise
from huggy_agent.numerics import FP32_ACTION_ATOL
from huggy_agent.reference import canonical_observations
from tests.conftest import fixtures_dir

pytestmark = pytest.mark.numerics  # rerun by .ci/run under other CPU kernel paths

BASELINE = fixtures_dir() / "ppo_baseline" / "Huggy.onnx"


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


@pytest.fixture(scope="module")
def agent() -> HuggyAgent:
    return HuggyAgent(BASELINE, device="cpu", engine="torch")


@pytest.fixture(scope="module")
def observations(agent: HuggyAgent) -> np.ndarray:
    return canonical_observations(agent.loaded, 5000, seed=3)


def _onnxruntime(obs: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(BASELINE), providers=["CPUExecutionProvider"])
    return session.run(["deterministic_continuous_actions"], {"obs_0": obs})[0]


# --- pure logic -------------------------------------------------------------------------------

def test_ladder_is_powers_of_two_up_to_the_bound() -> None:
    assert rung_ladder(1) == (1,)
    assert rung_ladder(16) == (1, 2, 4, 8, 16)
    for bad in (0, 3, 1000):
        with pytest.raises(ValueError, match=re.escape(
                f"max_rung must be a power of two >= 1, received {bad}")):
            rung_ladder(bad)


@pytest.mark.parametrize(("rows", "rung"), [(1, 1), (2, 2), (3, 4), (17, 32), (1024, 1024),
                                            (1023, 1024)])
def test_rows_pad_to_the_next_rung(rows: int, rung: int) -> None:
    assert rung_for(rows, 1024) == rung


def test_rung_for_refuses_rows_outside_the_ladder() -> None:
    with pytest.raises(ValueError, match=re.escape("rows must be in [1, 1024], received 1025")):
        rung_for(1025, 1024)


@pytest.mark.parametrize(("rows", "chunks"), [
    (1, [Chunk(0, 1, 1)]),
    (1024, [Chunk(0, 1024, 1024)]),
    (1025, [Chunk(0, 1024, 1024), Chunk(1024, 1025, 1)]),
    (5000, [Chunk(0, 1024, 1024), Chunk(1024, 2048, 1024), Chunk(2048, 3072, 1024),
            Chunk(3072, 4096, 1024), Chunk(4096, 5000, 1024)]),
    (2051, [Chunk(0, 1024, 1024), Chunk(1024, 2048, 1024), Chunk(2048, 2051, 4)]),
])
def test_chunk_plan_covers_every_row_once_in_order(rows: int, chunks: list[Chunk]) -> None:
    assert chunk_plan(rows, 1024) == chunks


def test_row_layout_packs_inputs_side_by_side_and_unpacks_views() -> None:
    layout = RowLayout(((3,), (2, 2), ()))
    assert layout.spans == ((0, 3), (3, 7), (7, 8)) and layout.width == 8
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal((6, 3)), rng.standard_normal((6, 2, 2)), rng.standard_normal(6)]
    dest = np.full((4, 8), np.nan)
    layout.pack(arrays, Chunk(2, 5, 4), dest)
    assert np.isnan(dest[3:]).all()  # rows past the chunk are left alone
    views = layout.unpack(torch.from_numpy(dest[:3]))
    for view, array in zip(views, arrays, strict=True):
        np.testing.assert_array_equal(view.numpy(), array[2:5])
    assert views[1].data_ptr() == torch.from_numpy(dest).data_ptr() + 3 * 8  # a view, no copy


# --- the engine on the CPU stand-in ---------------------------------------------------------------

def test_rungs_are_captured_once_each_per_program(agent: HuggyAgent,
                                                  observations: np.ndarray) -> None:
    engine = cpu_graph_engine(agent)
    backend = engine.backend
    for rows in (1, 2, 3, 4, 3, 1):
        engine.act((observations[:rows],), None)
    assert backend.captures == 3 and set(engine.capture_seconds) == {
        ("act", 1), ("act", 2), ("act", 4)}
    noise = gaussian_noise(1, 3, 21)
    engine.act((observations[:3],), noise)
    engine.forward((observations[:3],))
    assert backend.captures == 5
    # Slot 0 only: one packed input buffer per program (obs; obs + noise), one output per act.
    assert backend.host_buffers == [((1024, 59), torch.float32), ((1024, 21), torch.float32),
                                    ((1024, 80), torch.float32), ((1024, 21), torch.float32),
                                    ((1024, 59), torch.float32)]


def test_chunked_calls_alternate_two_slots(agent: HuggyAgent, observations: np.ndarray) -> None:
    engine = cpu_graph_engine(agent, max_rung=256)
    engine.act((observations[:256 * 3 + 5],), None)
    assert len(engine._slots) == 2  # noqa: SLF001 - the bookkeeping under test
    # Slot 0 ran chunks 0 and 2 (rung 256), slot 1 chunk 1 (256) and the remainder (rung 8).
    assert {rung for (_, rung) in engine._slots[0].graphs} == {256}  # noqa: SLF001
    assert {rung for (_, rung) in engine._slots[1].graphs} == {256, 8}  # noqa: SLF001


@pytest.mark.parametrize("rows", [1, 2, 3, 17, 1024, 1025, 5000])
def test_actions_match_onnxruntime_across_rungs_and_chunks(agent: HuggyAgent,
                                                           observations: np.ndarray,
                                                           rows: int) -> None:
    engine = cpu_graph_engine(agent)
    obs = observations[:rows]
    actions = engine.act((obs,), None)
    assert actions.shape == (rows, 21) and actions.dtype == np.float32
    assert np.abs(actions - _onnxruntime(obs)).max() <= FP32_ACTION_ATOL


def test_results_are_copies_not_the_static_buffers(agent: HuggyAgent,
                                                   observations: np.ndarray) -> None:
    engine = cpu_graph_engine(agent)
    first = engine.act((observations[:3],), None)
    kept = first.copy()
    dist = engine.forward((observations[:3],))
    kept_mu = dist[0].clone()
    engine.act((observations[10:13],), None)
    engine.forward((observations[10:13],))
    np.testing.assert_array_equal(first, kept)
    torch.testing.assert_close(dist[0], kept_mu, rtol=0, atol=0)


def test_padding_rows_left_from_earlier_calls_change_nothing(agent: HuggyAgent,
                                                             observations: np.ndarray) -> None:
    engine, fresh = cpu_graph_engine(agent), cpu_graph_engine(agent)
    engine.act((observations[100:104] * 50,), None)  # fills all 4 rows of rung 4, far off scale
    np.testing.assert_array_equal(engine.act((observations[:3],), None),
                                  fresh.act((observations[:3],), None))


def test_forward_passes_shared_outputs_through_unpadded(agent: HuggyAgent,
                                                        observations: np.ndarray) -> None:
    engine = cpu_graph_engine(agent, max_rung=64)
    for rows in (1, 3, 200):
        mu, log_sigma = engine.forward((observations[:rows],))
        assert mu.shape == (rows, 21) and log_sigma.shape == (1, 21)
        reference_mu, reference_log_sigma = TorchEngine(
            agent.net, ((59,),), agent.device, agent.head).forward((observations[:rows],))
        assert (mu - reference_mu).abs().max() <= FP32_ACTION_ATOL
        torch.testing.assert_close(log_sigma, reference_log_sigma, rtol=0, atol=0)


def test_stochastic_actions_ride_with_their_noise(agent: HuggyAgent,
                                                  observations: np.ndarray) -> None:
    engine = cpu_graph_engine(agent, max_rung=512)
    obs = observations[:1100]
    noise = gaussian_noise(7, len(obs), 21)
    reference = TorchEngine(agent.net, ((59,),), agent.device, agent.head).act((obs,), noise)
    assert np.abs(engine.act((obs,), noise) - reference).max() <= FP32_ACTION_ATOL


def test_warmup_captures_ahead_so_calls_capture_nothing(agent: HuggyAgent,
                                                        observations: np.ndarray) -> None:
    warmed = HuggyAgent(BASELINE, device="cpu", engine="torch")
    engine = warmed._engine = cpu_graph_engine(warmed)  # noqa: SLF001 - swap in the stand-in
    warmed.warmup([1, 18])
    captured = engine.backend.captures
    assert set(engine.capture_seconds) == {(kind, rung) for kind in ("act", "act+noise", "forward")
                                           for rung in (1, 32)}
    warmed.compute_action(observations[:18], deterministic=False, seed=1)
    warmed.compute_action(observations[5])
    warmed.distribution(observations[:18])
    assert engine.backend.captures == captured


def test_warmup_refuses_unknown_paths(agent: HuggyAgent) -> None:
    with pytest.raises(ValueError, match=re.escape(
            "unknown warm-up path(s) ['fast']; expected some of ['deterministic', 'stochastic', "
            "'distribution']")):
        agent.warmup([1], paths=("deterministic", "fast"))


# --- the real thing, where CUDA exists -----------------------------------------------------------

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                   reason="no CUDA device here: the cuda-graph engine needs one "
                                          "(CI has no GPU; run on the GPU machine)")


@requires_cuda
def test_cuda_graph_engine_matches_onnxruntime_and_the_cpu(observations: np.ndarray) -> None:
    gpu = HuggyAgent(BASELINE, device="cuda", engine="cuda-graph")
    cpu = HuggyAgent(BASELINE, device="cpu", engine="torch")
    assert gpu.engine == "cuda-graph" and HuggyAgent(BASELINE, device="cuda").engine == "cuda-graph"
    for rows in (1, 2, 3, 17, 1024, 1025, 5000, 20000):
        obs = observations[np.arange(rows) % len(observations)]
        assert np.abs(gpu.compute_action(obs) - _onnxruntime(obs)).max() <= FP32_ACTION_ATOL, rows
        stochastic = gpu.compute_action(obs, deterministic=False, seed=rows, row_offset=3)
        expected = cpu.compute_action(obs, deterministic=False, seed=rows, row_offset=3)
        assert np.abs(stochastic - expected).max() <= FP32_ACTION_ATOL, rows
        dist = gpu.distribution(obs)
        assert dist.mu.device.type == "cuda" and dist.log_sigma.shape == (1, 21)
        assert np.abs(gpu.actions_from(dist) - _onnxruntime(obs)).max() <= FP32_ACTION_ATOL


@requires_cuda
def test_cuda_graph_rung_captures_in_under_200_ms() -> None:
    gpu = HuggyAgent(BASELINE, device="cuda", engine="cuda-graph")
    gpu.warmup([1], paths=("deterministic",))  # the first capture also initialises cuBLAS
    gpu.warmup([64, 1024], paths=("deterministic",))
    seconds = gpu._engine.capture_seconds  # noqa: SLF001 - the figure under test
    assert seconds[("act", 64)] < 0.2 and seconds[("act", 1024)] < 0.2, seconds
