"""Every kind of ML-Agents policy against onnxruntime on its own file: discrete and hybrid
actions with masks, several observation inputs, visual encoders, attention over variable-length
inputs, LSTM memory; PPO, SAC and POCA actors.

The reference is onnxruntime running the fixture's ONNX graph (for a `.pt`, the run's own
export beside it). Continuous actions agree within 1e-5 (a SAC export's deterministic output is
the raw mean, ML-Agents' TanhGaussian `deterministic_sample()`: compared with tanh of it);
deterministic discrete actions are equal on >= 99.9% of rows (a row may differ only where two
probabilities tie within float rounding); LSTM memories agree within 1e-5 over 20 chained steps.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from scipy.stats import chi2_contingency

from huggy_agent import Actions, HuggyAgent, split_memory
from huggy_agent_client.spec import ActorSpec
from tests.support.fixtures import EXTRA_FIXTURES, mlagents_fixtures_dir, mlagents_policy_files
from tests.support.kinds import random_inputs, random_masks, run_onnx
from tests.support.policy_reference import RowsPart

pytestmark = pytest.mark.numerics  # rerun by .ci/run under other CPU kernel paths

CONTINUOUS_ATOL = 1e-5
DISCRETE_AGREEMENT = 0.999
FILES = mlagents_policy_files()


def _label(path: Path) -> str:
    return f"{path.parent.name}/{path.name}" if path.suffix == ".pt" else path.name


def reference_onnx(path: Path) -> Path:
    """The ONNX graph that is the reference for `path`: itself, or the run's export of a .pt."""
    return path if path.suffix == ".onnx" else path.with_suffix(".onnx")


@pytest.fixture(scope="module", params=[(path, engine) for path in FILES
                                        for engine in ("onnxruntime", "torch")],
                ids=lambda p: f"{_label(p[0])}-{p[1]}")
def policy(request: pytest.FixtureRequest) -> tuple[Path, HuggyAgent, ort.InferenceSession]:
    """(file, agent on each CPU engine, onnxruntime session of the reference graph)."""
    path, engine = request.param
    session = ort.InferenceSession(str(reference_onnx(path)), providers=["CPUExecutionProvider"])
    agent = HuggyAgent.from_checkpoint(path, device="cpu", engine=engine)
    assert agent.engine == engine
    return path, agent, session


def _split(agent: HuggyAgent, result: object) -> tuple[np.ndarray | None, np.ndarray | None,
                                                        np.ndarray | None]:
    """(continuous, discrete, memory) of a compute_action result."""
    memory = None
    if agent.spec.memory_size:
        result, memory = result  # type: ignore[misc]
    if isinstance(result, Actions):
        return result.continuous, result.discrete, memory
    if agent.spec.discrete_branches:
        return None, result, memory  # type: ignore[return-value]
    return result, None, memory  # type: ignore[return-value]


@functools.lru_cache(maxsize=2)
def _deterministic_case(path: Path, spec: ActorSpec) -> tuple:
    """(inputs, mask, memory, onnxruntime's outputs) of 1,000 random rows for `path`, computed
    once for both engines' tests."""
    rng = np.random.default_rng(7)
    inputs = random_inputs(spec, 1000, rng)
    mask = random_masks(spec, 1000, rng) if spec.discrete_branches else None
    memory = ((0.5 * rng.standard_normal((1000, spec.memory_size))).astype(np.float32)
              if spec.memory_size else None)
    session = ort.InferenceSession(str(reference_onnx(path)), providers=["CPUExecutionProvider"])
    return inputs, mask, memory, run_onnx(session, inputs, mask, memory)


