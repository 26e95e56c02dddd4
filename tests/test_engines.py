"""Every engine against onnxruntime on every Huggy fixture, at batch sizes across rung and chunk
edges; seeded stochastic actions equal across engines; `auto`'s fixed rule; the NPU selection
without an NPU; and engines running networks of other shapes than Huggy's."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnxruntime as ort
import pytest
import torch
from torch import nn

from huggy_agent import HuggyAgent, benchmark
from huggy_agent.engines import Engine, auto_choice, auto_engine, choose_engine, resolve_engine
from huggy_agent.engines.graphs import GRAPH_MODULE_API, GraphEngine, device_graphs, graph_backend
from huggy_agent.engines.native import NativeEngine
from huggy_agent.engines.onnx_runtime import OnnxRuntimeEngine
from huggy_agent.engines.torch_eager import TorchEngine
from huggy_agent.heads import ContinuousHead
from huggy_agent.native import mlp_kernels
from huggy_agent.noise import gaussian_noise
from huggy_agent.numerics import FP32_ACTION_ATOL
from huggy_agent.reference import canonical_observations, float64_actions, float64_outputs
from tests.support.engines import AUTO_CPU
from tests.support.fixtures import FIXTURE_RUNS, fixtures_dir
from tests.support.graphs import CpuGraphs, cpu_graph_engine

pytestmark = pytest.mark.numerics  # rerun by .ci/run under other CPU kernel paths

SIZES = (1, 2, 3, 17, 1024, 1025, 2049)  # 2049: two whole chunks of 1,024 rows and one row
# A compiled kernel run one row at a time (below) does the same work for every row: batches up to
# the 1,025-row edge test it, 2,049 rows would only repeat it twice over.
EVERY_ROW_SIZES = tuple(rows for rows in SIZES if rows <= 1025)
ENGINES: dict[str, Callable[[HuggyAgent], Engine]] = {
    "torch": lambda a: TorchEngine(a.net, ((a.obs_size,),), a.device, a.head),
    "onnxruntime": lambda a: OnnxRuntimeEngine(a.net, ((a.obs_size,),), a.device, a.head),
    "graph (CPU stand-in)": cpu_graph_engine,
}
if mlp_kernels():  # the compiled kernels were built: the engine as auto runs it, and each kernel
    # of this CPU on every row (not only single observations)
    ENGINES["native"] = lambda a: NativeEngine(a.net, ((a.obs_size,),), a.device, a.head)
    for _kernel in mlp_kernels():
        ENGINES[f"native kernel {_kernel}, every row"] = (
            lambda a, kernel=_kernel: NativeEngine(a.net, ((a.obs_size,),), a.device, a.head,
                                                   kernel=kernel, native_rows=max(EVERY_ROW_SIZES)))


def sizes_for(engine_name: str) -> tuple[int, ...]:
    return EVERY_ROW_SIZES if engine_name.endswith("every row") else SIZES


def _policy_file(run: str, file_format: str) -> Path:
    folder = fixtures_dir() / run
    return folder / "Huggy.onnx" if file_format == "onnx" else next((folder / "Huggy").glob(
        "Huggy-*.pt"))


@pytest.fixture(scope="module", params=[(run, fmt) for run in FIXTURE_RUNS
                                        for fmt in ("onnx", "pt")], ids=lambda p: "-".join(p))
def policy(request: pytest.FixtureRequest) -> tuple[HuggyAgent, np.ndarray, np.ndarray]:
    """(agent, 2,049 on-scale observations, onnxruntime's deterministic actions on the run's
    own ML-Agents export) for each fixture run, loaded from its .onnx and from its .pt."""
    run, file_format = request.param
    agent = HuggyAgent(_policy_file(run, file_format), device="cpu", engine="torch")
    obs = canonical_observations(agent.loaded, max(SIZES), seed=5)
    session = ort.InferenceSession(str(fixtures_dir() / run / "Huggy.onnx"),
                                   providers=["CPUExecutionProvider"])
    (reference,) = session.run(["deterministic_continuous_actions"], {"obs_0": obs})
    return agent, obs, reference


@pytest.mark.parametrize("engine_name", ENGINES)
def test_engine_matches_onnxruntime_at_rung_and_chunk_edges(policy: tuple, engine_name: str
                                                            ) -> None:
    agent, obs, reference = policy
    engine = ENGINES[engine_name](agent)
    for rows in sizes_for(engine_name):
        actions = engine.act((obs[:rows],), None)
        assert actions.shape == (rows, 21) and actions.dtype == np.float32
        worst = float(np.abs(actions - reference[:rows]).max())
        assert worst <= FP32_ACTION_ATOL, f"{rows} rows: {worst}"


@pytest.fixture(scope="module")
def seeded_references(policy: tuple) -> dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per batch size: (host noise, the torch engine's actions with it, the float64 reference's
    actions with it), computed once per policy for every engine's test."""
    agent, obs, _ = policy
    torch_engine = ENGINES["torch"](agent)
    mu, log_sigma = (torch.from_numpy(a) for a in float64_outputs(agent.loaded, [obs])[:2])
    head = ContinuousHead(agent.loaded.arch.head)  # the network runs once, on every row
    references = {}
    for rows in SIZES:
        noise = gaussian_noise(11, rows, 21, row_offset=rows)
        float64_reference = head.torch((mu[:rows], log_sigma),
                                       torch.from_numpy(noise.astype(np.float64))).numpy()
        references[rows] = (noise, torch_engine.act((obs[:rows],), noise), float64_reference)
    return references


