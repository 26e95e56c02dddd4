"""Stochastic actions: the counter-based host noise, seeds, row offsets, and the PPO head in float64."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from huggy_agent import HuggyAgent
from huggy_agent.devices import available_devices
from huggy_agent.noise import gaussian_noise
from huggy_agent.numerics import FP32_ACTION_ATOL
from tests.support.engines import RECORDED_NOISE_BITS
from tests.support.fixtures import fixtures_dir
from tests.support.policy_reference import (
    ReferencePolicy,
    RowsPart,
    normalizer_observations,
    ppo_actions,
)

pytestmark = pytest.mark.numerics  # rerun by .ci/run under other CPU kernel paths

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


# Bits of gaussian_noise(seed, 1, 4, row_offset) recorded on an x86-64 machine; the noise uses
# only IEEE-exact float64 operations, so every machine must give exactly these.


def test_noise_bits_are_the_same_on_every_machine() -> None:
    for (seed, row), bits in RECORDED_NOISE_BITS.items():
        assert gaussian_noise(seed, 1, 4, row_offset=row).view(np.uint32)[0].tolist() == bits


def _reference_noise(seed: int, rows: int, cols: int) -> np.ndarray:
    """Box-Muller from the same SplitMix64 counters, in plain Python integers and `math`."""
    mask = 2**64 - 1

    def splitmix(x: int) -> int:
        z = (x + 0x9E3779B97F4A7C15) & mask
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        return z ^ (z >> 31)

    key = splitmix(seed)
    out = np.empty((rows, cols))
    for row in range(rows):
        for col in range(cols):
            counter = (row * cols + col) * 2
            a = ((splitmix(key ^ splitmix(counter)) >> 11) + 1) * 2.0**-53
            b = (splitmix(key ^ splitmix(counter + 1)) >> 11) * 2.0**-53
            out[row, col] = math.sqrt(-2 * math.log(a)) * math.cos(2 * math.pi * b)
    return out


def test_noise_is_box_muller_of_splitmix_counters() -> None:
    """Against libm in float64: within one float32 rounding (6e-8 relative)."""
    reference = _reference_noise(99, 200, 21)
    ours = gaussian_noise(99, 200, 21).astype(np.float64)
    assert np.abs(ours - reference).max() <= 6e-8 * np.abs(reference).max()


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

def test_same_seed_gives_the_same_actions_across_calls(agent: HuggyAgent,
                                                       observations: np.ndarray) -> None:
    first = agent.compute_action(observations, deterministic=False, seed=77)
    again = agent.compute_action(observations, False, seed=77)
    other = HuggyAgent.from_checkpoint(BASELINE_ONNX, device="cpu", seed=5)
    elsewhere = other.compute_action(observations, False, seed=77)
    # The noise is exact; the forward passes agree within the numerical contract.
    assert np.abs(again - first).max() <= FP32_ACTION_ATOL
    assert np.abs(elsewhere - first).max() <= FP32_ACTION_ATOL


def test_batch_split_with_row_offsets_gives_the_same_actions(agent: HuggyAgent,
                                                             observations: np.ndarray) -> None:
    whole = agent.compute_action(observations, deterministic=False, seed=8)
    splits = [(0, 1), (1, 20), (20, 21), (21, 64)]
    pieces = [agent.compute_action(observations[a:b], deterministic=False, seed=8, row_offset=a)
              for a, b in splits]
    # Other batch shapes take other matmul kernels: equal within the contract, not bit for bit.
    assert np.abs(np.concatenate(pieces) - whole).max() <= FP32_ACTION_ATOL
    singles = [agent.compute_action(observations[i], deterministic=False, seed=8, row_offset=i)
               for i in range(len(observations))]
    assert np.abs(np.stack(singles) - whole).max() <= FP32_ACTION_ATOL
    # Splitting one distribution (the same mu) is exact: the PPO head is IEEE + - * / and clip
    # per element, with exp of the one shared log-sigma row.
    dist = agent.distribution(observations)
    split = np.concatenate([agent.actions_from(dist[a:b], False, seed=8, row_offset=a)
                            for a, b in splits])
    np.testing.assert_array_equal(split, agent.actions_from(dist, False, seed=8))


def test_without_row_offset_pieces_reuse_the_first_rows_noise(agent: HuggyAgent,
                                                              observations: np.ndarray) -> None:
    # The counterpart of the test above: the offset is what makes the split agree.
    same = np.repeat(observations[:1], 2, axis=0)
    actions = agent.compute_action(same, deterministic=False, seed=8)
    assert not np.array_equal(actions[0], actions[1])
    again = agent.compute_action(same[1:], deterministic=False, seed=8)
    np.testing.assert_allclose(again[0], actions[0], rtol=0, atol=FP32_ACTION_ATOL)


def test_different_seeds_give_different_actions(agent: HuggyAgent,
                                                observations: np.ndarray) -> None:
    a = agent.compute_action(observations, deterministic=False, seed=1)
    b = agent.compute_action(observations, deterministic=False, seed=2)
    assert np.mean(a != b) > 0.9


def test_deterministic_ignores_the_seed(agent: HuggyAgent, observations: np.ndarray) -> None:
    seeded = agent.compute_action(observations, True, seed=3)
    assert np.abs(seeded - agent.compute_action(observations, True)).max() <= FP32_ACTION_ATOL


def test_agent_seed_makes_unseeded_calls_reproducible(observations: np.ndarray) -> None:
    def three_calls(agent_seed: int) -> list[np.ndarray]:
        agent = HuggyAgent.from_checkpoint(BASELINE_ONNX, device="cpu", seed=agent_seed)
        return [agent.compute_action(observations, deterministic=False) for _ in range(3)]

    first, second, other = three_calls(10), three_calls(10), three_calls(11)
    for a, b in zip(first, second, strict=True):
        assert np.abs(a - b).max() <= FP32_ACTION_ATOL
    assert np.abs(first[0] - first[1]).max() > 0.1  # the generator moves on between calls
    assert np.abs(first[0] - other[0]).max() > 0.1


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


def test_rows_past_2_to_the_64_wrap_around_as_the_counters_do() -> None:
    from huggy_agent.noise import gaussian_noise, uniform_noise

    for noise in (gaussian_noise, uniform_noise):
        tail = noise(3, 4, 2, row_offset=2**64 - 2)
        np.testing.assert_array_equal(tail[2:], noise(3, 2, 2, row_offset=0))
        np.testing.assert_array_equal(tail[:2], noise(3, 2, 2, row_offset=2**64 - 2))


# --- the heads of a shared pass, part by part (what a server's batch answers) -------------------

MIXED_PARTS = [RowsPart(3), RowsPart(1, False, 11), RowsPart(20, False, 11, 5), RowsPart(1),
               RowsPart(7, False, 2), RowsPart(32)]


def test_actions_of_parts_are_each_parts_own_actions(observations: np.ndarray) -> None:
    agent = HuggyAgent.from_checkpoint(BASELINE_ONNX, device="cpu")
    dist = agent.distribution(observations)
    answers = agent.actions_of_parts(dist, MIXED_PARTS)
    mu = dist.mu.numpy().astype(np.float64)
    log_sigma = dist.log_sigma.numpy().astype(np.float64)
    start = 0
    for part, answer in zip(MIXED_PARTS, answers, strict=True):
        rows = slice(start, start + part.rows)
        z = None if part.deterministic else gaussian_noise(part.seed, part.rows, 21,
                                                           part.row_offset)
        # Against float64 from the same mu: the head is float32 + * / and clip, exp of one row.
        expected = ppo_actions(mu[rows], log_sigma, z)
        assert answer.shape == (part.rows, 21)
        assert np.abs(answer - expected).max() <= 1e-6
        # And exactly what the part's own head call gives: the same element-wise float32
        # operations on the same values, whichever rows share the call.
        np.testing.assert_array_equal(answer, agent.actions_from(
            dist[rows], part.deterministic, part.seed, part.row_offset))
        start += part.rows


def test_actions_of_parts_draw_unseeded_streams_in_order(observations: np.ndarray) -> None:
    parts = [RowsPart(4, False), RowsPart(2), RowsPart(5, False)]
    together = HuggyAgent.from_checkpoint(BASELINE_ONNX, device="cpu", seed=42)
    apart = HuggyAgent.from_checkpoint(BASELINE_ONNX, device="cpu", seed=42)
    dist = together.distribution(observations[:11])
    answers = together.actions_of_parts(dist, parts)
    np.testing.assert_array_equal(answers[0], apart.actions_from(dist[0:4], False))
    np.testing.assert_array_equal(answers[2], apart.actions_from(dist[6:11], False))
    assert np.abs(answers[0][:1] - answers[2][:1]).max() > 1e-3  # two streams, not one


def test_actions_of_parts_refuses_parts_that_do_not_cover_the_pass(agent: HuggyAgent,
                                                                     observations: np.ndarray
                                                                     ) -> None:
    dist = agent.distribution(observations[:5])
    with pytest.raises(ValueError, match="the parts cover 4 rows, the outputs have 5"):
        agent.actions_of_parts(dist, [RowsPart(4)])