def test_deterministic_actions_match_onnxruntime(policy) -> None:
    path, agent, _ = policy
    spec = agent.spec
    inputs, mask, memory, expected = _deterministic_case(path, spec)
    obs = inputs[0] if len(inputs) == 1 else inputs
    result = agent.compute_action(obs, deterministic=True, action_mask=mask,
                                  **({"memory": memory} if spec.memory_size else {}))
    continuous, discrete, new_memory = _split(agent, result)
    if spec.continuous_size:
        reference = expected["deterministic_continuous_actions"]
        if agent.arch.head == "sac":
            reference = np.tanh(reference)
        assert continuous.dtype == np.float32 and continuous.shape == (1000, spec.continuous_size)
        assert np.abs(continuous - reference).max() <= CONTINUOUS_ATOL
    if spec.discrete_branches:
        assert discrete.dtype == np.int64 and discrete.shape == (1000, len(spec.discrete_branches))
        agreement = np.mean(np.all(discrete == expected["deterministic_discrete_actions"], axis=1))
        assert agreement >= DISCRETE_AGREEMENT
        offsets = np.cumsum([0, *spec.discrete_branches[:-1]])
        assert mask[np.arange(1000)[:, None], offsets + discrete].all()  # only allowed actions
    if spec.memory_size:
        assert new_memory.dtype == np.float32 and new_memory.shape == (1000, spec.memory_size)
        assert np.abs(new_memory - expected["recurrent_out"][:, 0]).max() <= CONTINUOUS_ATOL


def test_recurrent_memory_over_20_chained_steps() -> None:
    root = mlagents_fixtures_dir() / "lstm"
    for path in (root / "Recurrent.onnx", root / "Recurrent" / "Recurrent-150016.pt"):
        agent = HuggyAgent.from_checkpoint(path, device="cpu")
        session = ort.InferenceSession(str(root / "Recurrent.onnx"),
                                       providers=["CPUExecutionProvider"])
        rng = np.random.default_rng(11)
        ours = theirs = np.zeros((64, 32), np.float32)
        for _ in range(20):
            (obs,) = random_inputs(agent.spec, 64, rng)
            actions, ours = agent.compute_action(obs, memory=ours)
            expected = run_onnx(session, [obs], None, theirs)
            theirs = expected["recurrent_out"][:, 0]
            assert np.abs(ours - theirs).max() <= CONTINUOUS_ATOL
            assert np.abs(actions - expected["deterministic_continuous_actions"]).max() \
                <= CONTINUOUS_ATOL
        assert np.abs(ours).max() > 0.1  # the memory really moved


def test_memory_none_means_zeros() -> None:
    agent = HuggyAgent.from_checkpoint(mlagents_fixtures_dir() / "lstm", device="cpu")
    obs = random_inputs(agent.spec, 8, np.random.default_rng(1))[0]
    zero_actions, zero_memory = agent.compute_action(obs, memory=np.zeros((8, 32), np.float32))
    actions, memory = agent.compute_action(obs)
    assert np.abs(actions - zero_actions).max() <= CONTINUOUS_ATOL
    assert np.abs(memory - zero_memory).max() <= CONTINUOUS_ATOL
    single, single_memory = agent.compute_action(obs[0])
    assert single.shape == (2,) and single_memory.shape == (32,)


def test_split_memory_takes_every_kind_of_result_apart() -> None:
    recurrent = HuggyAgent.from_checkpoint(mlagents_fixtures_dir() / "lstm", device="cpu")
    obs = random_inputs(recurrent.spec, 4, np.random.default_rng(2))[0]
    result = recurrent.compute_action(obs)
    actions, memory = split_memory(result)
    assert isinstance(result, tuple) and actions is result[0] and memory is result[1]
    assert actions.shape == (4, 2) and memory.shape == (4, 32)
    hybrid = HuggyAgent.from_checkpoint(mlagents_fixtures_dir() / "hybrid", device="cpu")
    inputs = random_inputs(hybrid.spec, 4, np.random.default_rng(2))
    result = hybrid.compute_action(inputs[0] if len(inputs) == 1 else inputs)
    actions, memory = split_memory(result)  # an `Actions` pair is not (actions, memory)
    assert isinstance(actions, Actions) and actions is result and memory is None