@pytest.mark.parametrize("engine_name", ENGINES)
def test_seeded_stochastic_actions_agree_across_engines(policy: tuple, seeded_references: dict,
                                                        engine_name: str) -> None:
    """The same host noise, bit for bit, in every engine; actions within the contract of the
    float64 reference with that noise."""
    agent, obs, _ = policy
    engine = ENGINES[engine_name](agent)
    for rows in sizes_for(engine_name):
        noise, torch_actions, float64_reference = seeded_references[rows]
        actions = engine.act((obs[:rows],), noise)
        assert np.abs(actions - torch_actions).max() <= FP32_ACTION_ATOL, rows
        assert np.abs(actions - float64_reference).max() <= FP32_ACTION_ATOL, rows


@pytest.mark.parametrize("engine_name", ENGINES)
def test_distribution_outputs_match_the_torch_engine(policy: tuple, engine_name: str) -> None:
    agent, obs, _ = policy
    engine, reference_engine = ENGINES[engine_name](agent), ENGINES["torch"](agent)
    for rows in (1, 3, 1025):
        mu, log_sigma = engine.forward((obs[:rows],))
        expected_mu, expected_log_sigma = reference_engine.forward((obs[:rows],))
        assert mu.dtype == torch.float32 and mu.shape == (rows, 21)
        assert float((mu - expected_mu).abs().max()) <= FP32_ACTION_ATOL
        assert log_sigma.shape == (1, 21)  # PPO's shared log sigma passes through, unpadded
        torch.testing.assert_close(log_sigma, expected_log_sigma, rtol=0, atol=0)


@pytest.mark.parametrize("file_format", ["onnx", "pt"])
def test_named_engines_through_the_agent(file_format: str) -> None:
    path = _policy_file("ppo_baseline", file_format)
    names = ("auto", "torch", "onnxruntime", *(("native",) if mlp_kernels() else ()))
    agents = {name: HuggyAgent(path, device="cpu", engine=name) for name in names}
    obs = canonical_observations(agents["torch"].loaded, 64, seed=1)
    expected = agents["torch"].compute_action(obs, deterministic=False, seed=3)
    for name, agent in agents.items():
        assert agent.engine == (AUTO_CPU if name == "auto" else name)
        stochastic = agent.compute_action(obs, deterministic=False, seed=3)
        assert np.abs(stochastic - expected).max() <= FP32_ACTION_ATOL, name
        dist = agent.distribution(obs)
        np.testing.assert_array_equal(agent.actions_from(dist[5:9], False, seed=3, row_offset=5),
                                      agent.actions_from(dist, False, seed=3)[5:9])


