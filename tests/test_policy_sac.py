"""The SAC head: a checkpoint whose log sigma is a Linear layer acts with tanh, not clip-and-divide.

The checkpoint is the baseline's with its `log_sigma` parameter replaced by a Linear(512 -> 21)
layer, as ML-Agents' SAC actor stores it; actions are checked against a float64 forward of the
raw tensors.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from huggy_agent import HuggyAgent
from huggy_agent.noise import gaussian_noise
from huggy_agent.numerics import FP32_ACTION_ATOL
from tests.support.fixtures import fixtures_dir
from tests.support.policy_reference import (
    DIST,
    ReferencePolicy,
    RowsPart,
    normalizer_observations,
    ppo_actions,
    sac_actions,
)

pytestmark = pytest.mark.numerics  # rerun by .ci/run under other CPU kernel paths

BASELINE_PT = fixtures_dir() / "ppo_baseline" / "Huggy" / "Huggy-2000343.pt"
BASELINE_ONNX = fixtures_dir() / "ppo_baseline" / "Huggy.onnx"


@pytest.fixture(scope="module")
def sac_policy() -> dict:
    """The baseline's Policy dict with a state-dependent log sigma whose raw values span
    [-25, 4], so both ends of the [-20, 2] clamp are reached."""
    checkpoint = torch.load(BASELINE_PT, map_location="cpu", weights_only=True)
    policy = dict(checkpoint["Policy"])
    del policy[f"{DIST}log_sigma"]
    generator = torch.Generator().manual_seed(0)
    policy[f"{DIST}log_sigma.weight"] = torch.randn(21, 512, generator=generator) * 0.02
    policy[f"{DIST}log_sigma.bias"] = torch.linspace(-25.0, 4.0, 21)
    return {**checkpoint, "Policy": policy}


@pytest.fixture(scope="module")
def sac_path(sac_policy: dict, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("sac") / "Huggy-2000343.pt"
    torch.save(sac_policy, path)
    return path


@pytest.fixture(scope="module")
def reference(sac_policy: dict) -> ReferencePolicy:
    return ReferencePolicy.from_checkpoint_policy(sac_policy["Policy"])


@pytest.fixture(scope="module")
def observations() -> np.ndarray:
    return normalizer_observations(BASELINE_ONNX, 200, seed=12)


def test_sac_checkpoint_is_read_as_a_sac_head(sac_path: Path) -> None:
    description = HuggyAgent.from_checkpoint(sac_path, device="cpu").describe()
    assert description["architecture"]["head"] == "sac"
    counts = description["parameters"]
    assert counts["body"] + counts["heads"] == 566_805
    assert (counts["log_sigma"], counts["normalizer"]) == (21 * 512 + 21, 2 * 59)


def test_deterministic_is_tanh_of_mu(sac_path: Path, reference: ReferencePolicy,
                                     observations: np.ndarray) -> None:
    mu, log_sigma = reference.forward(observations)
    actions = HuggyAgent.from_checkpoint(sac_path, device="cpu").compute_action(observations)
    assert np.abs(actions - sac_actions(mu, log_sigma)).max() <= 1e-5
    # The PPO head on the same mu is a different function here (|mu| is often above 0.5).
    assert np.abs(ppo_actions(mu, log_sigma) - sac_actions(mu, log_sigma)).max() > 0.05


def test_stochastic_is_tanh_of_mu_plus_clamped_state_dependent_sigma(
        sac_path: Path, reference: ReferencePolicy, observations: np.ndarray) -> None:
    mu, log_sigma = reference.forward(observations)
    assert log_sigma.min() < -20 and log_sigma.max() > 2  # both clamp ends are exercised
    z = gaussian_noise(6, len(observations), 21, row_offset=50)
    expected = sac_actions(mu, log_sigma, z)
    agent = HuggyAgent.from_checkpoint(sac_path, device="cpu")
    actions = agent.compute_action(observations, deterministic=False, seed=6, row_offset=50)
    assert np.abs(actions - expected).max() <= 1e-5
    # Without the clamp, or with a state-independent sigma, the test would see it.
    assert np.abs(sac_actions(mu, log_sigma, z, clamp=False) - expected).max() > 1e-3
    shared = np.broadcast_to(log_sigma.mean(axis=0), log_sigma.shape)
    assert np.abs(sac_actions(mu, shared, z) - expected).max() > 1e-3


def test_sac_distribution_slices_row_by_row(sac_path: Path, observations: np.ndarray) -> None:
    agent = HuggyAgent.from_checkpoint(sac_path, device="cpu")
    dist = agent.distribution(observations)
    assert dist.log_sigma.shape == (len(observations), 21)
    whole = agent.actions_from(dist, deterministic=False, seed=3)
    # exp and tanh run over tensors of other sizes here (vectorized bodies and scalar tails can
    # round differently), so the slices agree within the contract rather than bit for bit.
    for start, stop in [(0, 1), (1, 2), (2, 200)]:
        piece = agent.actions_from(dist[start:stop], False, seed=3, row_offset=start)
        assert np.abs(piece - whole[start:stop]).max() <= FP32_ACTION_ATOL


def test_sac_actions_of_parts_follow_each_parts_seed(sac_path: Path,
                                                     observations: np.ndarray) -> None:
    agent = HuggyAgent.from_checkpoint(sac_path, device="cpu")
    dist = agent.distribution(observations[:30])
    parts = [(10, True, None, 0), (15, False, 4, 100), (5, False, 9, 0)]
    answers = agent.actions_of_parts(dist, [RowsPart(*part) for part in parts])
    mu = dist.mu.numpy().astype(np.float64)
    log_sigma = dist.log_sigma.numpy().astype(np.float64)
    start = 0
    for (rows, deterministic, seed, offset), answer in zip(parts, answers, strict=True):
        part = slice(start, start + rows)
        z = None if deterministic else gaussian_noise(seed, rows, 21, offset)
        # Each part's rows of its own state-dependent sigma (tanh and exp ran over other sizes:
        # within the contract, not bit for bit).
        assert np.abs(answer - sac_actions(mu[part], log_sigma[part], z)).max() <= FP32_ACTION_ATOL
        start += rows

