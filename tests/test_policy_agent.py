"""HuggyAgent at its boundary: input kinds and ranks, validation messages, devices, precisions."""

from __future__ import annotations

import hashlib
import importlib.util
import re

import numpy as np
import onnxruntime as ort
import pytest
import torch

from huggy_agent import HuggyAgent, bundled_policy_path
from huggy_agent.devices import resolve_device, resolve_precision
from huggy_agent.numerics import FP32_ACTION_ATOL
from tests.support.fixtures import fixtures_dir

pytestmark = pytest.mark.numerics  # rerun by .ci/run under other CPU kernel paths


@pytest.fixture(scope="module")
def agent() -> HuggyAgent:
    return HuggyAgent(device="cpu")


@pytest.fixture(scope="module")
def observations() -> np.ndarray:
    return np.random.default_rng(11).standard_normal((5, 59)).astype(np.float32)


def _onnxruntime(obs: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(fixtures_dir() / "ppo_baseline" / "Huggy.onnx"),
                                   providers=["CPUExecutionProvider"])
    return session.run(["deterministic_continuous_actions"], {"obs_0": obs})[0]


def test_bundled_policy_is_the_baseline_fixture_byte_for_byte() -> None:
    digest = hashlib.sha256(bundled_policy_path().read_bytes()).hexdigest()
    assert digest.startswith("079bcc52") and digest.endswith("beb65f")  # fixture README
    assert bundled_policy_path().read_bytes() == (
        fixtures_dir() / "ppo_baseline" / "Huggy.onnx").read_bytes()


def test_default_agent_acts_like_the_bundled_onnx(agent: HuggyAgent,
                                                  observations: np.ndarray) -> None:
    assert np.abs(agent.compute_action(observations) - _onnxruntime(observations)).max() <= 1e-5


@pytest.mark.parametrize("kind", ["list", "numpy32", "numpy64", "torch", "torch-grad", "tuple"])
def test_accepts_lists_numpy_and_torch(agent: HuggyAgent, observations: np.ndarray,
                                       kind: str) -> None:
    given = {
        "list": lambda: observations.tolist(),
        "numpy32": lambda: observations,
        "numpy64": lambda: observations.astype(np.float64),
        "torch": lambda: torch.from_numpy(observations),
        "torch-grad": lambda: torch.from_numpy(observations).requires_grad_(True),
        "tuple": lambda: tuple(tuple(row) for row in observations.tolist()),
    }[kind]()
    actions = agent.compute_action(given)
    assert isinstance(actions, np.ndarray) and actions.dtype == np.float32
    assert actions.shape == (5, 21)
    assert np.abs(actions - agent.compute_action(observations)).max() <= FP32_ACTION_ATOL


@pytest.mark.parametrize("deterministic", [True, False])
def test_single_observation_gives_one_action_row(agent: HuggyAgent, observations: np.ndarray,
                                                 deterministic: bool) -> None:
    single = agent.compute_action(observations[2], deterministic=deterministic, seed=4,
                                  row_offset=2)
    batch = agent.compute_action(observations, deterministic=deterministic, seed=4)
    assert single.shape == (21,) and single.dtype == np.float32
    # Equal within the contract: a batch of one and a batch of five take different matmul paths.
    np.testing.assert_allclose(single, batch[2], rtol=0, atol=FP32_ACTION_ATOL)
    assert agent.compute_action(observations[2].tolist()).shape == (21,)


def test_batch_of_one_keeps_its_batch_dimension(agent: HuggyAgent,
                                                observations: np.ndarray) -> None:
    assert agent.compute_action(observations[:1]).shape == (1, 21)


def test_actions_lie_in_minus_one_one(agent: HuggyAgent) -> None:
    wild = np.random.default_rng(2).standard_normal((256, 59)).astype(np.float32) * 50
    for deterministic in (True, False):
        actions = agent.compute_action(wild, deterministic=deterministic, seed=1)
        assert np.all(np.abs(actions) <= 1.0)
        assert np.mean(np.abs(actions) == 1.0) > 0  # the clip is reached, and holds