def test_sac_head_and_per_row_log_sigma_in_every_engine(tmp_path: Path) -> None:
    """A SAC checkpoint (state-dependent log sigma: a per-row output) through every engine."""
    checkpoint = torch.load(_policy_file("ppo_baseline", "pt"), weights_only=True)
    policy = dict(checkpoint["Policy"])
    prefix = "action_model._continuous_distribution."
    del policy[f"{prefix}log_sigma"]
    generator = torch.Generator().manual_seed(0)
    policy[f"{prefix}log_sigma.weight"] = torch.randn(21, 512, generator=generator) * 0.02
    policy[f"{prefix}log_sigma.bias"] = torch.linspace(-25.0, 4.0, 21)
    path = tmp_path / "Huggy-2000343.pt"
    torch.save({**checkpoint, "Policy": policy}, path)
    agent = HuggyAgent(path, device="cpu", engine="torch")
    obs = canonical_observations(agent.loaded, 1025, seed=2)
    noise = gaussian_noise(4, len(obs), 21)
    for name, make in ENGINES.items():
        engine = make(agent)
        for given in (None, noise):
            expected = float64_actions(agent.loaded, obs, given)
            assert np.abs(engine.act((obs,), given) - expected).max() <= FP32_ACTION_ATOL, name
        assert engine.forward((obs[:3],))[1].shape == (3, 21), name


# --- auto: a fixed rule -------------------------------------------------------------------------

@pytest.mark.parametrize(("device", "precision", "onnxruntime", "graphs", "native", "expected"), [
    ("cpu", "fp32", True, False, True, "native"),
    ("cpu", "fp32", False, False, True, "native"),
    ("cpu", "bf16", True, False, True, "torch"),
    ("cuda", "fp32", False, True, True, "cuda-graph"),
    ("cpu", "fp32", True, False, False, "onnxruntime"),
    ("cpu", "fp32", False, False, False, "torch"),
    ("cpu", "bf16", True, False, False, "torch"),
    ("cpu", "fp16", True, False, False, "torch"),
    ("cuda", "fp32", False, True, False, "cuda-graph"),
    ("cuda", "bf16", False, True, False, "cuda-graph"),
    ("cuda", "fp32", False, False, False, "torch"),
    ("npu", "fp32", False, True, False, "npu-graph"),
    ("npu", "fp16", False, False, False, "torch"),
])
def test_auto_rule(device: str, precision: str, onnxruntime: bool, graphs: bool, native: bool,
                   expected: str) -> None:
    assert auto_engine(device, precision, onnxruntime=onnxruntime, graphs=graphs,
                       native=native) == expected


def test_auto_is_the_default_and_resolves_the_same_way_every_time() -> None:
    assert inspect.signature(HuggyAgent).parameters["engine"].default == "auto"
    assert inspect.signature(HuggyAgent.from_checkpoint).parameters["engine"].default == "auto"
    cpu = torch.device("cpu")
    net = HuggyAgent(device="cpu", engine="torch").net
    assert {resolve_engine("auto", cpu, "fp32", net) for _ in range(5)} == {AUTO_CPU}
    assert resolve_engine("auto", cpu, "fp32") == "onnxruntime"  # a network of unknown shape
    assert HuggyAgent(device="cpu").engine == AUTO_CPU
    assert HuggyAgent(device="cpu", precision="bf16").engine == "torch"
    info = HuggyAgent(device="cpu").describe()
    assert info["engine"] == AUTO_CPU and "onnxruntime" in info["engine_detail"]
    assert info["engine_reason"] == auto_choice("cpu", "fp32", onnxruntime=True, graphs=False,
                                                native=AUTO_CPU == "native")[1]


@pytest.mark.parametrize(("device", "precision", "onnxruntime", "graphs", "expected"), [
    ("cpu", "fp32", True, False, ("onnxruntime", "auto: onnxruntime for fp32 on the CPU")),
    ("cpu", "fp32", False, False,
     ("torch", "auto: torch on the CPU (onnxruntime is not installed)")),
    ("cpu", "bf16", True, False,
     ("torch", "auto: torch for bf16 layers on the CPU (onnxruntime runs fp32)")),
    ("cuda", "fp16", False, True,
     ("cuda-graph", "auto: cuda-graph on cuda, each captured batch size checked against eager "
                    "torch")),
    ("npu", "fp32", False, False,
     ("torch", "auto: torch on npu (its torch module offers no graph capture)")),
])
def test_auto_says_why_it_picks_an_engine(device: str, precision: str, onnxruntime: bool,
                                          graphs: bool, expected: tuple[str, str]) -> None:
    assert auto_choice(device, precision, onnxruntime=onnxruntime, graphs=graphs) == expected


