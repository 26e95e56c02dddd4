"""Stochastic actions: the counter-based host noise, seeds, row offsets, and the PPO head in float64."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from huggy_agent import HuggyAgent
from huggy_agent.devices import available_devices
from huggy_agent.noise import gaussian_noise
from tests.conftest import fixtures_dir
from tests.policy_reference import ReferencePolicy, normalizer_observations, ppo_actions

BASELINE_ONNX = fixtures_dir() / "ppo_baseline" / "Huggy.onnx"


@pytest.fixture(scope="module")
def agent() -> HuggyAgent:
    return HuggyAgent.from_checkpoint(BASELINE_ONNX, device="cpu")


@pytest.fixture(scope="module")
def observations() -> np.ndarray:
    return normalizer_observations(BASELINE_ONNX, 64, seed=5)


# --- the noise stream itself --------------------------------------------------------------------

def test_noise_is_float32_and_reproducible() -> None:
    first = gaussian_noise(123, 8, 21)
    assert first.dtype == np.float32 and first.shape == (8, 21)
    np.testing.assert_array_equal(first, gaussian_noise(123, 8, 21))


def test_noise_of_a_row_depends_only_on_seed_and_absolute_row() -> None:
    whole = gaussian_noise(42, 100, 21)
    pieces = [gaussian_noise(42, stop - start, 21, row_offset=start)
              for start, stop in [(0, 1), (1, 37), (37, 38), (38, 100)]]
    np.testing.assert_array_equal(np.concatenate(pieces), whole)
    np.testing.assert_array_equal(gaussian_noise(42, 1, 21, row_offset=10**12)[0],
                                  gaussian_noise(42, 3, 21, row_offset=10**12 - 2)[2])


def test_different_seeds_and_rows_give_unrelated_noise() -> None:
    a, b = gaussian_noise(1, 500, 21), gaussian_noise(2, 500, 21)
    assert not np.any(a == b)
    assert abs(np.corrcoef(a.ravel(), b.ravel())[0, 1]) < 0.03
    # Neighbouring rows and columns are not copies or shifts of each other.
    assert abs(np.corrcoef(a[:-1].ravel(), a[1:].ravel())[0, 1]) < 0.03
    assert abs(np.corrcoef(a[:, :-1].ravel(), a[:, 1:].ravel())[0, 1]) < 0.03
    assert len(np.unique(a)) == a.size


def test_noise_is_standard_normal() -> None:
    z = gaussian_noise(2024, 20_000, 21).astype(np.float64).ravel()  # 420,000 samples
    n = z.size
    assert abs(z.mean()) < 5 / math.sqrt(n)  # five standard errors
    assert abs(z.std() - 1.0) < 5 / math.sqrt(2 * n)
    assert abs(np.mean(z**3)) < 5 * math.sqrt(15 / n)  # skewness
    assert abs(np.mean(z**4) - 3.0) < 5 * math.sqrt(96 / n)  # kurtosis
    # The empirical CDF against the normal CDF at a grid of points (a Kolmogorov-Smirnov check).
    grid = np.linspace(-3.5, 3.5, 57)
    empirical = np.searchsorted(np.sort(z), grid) / n
    normal = 0.5 * (1 + np.array([math.erf(x / math.sqrt(2)) for x in grid]))
    assert np.abs(empirical - normal).max() < 1.63 / math.sqrt(n)  # KS critical value, 1% level
    assert np.all(np.isfinite(z)) and np.abs(z).max() < 7


def test_each_column_is_standard_normal() -> None:
    z = gaussian_noise(7, 20_000, 21).astype(np.float64)
    assert np.abs(z.mean(axis=0)).max() < 5 / math.sqrt(20_000)
    assert np.abs(z.std(axis=0) - 1).max() < 5 / math.sqrt(40_000)


@pytest.mark.parametrize("seed", [-1, 2**64])
def test_seed_out_of_range(seed: int) -> None:
    with pytest.raises(ValueError, match=re.escape(f"seed must be an integer in [0, 2**64), "
                                                   f"got {seed}")):
        gaussian_noise(seed, 1, 21)


def test_largest_seed_is_accepted() -> None:
    assert np.all(np.isfinite(gaussian_noise(2**64 - 1, 4, 21)))


# --- stochastic actions of the agent ----------------------------------------------------------

def test_same_seed_gives_bit_identical_actions_across_calls(agent: HuggyAgent,
                                                            observations: np.ndarray) -> None:
    first = agent.compute_action(observations, deterministic=False, seed=77)
    np.testing.assert_array_equal(first, agent.compute_action(observations, False, seed=77))
    other = HuggyAgent.from_checkpoint(BASELINE_ONNX, device="cpu", seed=5)
    np.testing.assert_array_equal(first, other.compute_action(observations, False, seed=77))


def test_batch_split_with_row_offsets_gives_the_same_actions(agent: HuggyAgent,
                                                             observations: np.ndarray) -> None:
    whole = agent.compute_action(observations, deterministic=False, seed=8)
    splits = [(0, 1), (1, 20), (20, 21), (21, 64)]
    pieces = [agent.compute_action(observations[a:b], deterministic=False, seed=8, row_offset=a)
              for a, b in splits]
    # Bit-identical on the CPU, single rows included (they run as two rows, see PolicyNet).
    np.testing.assert_array_equal(np.concatenate(pieces), whole)
    singles = [agent.compute_action(observations[i], deterministic=False, seed=8, row_offset=i)
               for i in range(len(observations))]
    np.testing.assert_array_equal(np.stack(singles), whole)
    # On one distribution (the same mu) the split is bit-identical.
    dist = agent.distribution(observations)
    split = np.concatenate([agent.actions_from(dist[a:b], False, seed=8, row_offset=a)
                            for a, b in splits])
    np.testing.assert_array_equal(split, whole)


def test_without_row_offset_pieces_reuse_the_first_rows_noise(agent: HuggyAgent,
                                                              observations: np.ndarray) -> None:
    # The counterpart of the test above: the offset is what makes the split agree.
    same = np.repeat(observations[:1], 2, axis=0)
    actions = agent.compute_action(same, deterministic=False, seed=8)
    assert not np.array_equal(actions[0], actions[1])
    again = agent.compute_action(same[1:], deterministic=False, seed=8)
    np.testing.assert_allclose(again[0], actions[0], atol=1e-6)


def test_different_seeds_give_different_actions(agent: HuggyAgent,
                                                observations: np.ndarray) -> None:
    a = agent.compute_action(observations, deterministic=False, seed=1)
    b = agent.compute_action(observations, deterministic=False, seed=2)
    assert np.mean(a != b) > 0.9


def test_deterministic_ignores_the_seed(agent: HuggyAgent, observations: np.ndarray) -> None:
    np.testing.assert_array_equal(agent.compute_action(observations, True, seed=3),
                                  agent.compute_action(observations, True))


def test_agent_seed_makes_unseeded_calls_reproducible(observations: np.ndarray) -> None:
    def three_calls(agent_seed: int) -> list[np.ndarray]:
        agent = HuggyAgent.from_checkpoint(BASELINE_ONNX, device="cpu", seed=agent_seed)
        return [agent.compute_action(observations, deterministic=False) for _ in range(3)]

    first, second, other = three_calls(10), three_calls(10), three_calls(11)
    for a, b in zip(first, second, strict=True):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(first[0], first[1])  # the generator moves on between calls
    assert not np.array_equal(first[0], other[0])


def test_unseeded_agents_differ(observations: np.ndarray) -> None:
    a = HuggyAgent.from_checkpoint(BASELINE_ONNX, device="cpu")
    b = HuggyAgent.from_checkpoint(BASELINE_ONNX, device="cpu")
    assert not np.array_equal(a.compute_action(observations, False),
                              b.compute_action(observations, False))


def test_negative_seed_is_refused_by_the_agent(agent: HuggyAgent,
                                               observations: np.ndarray) -> None:
    with pytest.raises(ValueError, match=re.escape("seed must be an integer in [0, 2**64)")):
        agent.compute_action(observations, deterministic=False, seed=-5)


@pytest.mark.parametrize("device", available_devices())
def test_stochastic_actions_match_float64_ppo_head(device: str, observations: np.ndarray) -> None:
    """clip(mu + z * exp(log_sigma), -3, 3) / 3 in float64 from the raw initializers, with z the
    host noise of (seed, row_offset + row): the same on every device present."""
    agent = HuggyAgent.from_checkpoint(BASELINE_ONNX, device=device)
    mu, log_sigma = ReferencePolicy.from_onnx(BASELINE_ONNX).forward(observations)
    z = gaussian_noise(31, len(observations), 21, row_offset=1000)
    expected = ppo_actions(mu, log_sigma, z)
    actions = agent.compute_action(observations, deterministic=False, seed=31, row_offset=1000)
    assert np.abs(actions - expected).max() <= 1e-5
    # The noise matters at this tolerance: the deterministic action is far from the stochastic one.
    assert np.abs(ppo_actions(mu, log_sigma) - expected).max() > 1e-2
    assert np.abs(ppo_actions(mu, log_sigma, -z) - expected).max() > 1e-2