def test_large_batches_match_onnxruntime_and_their_own_splits(agent: HuggyAgent) -> None:
    """Large batches (run in chunks on the CPU) agree with onnxruntime and with their splits."""
    obs = np.random.default_rng(9).standard_normal((2600, 59)).astype(np.float32)
    session = ort.InferenceSession(str(bundled_policy_path()), providers=["CPUExecutionProvider"])
    (reference,) = session.run(["deterministic_continuous_actions"], {"obs_0": obs})
    whole = agent.compute_action(obs, deterministic=False, seed=2)
    assert np.abs(agent.compute_action(obs) - reference).max() <= 1e-5
    split = np.concatenate([agent.compute_action(obs[:1025], deterministic=False, seed=2),
                            agent.compute_action(obs[1025:], deterministic=False, seed=2,
                                                 row_offset=1025)])
    assert np.abs(split - whole).max() <= FP32_ACTION_ATOL


def test_input_is_not_modified(agent: HuggyAgent, observations: np.ndarray) -> None:
    given = observations.copy()
    agent.compute_action(given, deterministic=False, seed=3)
    np.testing.assert_array_equal(given, observations)


def test_compute_action_is_actions_from_distribution(agent: HuggyAgent,
                                                     observations: np.ndarray) -> None:
    dist = agent.distribution(observations)
    assert len(dist) == 5
    deterministic = agent.compute_action(observations)
    assert np.abs(agent.actions_from(dist, deterministic=True) - deterministic).max() \
        <= FP32_ACTION_ATOL
    stochastic = agent.compute_action(observations, deterministic=False, seed=9)
    assert np.abs(agent.actions_from(dist, deterministic=False, seed=9) - stochastic).max() \
        <= FP32_ACTION_ATOL
    # A slice of the distribution with its row offset acts exactly like the same rows of the
    # whole distribution (elementwise IEEE operations on the same mu).
    np.testing.assert_array_equal(agent.actions_from(dist[1:4], False, seed=9, row_offset=1),
                                  agent.actions_from(dist, False, seed=9)[1:4])


# --- validation at the boundary -----------------------------------------------------------------

@pytest.mark.parametrize(("shape", "shown"), [
    ((58,), "(58,)"), ((3, 58), "(3, 58)"), ((2, 3, 59), "(2, 3, 59)"), ((0, 59), "(0, 59)"),
    ((0,), "(0,)"), ((), "()"),
])
def test_wrong_shape_names_expected_and_received(agent: HuggyAgent, shape: tuple,
                                                 shown: str) -> None:
    message = ("observation shape mismatch: expected (59,) or (N, 59) with N >= 1, "
               f"received {shown}")
    with pytest.raises(ValueError, match=re.escape(message)):
        agent.compute_action(np.zeros(shape, dtype=np.float32))


def test_empty_list_is_a_shape_error(agent: HuggyAgent) -> None:
    with pytest.raises(ValueError, match=re.escape("expected (59,) or (N, 59) with N >= 1, "
                                                   "received (0,)")):
        agent.compute_action([])


@pytest.mark.parametrize(("value", "shown"), [(np.nan, "nan"), (np.inf, "inf"),
                                              (-np.inf, "-inf")])
def test_non_finite_value_names_row_and_column(agent: HuggyAgent, observations: np.ndarray,
                                               value: float, shown: str) -> None:
    bad = observations.copy()
    bad[3, 41] = value
    bad[4, 0] = value  # only the first offending entry is named
    with pytest.raises(ValueError, match=re.escape(
            f"observation must be finite: received {shown} at row 3, column 41")):
        agent.compute_action(bad)


