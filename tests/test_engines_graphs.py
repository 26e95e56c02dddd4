"""The graph engine's bookkeeping on the CPU (rungs, padding, chunking, packed buffers, slots),
under a stand-in backend, and the real cuda-graph engine where CUDA exists.

`CpuGraphs` implements `GraphBackend` on the CPU with the semantics of a captured graph: capture
runs the function once and keeps its outputs as the static outputs; replay runs it again on the
same static inputs and writes into those same outputs. Everything else is the engine's own code.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import torch

import huggy_agent.agent as agent_module
from huggy_agent import HuggyAgent
from huggy_agent.engines import EngineFailure, auto_choice
from huggy_agent.engines.graphs import (
    CHECK_ATOL,
    Chunk,
    GraphEngine,
    RowLayout,
    chunk_plan,
    output_mismatch,
    rung_for,
    rung_ladder,
)
from huggy_agent.engines.torch_eager import TorchEngine
from huggy_agent.noise import gaussian_noise
from huggy_agent.numerics import FP32_ACTION_ATOL
from huggy_agent.reference import canonical_observations
from tests.support.fixtures import fixtures_dir
from tests.support.graphs import CpuGraphs, cpu_graph_engine

pytestmark = pytest.mark.numerics  # rerun by .ci/run under other CPU kernel paths

BASELINE = fixtures_dir() / "ppo_baseline" / "Huggy.onnx"


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
    assert len(engine._slots) == 2  # the bookkeeping under test
    # Slot 0 ran chunks 0 and 2 (rung 256), slot 1 chunk 1 (256) and the remainder (rung 8).
    assert {rung for (_, rung) in engine._slots[0].graphs} == {256}
    assert {rung for (_, rung) in engine._slots[1].graphs} == {256, 8}


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
    engine = warmed._engine = cpu_graph_engine(warmed)  # swap in the stand-in
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


# --- the check against eager torch, and the fall-back to `torch` ---------------------------------

class FaultyGraphs(CpuGraphs):
    """The stand-in with a fault injected into capture number `faulty` (0-based, in capture
    order): each replay adds `offset` to the graph's first output (a wrong graph), or raises
    `replay_error` from its replay number `good_replays` + 1 on (replay 1 is the check's).
    `capture_error` makes every capture raise."""

    def __init__(self, *, faulty: int = 0, offset: float = 0.0,
                 capture_error: Exception | None = None, replay_error: Exception | None = None,
                 good_replays: int = 0) -> None:
        super().__init__()
        self.faulty, self.offset = faulty, offset
        self.capture_error, self.replay_error = capture_error, replay_error
        self.good_replays = good_replays

    def capture(self, fn: Callable[[], tuple[torch.Tensor, ...]], pool: Any
                ) -> tuple[Callable[[], None], tuple[torch.Tensor, ...]]:
        if self.capture_error is not None:
            raise self.capture_error
        index = self.captures
        replay, outputs = super().capture(fn, pool)
        if index != self.faulty:
            return replay, outputs
        replays = 0

        def faulty_replay() -> None:
            nonlocal replays
            replays += 1
            if self.replay_error is not None and replays > self.good_replays:
                raise self.replay_error
            replay()
            outputs[0].add_(self.offset)  # a computed output (actions, mu), never a parameter

        return faulty_replay, outputs


class StandInCudaGraph(GraphEngine):
    """The graph engine under the name the real one has, on a stand-in backend."""

    name = "cuda-graph"


AUTO_CUDA_REASON = auto_choice("cuda", "fp32", onnxruntime=False, graphs=True)[1]


@pytest.fixture
def stand_in_cuda(monkeypatch: pytest.MonkeyPatch) -> Callable[[CpuGraphs], None]:
    """Installs a backend: every agent made afterwards runs `StandInCudaGraph` on it, as `auto`
    would pick cuda-graph on a CUDA device."""

    def install(backend: CpuGraphs) -> None:
        monkeypatch.setattr(agent_module, "choose_engine",
                            lambda name, device, precision, net: ("cuda-graph", AUTO_CUDA_REASON))
        monkeypatch.setattr(agent_module, "create_engine",
                            lambda name, net, shapes, device, precision, head: StandInCudaGraph(
                                net, shapes, device, head, backend, 64, precision))

    return install


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING]


def _fallback(cause: str, rows: int) -> str:
    return (f"the cuda-graph engine failed at batch size {rows}: {cause}; running the torch "
            "engine instead")


def test_graphs_that_pass_the_check_are_used(stand_in_cuda: Callable[[CpuGraphs], None],
                                             observations: np.ndarray,
                                             caplog: pytest.LogCaptureFixture) -> None:
    stand_in_cuda(FaultyGraphs(offset=2e-6))  # within the fp32 contract: a correct graph
    agent = HuggyAgent(BASELINE)
    with caplog.at_level(logging.INFO):
        agent.warmup([3])
        actions = agent.compute_action(observations[:3])
    engine = agent._engine  # the engine under test
    assert agent.engine == "cuda-graph" and agent.engine_reason == AUTO_CUDA_REASON
    assert isinstance(engine, StandInCudaGraph)
    assert set(engine.check_seconds) == set(engine.capture_seconds) == {
        ("act", 4), ("act+noise", 4), ("forward", 4)}
    assert _warnings(caplog) == []
    assert np.abs(actions - _onnxruntime(observations[:3])).max() <= FP32_ACTION_ATOL


@pytest.mark.parametrize(("faulty", "kind"), [(0, "act"), (1, "act+noise"), (2, "forward")])
def test_a_graph_that_disagrees_with_eager_torch_is_never_used(
        stand_in_cuda: Callable[[CpuGraphs], None], observations: np.ndarray,
        caplog: pytest.LogCaptureFixture, faulty: int, kind: str) -> None:
    stand_in_cuda(FaultyGraphs(faulty=faulty, offset=0.25))
    agent, reference = HuggyAgent(BASELINE), HuggyAgent(BASELINE, device="cpu", engine="torch")
    obs = observations[:3]
    difference = "relative difference" if kind == "forward" else "max abs difference"
    message = _fallback(f"its {kind} graph failed the check against eager torch (fp32): output 0 "
                        f"differs from eager torch by 0.25 ({difference}; tolerance 1e-05)", 4)
    with caplog.at_level(logging.INFO):
        # The three paths in capture order; the faulty graph's call is answered by torch.
        deterministic = agent.compute_action(obs)
        stochastic = agent.compute_action(obs, deterministic=False, seed=5)
        distribution = agent.actions_from(agent.distribution(obs))
        agent.compute_action(observations[:40], deterministic=False, seed=6)
    assert _warnings(caplog) == [message]
    assert agent.engine == "torch" and agent.engine_reason == message
    assert isinstance(agent._engine, TorchEngine)  # the engine under test
    info = agent.describe()
    assert (info["engine"], info["engine_reason"]) == ("torch", message)
    expected = _onnxruntime(obs)
    assert np.abs(deterministic - expected).max() <= FP32_ACTION_ATOL
    assert np.abs(distribution - expected).max() <= FP32_ACTION_ATOL
    assert np.abs(stochastic - reference.compute_action(obs, deterministic=False, seed=5)
                  ).max() <= FP32_ACTION_ATOL


def test_a_graph_just_outside_the_contract_is_refused(
        stand_in_cuda: Callable[[CpuGraphs], None], observations: np.ndarray) -> None:
    stand_in_cuda(FaultyGraphs(offset=3 * FP32_ACTION_ATOL))
    agent = HuggyAgent(BASELINE)
    agent.compute_action(observations[:1])
    prefix = ("the cuda-graph engine failed at batch size 1: its act graph failed the check "
              "against eager torch (fp32): output 0 differs from eager torch by ")
    suffix = " (max abs difference; tolerance 1e-05); running the torch engine instead"
    reason = agent.engine_reason
    assert agent.engine == "torch" and reason.startswith(prefix) and reason.endswith(suffix)
    # The offset, up to float32 rounding of actions in [-1, 1] (an ulp of 1 is 1.2e-7).
    assert abs(float(reason[len(prefix):-len(suffix)]) - 3e-5) <= 2e-7


def test_a_capture_that_raises_falls_back(stand_in_cuda: Callable[[CpuGraphs], None],
                                          observations: np.ndarray,
                                          caplog: pytest.LogCaptureFixture) -> None:
    stand_in_cuda(FaultyGraphs(capture_error=RuntimeError(
        "operation not permitted when stream is capturing")))
    agent = HuggyAgent(BASELINE)
    with caplog.at_level(logging.WARNING):
        actions = agent.compute_action(observations[:1])
        agent.compute_action(observations[:9])
    message = _fallback("capturing its act graph raised RuntimeError: operation not permitted "
                        "when stream is capturing", 1)
    assert _warnings(caplog) == [message]
    assert (agent.engine, agent.engine_reason) == ("torch", message)
    assert np.abs(actions - _onnxruntime(observations[:1])).max() <= FP32_ACTION_ATOL


@pytest.mark.parametrize("good_replays", [0, 1, 2],
                         ids=["in-the-check", "in-the-first-call", "in-a-later-call"])
def test_a_replay_that_raises_falls_back(stand_in_cuda: Callable[[CpuGraphs], None],
                                         observations: np.ndarray,
                                         caplog: pytest.LogCaptureFixture,
                                         good_replays: int) -> None:
    stand_in_cuda(FaultyGraphs(replay_error=RuntimeError("CUDA error: an illegal memory access"),
                               good_replays=good_replays))
    agent = HuggyAgent(BASELINE)
    obs = observations[:2]
    with caplog.at_level(logging.WARNING):
        first = agent.compute_action(obs)
        assert agent.engine == ("cuda-graph" if good_replays == 2 else "torch")
        second = agent.compute_action(obs)
    message = _fallback("replaying its act graph raised RuntimeError: CUDA error: an illegal "
                        "memory access", 2)
    assert _warnings(caplog) == [message]
    assert (agent.engine, agent.engine_reason) == ("torch", message)
    for actions in (first, second):
        assert np.abs(actions - _onnxruntime(obs)).max() <= FP32_ACTION_ATOL


def test_huggy_info_says_which_engine_runs_and_why(stand_in_cuda: Callable[[CpuGraphs], None],
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from huggy_agent.cli import main

    stand_in_cuda(FaultyGraphs(capture_error=RuntimeError("out of memory")))
    assert main(["info", "--policy", str(BASELINE), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    message = _fallback("capturing its act graph raised RuntimeError: out of memory", 1)
    assert (info["engine"], info["engine_reason"]) == ("torch", message)
    assert main(["info", "--policy", str(BASELINE)]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert any(re.fullmatch(r"engine reason +" + re.escape(message), row) for row in rows), rows


@pytest.mark.parametrize(("got", "want", "relative", "expected"), [
    ([[1.0, -2.0]], [[1.0, -2.0]], False, None),
    ([[1.0, 2.0]], [[1.0, 2.0, 3.0]], False,
     "outputs of shapes [(1, 2)], eager torch [(1, 3)]"),
    ([[np.nan, np.inf, -np.inf]], [[np.nan, np.inf, -np.inf]], False, None),
    ([[np.nan, 0.5]], [[0.0, 0.5]], False,
     "output 0 differs from eager torch by inf (max abs difference; tolerance 1e-05)"),
    ([[0.5, np.inf]], [[0.5, 1.0]], False,
     "output 0 differs from eager torch by inf (max abs difference; tolerance 1e-05)"),
    ([[1000.00390625]], [[1000.0]], True, None),  # 2**-8 apart: 3.9e-6 relative to 1,000
    ([[1000.00390625]], [[1000.0]], False,
     "output 0 differs from eager torch by 0.00391 (max abs difference; tolerance 1e-05)"),
    ([[0.5]], [[0.25]], True,
     "output 0 differs from eager torch by 0.25 (relative difference; tolerance 1e-05)"),
])
def test_output_mismatch(got: list[list[float]], want: list[list[float]], relative: bool,
                         expected: str | None) -> None:
    assert output_mismatch((torch.tensor(got),), (torch.tensor(want),), 1e-5, relative) == expected


def test_output_mismatch_names_the_first_output_that_differs() -> None:
    same, other = torch.zeros(2, 3), torch.full((2, 3), 0.5)
    assert output_mismatch((same, same, other), (same, same, same), 1e-5, False) == (
        "output 2 differs from eager torch by 0.5 (max abs difference; tolerance 1e-05)")


def test_the_check_takes_the_tolerance_of_the_precision(agent: HuggyAgent,
                                                        observations: np.ndarray) -> None:
    assert CHECK_ATOL == {"fp32": FP32_ACTION_ATOL, "fp16": 5e-3, "bf16": 5e-2}
    obs = (observations[:2],)
    for precision in ("fp16", "bf16"):  # 1e-3 is within what two fp16 or bf16 paths may differ
        GraphEngine(agent.net, ((59,),), agent.device, agent.head, FaultyGraphs(offset=1e-3), 4,
                    precision).act(obs, None)
    fp32 = GraphEngine(agent.net, ((59,),), agent.device, agent.head, FaultyGraphs(offset=1e-3),
                       4, "fp32")
    with pytest.raises(EngineFailure, match=re.escape(
            "the graph engine failed at batch size 2: its act graph failed the check against "
            "eager torch (fp32): output 0 differs from eager torch by 0.001 (max abs difference; "
            "tolerance 1e-05)")):
        fp32.act(obs, None)
    with pytest.raises(ValueError, match=re.escape(
            "unknown precision 'fp8'; expected one of fp32, fp16, bf16")):
        GraphEngine(agent.net, ((59,),), agent.device, agent.head, CpuGraphs(), 4, "fp8")


# --- the real thing, where CUDA exists -----------------------------------------------------------

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                   reason="no CUDA device here: the cuda-graph engine needs one "
                                          "(CI has no GPU; run on the GPU machine)")


@pytest.mark.gpu
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