DISCRETE_FILES = [f for f in FILES if f.suffix == ".onnx" and "deterministic_discrete_actions"
                  in {o.name for o in ort.InferenceSession(
                      str(f), providers=["CPUExecutionProvider"]).get_outputs()}]


@pytest.mark.parametrize("path", DISCRETE_FILES, ids=_label)
def test_masks_change_the_actions(path: Path) -> None:
    """The parity test would pass with masks ignored if they never mattered: they do."""
    spec = HuggyAgent.from_checkpoint(path, device="cpu").spec
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(3)
    inputs = random_inputs(spec, 500, rng)
    mask = random_masks(spec, 500, rng)
    memory = np.zeros((500, spec.memory_size), np.float32) if spec.memory_size else None
    unmasked = run_onnx(session, inputs, None, memory)["deterministic_discrete_actions"]
    masked = run_onnx(session, inputs, mask, memory)["deterministic_discrete_actions"]
    assert np.mean(np.any(unmasked != masked, axis=1)) > 0.1


DRAWS = 8_000
SAME_DISTRIBUTION_ALPHA = 1e-6
"""The significance of the homogeneity test of two samplers' draws: how often a correct sampler
fails it, per branch."""


@pytest.mark.parametrize("path", DISCRETE_FILES, ids=_label)
def test_stochastic_discrete_actions_follow_onnxruntime_sampling(path: Path) -> None:
    """8,000 draws for one row (with a random mask): our seeded inverse-CDF draws and
    onnxruntime's own Multinomial sampling (unseeded: new draws every run) come from one
    distribution per branch, by a chi-square test of homogeneity of the two samples' counts at
    significance `SAME_DISTRIBUTION_ALPHA`: a correct sampler fails it once in a million
    branches, while a shift of total variation 0.05 between two actions near one half (6
    standard errors at these counts) fails it. The same seed gives the same draws, and masked
    actions are never drawn. Ours come from the row's logits, computed once and repeated (each
    of onnxruntime's rows runs the network)."""
    agent = HuggyAgent.from_checkpoint(path, device="cpu")
    spec = agent.spec
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(5)
    one_row = random_inputs(spec, 1, rng)
    inputs = [np.repeat(a, DRAWS, axis=0) for a in one_row]
    mask = np.repeat(random_masks(spec, 1, rng), DRAWS, axis=0)
    memory = np.zeros((DRAWS, spec.memory_size), np.float32) if spec.memory_size else None
    outputs = agent.distribution(one_row[0] if len(one_row) == 1 else one_row,
                                 memory=None if memory is None else memory[:1])
    repeated = dataclasses.replace(outputs, logits=outputs.logits.repeat(DRAWS, 1), rows=DRAWS,
                                   mu=None if outputs.mu is None else outputs.mu.repeat(DRAWS, 1),
                                   memory=None)
    ours = _split(agent, agent.actions_from(repeated, deterministic=False, seed=21,
                                            action_mask=mask))[1]
    again = _split(agent, agent.actions_from(repeated, deterministic=False, seed=21,
                                             action_mask=mask))[1]
    np.testing.assert_array_equal(ours, again)
    theirs = run_onnx(session, inputs, mask, memory)["discrete_actions"]
    start = 0
    for branch, size in enumerate(spec.discrete_branches):
        counts = np.stack([np.bincount(ours[:, branch], minlength=size),
                           np.bincount(theirs[:, branch], minlength=size)])
        allowed = mask[0, start:start + size]
        assert counts[:, ~allowed].sum() == 0  # forbidden actions never drawn, by either
        drawn = counts[:, counts.sum(axis=0) > 0]
        if drawn.shape[1] > 1:  # one action left: both samples are all of it, as asserted
            assert chi2_contingency(drawn, correction=False).pvalue > SAME_DISTRIBUTION_ALPHA, (
                f"branch {branch}: ours {counts[0]}, onnxruntime's {counts[1]}")
        start += size