def test_non_finite_single_observation_is_row_zero(agent: HuggyAgent) -> None:
    obs = np.zeros(59, dtype=np.float32)
    obs[7] = np.nan
    with pytest.raises(ValueError, match=re.escape("received nan at row 0, column 7")):
        agent.compute_action(obs)


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")
def test_float64_overflowing_float32_is_non_finite(agent: HuggyAgent) -> None:
    obs = np.zeros(59, dtype=np.float64)
    obs[5] = 1e300  # finite in float64, inf once in float32: refused, not silently clamped
    with pytest.raises(ValueError, match=re.escape("received inf at row 0, column 5")):
        agent.compute_action(obs)


def test_reset_tuple_gets_a_hint(agent: HuggyAgent) -> None:
    with pytest.raises(ValueError, match=re.escape(
            "got an (observation, info) tuple, as returned by env.reset(); pass the observation "
            "alone: obs, info = env.reset()")):
        agent.compute_action((np.zeros((18, 59), dtype=np.float32), {}))


@pytest.mark.parametrize("given", [["a"] * 59, [[0.0] * 59, [0.0] * 58]],
                         ids=["strings", "ragged"])
def test_unconvertible_input_says_what_was_expected(agent: HuggyAgent, given: list) -> None:
    with pytest.raises(ValueError, match=re.escape(
            "observation must be numeric with shape (59,) or (N, 59); could not convert it")):
        agent.compute_action(given)


# --- devices and precisions -------------------------------------------------------------------

def _present_kinds() -> list[str]:
    """Device kinds present here, found without huggy_agent (torch-npu installed means an NPU
    machine: installed elsewhere it breaks `import torch`, as the README warns)."""
    npu = importlib.util.find_spec("torch_npu") is not None
    return [*(["npu"] if npu else []), *(["cuda"] if torch.cuda.is_available() else []), "cpu"]


def test_auto_picks_the_best_present_device() -> None:
    best = _present_kinds()[0]
    assert resolve_device("auto") == torch.device(best if best == "cpu" else f"{best}:0")


def test_cpu_resolves_and_the_agent_runs_there() -> None:
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(torch.device("cpu")) == torch.device("cpu")
    agent = HuggyAgent(device="cpu")
    assert agent.device == torch.device("cpu")
    assert agent.describe()["device"] == "cpu"
    assert all(p.device.type == "cpu" for p in agent.net.parameters())


@pytest.mark.parametrize("spec", ["tpu", "gpu", "cuda:x", "npu:-1", "cuda:0:1", ""])
def test_unknown_device_spelling(spec: str) -> None:
    with pytest.raises(ValueError, match=re.escape(
            f"unknown device {spec!r}; expected one of auto, cpu, cuda[:N], npu[:N]")):
        resolve_device(spec)


def test_agent_refuses_an_unknown_device() -> None:
    with pytest.raises(ValueError, match=re.escape("unknown device 'gpu:0'; expected one of")):
        HuggyAgent(device="gpu:0")


@pytest.mark.parametrize("kind", ["cuda", "npu"])
def test_absent_device_is_a_runtime_error_naming_what_is_available(kind: str) -> None:
    present = _present_kinds()
    # An index past the last device is absent on every machine; a whole kind only where missing.
    spec = kind if kind not in present else f"{kind}:{torch.cuda.device_count()}"
    with pytest.raises(RuntimeError, match=re.escape(f"device {spec!r} requested but")) as caught:
        HuggyAgent(device=spec)
    if kind not in present:
        assert str(caught.value).endswith(f"available: {', '.join(present)}")


def test_unknown_precision() -> None:
    with pytest.raises(ValueError, match=re.escape(
            "unknown precision 'fp8'; expected one of fp32, fp16, bf16")):
        HuggyAgent(device="cpu", precision="fp8")


@pytest.mark.parametrize(("name", "dtype"), [("fp32", torch.float32), ("fp16", torch.float16),
                                             ("bf16", torch.bfloat16)])
def test_precision_sets_the_layer_dtype(name: str, dtype: torch.dtype) -> None:
    assert resolve_precision(name) == dtype
    agent = HuggyAgent(device="cpu", precision=name)
    assert agent.precision == name
    assert {p.dtype for p in agent.net.parameters()} == {dtype}