@pytest.mark.parametrize(("onnxruntime", "batches"), [(True, "onnxruntime"), (False, "torch")])
def test_auto_says_why_it_picks_native(onnxruntime: bool, batches: str) -> None:
    assert auto_choice("cpu", "fp32", onnxruntime=onnxruntime, graphs=False, native=True) == (
        "native", "auto: native for an MLP policy on a CPU with AVX2 (compiled kernels for 1 "
                  f"observation, {batches} for larger batches)")


def test_an_engine_asked_for_by_name_says_so() -> None:
    agent = HuggyAgent(device="cpu", engine="torch")
    assert (agent.engine, agent.engine_reason) == ("torch", "torch, as asked")
    assert choose_engine("onnxruntime", torch.device("cpu"), "fp32") == (
        "onnxruntime", "onnxruntime, as asked")


@pytest.mark.parametrize(("name", "precision", "message"), [
    ("tensorrt", "fp32", "unknown engine 'tensorrt'; expected one of auto, torch, onnxruntime, "
                         "native, cuda-graph, npu-graph"),
    ("onnxruntime", "bf16", "the onnxruntime engine runs fp32 on the CPU, not bf16 on cpu"),
    ("native", "fp16", "the native engine runs fp32 on the CPU, not fp16 on cpu"),
    ("cuda-graph", "fp32", "the cuda-graph engine needs a cuda device with graph capture, not cpu"),
    ("npu-graph", "fp32", "the npu-graph engine needs a npu device with graph capture, not cpu"),
])
def test_engines_that_cannot_run_are_refused(name: str, precision: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        HuggyAgent(device="cpu", precision=precision, engine=name)


# --- NPU selection, without an NPU (torch-npu must never be installed here) -------------------

def _device_module(*, graph_class: str | None, missing: str | None = None) -> SimpleNamespace:
    """A stand-in for torch.npu as torch-npu shapes it: CUDA's graph API under NPU names."""
    members = {name: object() for name in GRAPH_MODULE_API if name != missing}
    if graph_class is not None:
        members[graph_class] = type(graph_class, (), {})
    return SimpleNamespace(**members)


def test_npu_graphs_are_used_where_torch_npu_offers_npugraph() -> None:
    module = _device_module(graph_class="NPUGraph")
    found = graph_backend("npu", module)  # type: ignore[arg-type]
    assert found is not None and found[0] is module and found[1].__name__ == "NPUGraph"
    assert auto_engine("npu", "fp32", onnxruntime=False, graphs=found is not None) == "npu-graph"


@pytest.mark.parametrize("module", [
    None,  # torch-npu absent: no torch.npu at all
    _device_module(graph_class=None),  # a torch-npu without NPUGraph: eager
    _device_module(graph_class="NPUGraph", missing="graph_pool_handle"),
    _device_module(graph_class="CUDAGraph"),  # CUDA's class name does not count for an NPU
], ids=["no-torch-npu", "no-NPUGraph", "no-pool-handle", "wrong-class"])
def test_npu_without_graph_capture_runs_eager(module: SimpleNamespace | None) -> None:
    found = graph_backend("npu", module)  # type: ignore[arg-type]
    assert found is None
    assert auto_engine("npu", "fp32", onnxruntime=False, graphs=found is not None) == "torch"


def test_this_machine_has_no_npu_graphs() -> None:
    assert graph_backend("npu", getattr(torch, "npu", None)) is None  # no torch-npu here
    assert device_graphs(torch.device("cpu")) is None


# --- networks of other shapes ---------------------------------------------------------------------

class _TwoInputNet(nn.Module):
    """An image (N, 3, 8, 8) and a vector (N, 5) in; a per-row (N, 2), a shared (1, 2) and a
    per-row rank-3 (N, 1, 3) output out: what multi-input and recurrent policies look like."""

    def __init__(self) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.conv = nn.Conv2d(3, 4, 3, stride=2)
        self.head = nn.Linear(4 * 3 * 3 + 5, 8)
        self.out = nn.Linear(8, 2)
        self.memory = nn.Linear(8, 3)
        self.shared = nn.Parameter(torch.randn(1, 2, generator=generator))
        for parameter in self.parameters():
            parameter.data = torch.randn(parameter.shape, generator=generator) * 0.3
        self.requires_grad_(False).eval()

    def forward(self, image: torch.Tensor, vector: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = torch.cat([torch.relu(self.conv(image)).flatten(1), vector], dim=1)
        hidden = torch.tanh(self.head(x))
        return self.out(hidden), self.shared, self.memory(hidden)[:, None, :]


class _FirstOutputHead:
    """A head for the toy network: tanh of output 0 (plus noise)."""

    def torch(self, outputs: tuple[torch.Tensor, ...], noise: torch.Tensor | None) -> torch.Tensor:
        return torch.tanh(outputs[0] if noise is None else outputs[0] + noise)

    def numpy(self, outputs: tuple[np.ndarray, ...], noise: np.ndarray | None) -> np.ndarray:
        return np.tanh(outputs[0] if noise is None else outputs[0] + noise)


@pytest.mark.parametrize("engine_class", ["torch", "onnxruntime", "graph"])
def test_engines_run_networks_of_any_input_and_output_shapes(engine_class: str) -> None:
    net, head, cpu = _TwoInputNet(), _FirstOutputHead(), torch.device("cpu")
    shapes = ((3, 8, 8), (5,))
    engine: Engine = {
        "torch": lambda: TorchEngine(net, shapes, cpu, head),
        "onnxruntime": lambda: OnnxRuntimeEngine(net, shapes, cpu, head),
        "graph": lambda: GraphEngine(net, shapes, cpu, head, CpuGraphs(), max_rung=4),
    }[engine_class]()
    rng = np.random.default_rng(1)
    for rows in (1, 3, 4, 11):
        inputs = (rng.standard_normal((rows, 3, 8, 8)).astype(np.float32),
                  rng.standard_normal((rows, 5)).astype(np.float32))
        with torch.inference_mode():
            expected = net(*(torch.from_numpy(array) for array in inputs))
        outputs = engine.forward(inputs)
        assert [tuple(o.shape) for o in outputs] == [(rows, 2), (1, 2), (rows, 1, 3)]
        for got, want in zip(outputs, expected, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        noise = rng.standard_normal((rows, 2)).astype(np.float32)
        np.testing.assert_allclose(engine.act(inputs, noise),
                                   np.tanh(expected[0].numpy() + noise), rtol=1e-5, atol=1e-5)


def test_an_output_that_is_neither_per_row_nor_shared_is_refused() -> None:
    class Odd(nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
            return (x.sum(dim=0, keepdim=True).expand(2, -1),)

    with pytest.raises(ValueError, match=re.escape(
            "network output 0 has shape (2, 4) for a batch of 3 rows: expected a first dimension "
            "of 3 (per-row) or 1 (shared by every row)")):
        OnnxRuntimeEngine(Odd(), ((4,),), torch.device("cpu"), _FirstOutputHead())


# --- the benchmark ----------------------------------------------------------------------------

def test_benchmark_prints_every_engine_beside_the_references(
        capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    from huggy_agent.cli import main

    monkeypatch.setattr(benchmark, "SETTLE_S", 0.0)  # the pause only steadies the figures
    threads = torch.get_num_threads()
    try:
        assert main(["benchmark", "--engine", "all", "--rounds", "1", "--calls", "10",
                     "--batch", "64", "--threads", "1"]) == 0
    finally:
        torch.set_num_threads(threads)  # the benchmark sets the process's thread count
    out = capsys.readouterr().out
    rows = {line.split("  ")[0] for line in out.splitlines()}
    assert {"huggy compute_action", "onnxruntime", "torch eager Sequential",
            "huggy compute_action [torch, cpu]"} <= rows
    assert f"auto runs {AUTO_CPU} on the CPU (row 'huggy compute_action')" in out
    assert {"huggy compute_action, stochastic", "onnxruntime, stochastic"} <= rows
    assert "stochastic ours/onnxruntime p50: " in out and "batch 64 ours/onnxruntime: " in out
    for engine in ("auto (cpu)", "torch (cpu)"):  # load and first call
        assert any(line.startswith(engine) for line in out.splitlines()), engine