def test_pyramids_reference_values() -> None:
    """The trained Pyramids policy's recorded deterministic actions (its README): rows of three
    successive standard-normal draws per input from default_rng(0), all actions allowed."""
    agent = HuggyAgent.from_checkpoint(mlagents_fixtures_dir() / "pyramids_trained", device="cpu")
    rng = np.random.default_rng(0)
    rows = []
    for _ in range(3):
        obs = [rng.standard_normal((1, *i.shape)).astype(np.float32) for i in agent.spec.inputs]
        rows.append(agent.compute_action(obs, action_mask=np.ones(5, bool)).tolist())
    assert rows == [[[1]], [[3]], [[2]]]


def test_shapes_and_types_of_each_kind() -> None:
    root = mlagents_fixtures_dir()
    hybrid = HuggyAgent.from_checkpoint(root / "hybrid", device="cpu")
    obs = np.zeros(10, np.float32)
    single = hybrid.compute_action(obs)
    assert isinstance(single, Actions)
    assert single.continuous.shape == (2,) and single.continuous.dtype == np.float32
    assert single.discrete.shape == (1,) and single.discrete.dtype == np.int64
    batch = hybrid.compute_action(np.zeros((4, 10), np.float32), deterministic=False, seed=1)
    assert batch.continuous.shape == (4, 2) and batch.discrete.shape == (4, 1)
    target = HuggyAgent.from_checkpoint(root / "discrete_multibranch", device="cpu")
    actions = target.compute_action([np.zeros(27), np.zeros(12)])
    assert actions.shape == (3,) and actions.dtype == np.int64
    assert target.spec.discrete_branches == (3, 3, 2) and target.spec.mask_size == 8
    assert [i.shape for i in target.spec.inputs] == [(27,), (12,)]


@pytest.mark.parametrize(("mask", "message"), [
    (np.ones(7, bool), "action_mask must have shape (8,) or (N, 8)"),
    (np.ones((3, 8), bool), "action_mask has 3 rows, the observations 2"),
    (np.array([1, 1, 1, 0, 0, 0, 1, 1]), "branch 1 (actions 3-5) allows no action in row 0"),
    (np.full(8, 2), "action_mask must hold booleans or 0/1 (1 = allowed), received 2 at column 0"),
    (np.array([[1] * 8, [1] * 7 + [np.nan]]),
     "action_mask must hold booleans or 0/1 (1 = allowed), received nan at row 1, column 7"),
    (np.array(["1"] * 8), "action_mask must hold booleans or 0/1 (1 = allowed), received values "
                          "of type <U1"),
])
def test_bad_masks_are_refused(mask: np.ndarray, message: str) -> None:
    agent = HuggyAgent.from_checkpoint(mlagents_fixtures_dir() / "discrete_multibranch",
                                       device="cpu")
    with pytest.raises(ValueError, match=re.escape(message)):
        agent.compute_action([np.zeros((2, 27)), np.zeros((2, 12))], action_mask=mask)


@pytest.mark.parametrize(("path", "kwargs", "message"), [
    ("hybrid", {"memory": np.zeros(32)}, "has no recurrent memory"),
    ("lstm", {"memory": np.zeros(31)}, "memory must have shape (32,) or (N, 32)"),
    ("lstm", {"memory": np.full(32, np.nan)}, "memory must be finite"),
    ("lstm", {"action_mask": np.ones(2)}, "this policy has no discrete actions, so action_mask "
                                          "must be None (in a request body null or absent), "
                                          "received an array of shape (2,)"),
    ("hybrid", {"memory": [[0.0], [0.0, 0.0]]}, "this policy has no recurrent memory, so memory "
                                                "must be None (in a request body null or absent), "
                                                "received a ragged list"),
])
def test_bad_memory_and_masks_are_refused(path: str, kwargs: dict, message: str) -> None:
    agent = HuggyAgent.from_checkpoint(mlagents_fixtures_dir() / path, device="cpu")
    obs = np.zeros(agent.spec.inputs[0].shape, np.float32)
    with pytest.raises(ValueError, match=re.escape(message)):
        agent.compute_action(obs, **kwargs)


