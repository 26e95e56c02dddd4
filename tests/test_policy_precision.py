"""fp16 and bf16: the layers follow the precision, the normalizer stays float32 (and must)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from huggy_agent import HuggyAgent
from tests.support.fixtures import FIXTURE_RUNS, fixtures_dir
from tests.support.policy_reference import NORMALIZER, ReferencePolicy, normalizer_observations, ppo_actions

pytestmark = pytest.mark.numerics  # rerun by .ci/run under other CPU kernel paths

BASELINE_PT = fixtures_dir() / "ppo_baseline" / "Huggy" / "Huggy-2000343.pt"
BASELINE_ONNX = fixtures_dir() / "ppo_baseline" / "Huggy.onnx"
FLOAT16_MAX = 65504.0
# The bounds `huggy precision` must meet: max abs error against a float64 forward.
TOLERANCES = {"fp32": 1e-5, "fp16": 5e-3, "bf16": 5e-2}


@pytest.fixture(scope="module")
def checkpoint_policy() -> dict:
    return torch.load(BASELINE_PT, map_location="cpu", weights_only=True)["Policy"]


@pytest.fixture(scope="module")
def reference(checkpoint_policy: dict) -> ReferencePolicy:
    return ReferencePolicy.from_checkpoint_policy(checkpoint_policy)


def _large_observations() -> np.ndarray:
    """Observations far outside the training range, some beyond float16's largest value."""
    signs = np.where(np.random.default_rng(4).random((6, 59)) < 0.5, -1.0, 1.0)
    magnitudes = np.array([1e4, 6e4, 1e5, 1e6, 1e20, 3e38])[:, None]
    return (signs * magnitudes).astype(np.float32)


@pytest.mark.parametrize("precision", list(TOLERANCES))
@pytest.mark.parametrize("run", FIXTURE_RUNS)
def test_error_against_float64_is_within_the_precision_bound(run: str, precision: str) -> None:
    onnx_path = fixtures_dir() / run / "Huggy.onnx"
    obs = normalizer_observations(BASELINE_ONNX, 1000, seed=3)
    mu, log_sigma = ReferencePolicy.from_onnx(onnx_path).forward(obs)
    agent = HuggyAgent.from_checkpoint(onnx_path, device="cpu", precision=precision)
    actions = agent.compute_action(obs)
    assert actions.dtype == np.float32
    error = np.abs(actions - ppo_actions(mu, log_sigma)).max()
    assert error <= TOLERANCES[precision]
    if precision != "fp32":  # the precision really is lower: not an fp32 run under another name
        assert error > 1e-5


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_large_observations_give_finite_actions_close_to_float64(reference: ReferencePolicy,
                                                                 precision: str) -> None:
    obs = _large_observations()
    agent = HuggyAgent.from_checkpoint(BASELINE_PT, device="cpu", precision=precision)
    for deterministic in (True, False):
        actions = agent.compute_action(obs, deterministic=deterministic, seed=2)
        assert np.all(np.isfinite(actions)), (precision, deterministic)
    mu, log_sigma = reference.forward(obs)
    assert np.abs(agent.compute_action(obs) - ppo_actions(mu, log_sigma)).max() <= (
        TOLERANCES[precision])


def test_a_float16_normalizer_would_overflow(checkpoint_policy: dict,
                                             reference: ReferencePolicy) -> None:
    """ML-Agents keeps a running sum of squares and a step count: both overflow float16."""
    variance = checkpoint_policy[f"{NORMALIZER}running_variance"]
    steps = checkpoint_policy[f"{NORMALIZER}normalization_steps"]
    assert variance.max() > FLOAT16_MAX and steps > FLOAT16_MAX
    std16 = torch.sqrt(variance.half() / steps.half())  # inf / inf = nan, finite / inf = 0
    assert not torch.isfinite(std16).all()
    obs = normalizer_observations(BASELINE_ONNX, 16, seed=1)
    half_normalized = ReferencePolicy(
        (reference.normalizer[0], std16.double().numpy()), reference.layers, reference.mu,
        reference.log_sigma)
    with np.errstate(divide="ignore", invalid="ignore"):
        mu16, log_sigma = half_normalized.forward(obs)
    assert np.isnan(ppo_actions(mu16, log_sigma)).any()
    # Observations beyond float16's range turn into inf before any normalizer sees them.
    assert torch.isinf(torch.from_numpy(_large_observations()).half()).any()


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_our_normalizer_stays_float32_in_every_precision(precision: str) -> None:
    fp32 = HuggyAgent.from_checkpoint(BASELINE_PT, device="cpu")
    low = HuggyAgent.from_checkpoint(BASELINE_PT, device="cpu", precision=precision)
    assert low.net.layer_dtype == {"fp16": torch.float16, "bf16": torch.bfloat16}[precision]
    for name in ("running_mean", "std"):
        buffer = getattr(_normalizer(low), name)
        assert buffer.dtype == torch.float32
        # Bit-equal values, not float32 copies of float16-rounded ones.
        assert torch.equal(buffer, getattr(_normalizer(fp32), name)), name
    obs = normalizer_observations(BASELINE_ONNX, 256, seed=9)
    actions = low.compute_action(obs)
    assert np.all(np.isfinite(actions))
    assert np.abs(actions - fp32.compute_action(obs)).max() <= TOLERANCES[precision]


def test_normalizer_survives_moves_and_casts_after_loading() -> None:
    agent = HuggyAgent.from_checkpoint(BASELINE_ONNX, device="cpu")
    mean = _normalizer(agent).running_mean.clone()
    agent.net.half().to(torch.bfloat16).float()
    assert _normalizer(agent).running_mean.dtype == torch.float32
    assert torch.equal(_normalizer(agent).running_mean, mean)


def _normalizer(agent: HuggyAgent) -> torch.nn.Module:
    return agent.net.network_body.observation_encoder.processors[0].normalizer