@pytest.mark.parametrize(("obs", "message"), [
    ([np.zeros(27)], "expected 2 observation inputs (obs_0, obs_1), received 1"),
    ([np.zeros(27), np.zeros(11)], "obs_1: observation shape mismatch: expected (12,) or (N, 12)"),
    ([np.zeros((2, 27)), np.zeros((3, 12))], "inputs must have the same number of rows"),
    (np.zeros(39), "expected 2 observation inputs (obs_0, obs_1)"),
])
def test_bad_multi_input_observations_are_refused(obs: object, message: str) -> None:
    agent = HuggyAgent.from_checkpoint(mlagents_fixtures_dir() / "discrete_multibranch",
                                       device="cpu")
    with pytest.raises(ValueError, match=re.escape(message)):
        agent.compute_action(obs)


def test_pt_and_onnx_of_one_run_have_one_fingerprint() -> None:
    for run in ("discrete_multibranch", "hybrid", "lstm", "visual_simple", "buffer_sensor"):
        folder = mlagents_fixtures_dir() / run
        (pt,) = folder.glob("*/*.pt")
        assert HuggyAgent.from_checkpoint(pt, device="cpu").fingerprint == \
            HuggyAgent.from_checkpoint(folder, device="cpu").fingerprint, run
    fingerprints = {HuggyAgent.from_checkpoint(EXTRA_FIXTURES / run, device="cpu").fingerprint
                    for run in ("sac_continuous", "sac_discrete", "poca_hybrid", "visual_match3")}
    assert len(fingerprints) == 4


def test_describe_counts_parameters_of_each_kind() -> None:
    agent = HuggyAgent.from_checkpoint(mlagents_fixtures_dir() / "visual_simple", device="cpu")
    description = agent.describe()
    counts = description["parameters"]
    # simple encoder: conv 3->16 8x8 and 16->32 4x4, dense 128->64; body 72->64; mu 64->2
    assert counts["encoders"] == (16 * 3 * 64 + 16) + (32 * 16 * 16 + 32) + (64 * 128 + 64)
    assert counts["body"] == 64 * 72 + 64 and counts["heads"] == 2 * 64 + 2
    assert counts["log_sigma"] == 2 and counts["normalizer"] == 16
    assert description["spec"]["inputs"] == [
        {"name": "obs_0", "shape": [3, 32, 32], "kind": "visual"},
        {"name": "obs_1", "shape": [8], "kind": "vector"}]


def test_masked_parts_of_a_shared_pass_act_on_their_own_masks() -> None:
    """`actions_of_parts` for a hybrid policy: each part's deterministic discrete actions are
    onnxruntime's for its rows under its own mask, and no part draws an action its mask forbids."""
    path = mlagents_fixtures_dir() / "hybrid" / "Hybrid.onnx"
    agent = HuggyAgent.from_checkpoint(path, device="cpu")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(9)
    inputs = random_inputs(agent.spec, 60, rng)
    masks = random_masks(agent.spec, 60, rng)
    parts = [RowsPart(20, True, None, 0, masks[:20]), RowsPart(25, False, 3, 0, masks[20:45]),
             RowsPart(15, True, None, 0, None)]
    answers = agent.actions_of_parts(agent.distribution(inputs[0] if len(inputs) == 1 else inputs),
                                     parts)
    reference = run_onnx(session, inputs, masks, None)["deterministic_discrete_actions"]
    unmasked = run_onnx(session, inputs, None, None)["deterministic_discrete_actions"]
    assert np.mean(answers[0].discrete == reference[:20]) >= DISCRETE_AGREEMENT
    assert np.mean(answers[2].discrete == unmasked[45:]) >= DISCRETE_AGREEMENT
    offsets = np.cumsum([0, *agent.spec.discrete_branches])
    for row, actions in enumerate(answers[1].discrete):
        for branch, action in enumerate(actions):
            assert masks[20 + row, offsets[branch] + action]
