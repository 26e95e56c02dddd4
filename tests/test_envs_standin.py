"""The built-in stand-in: real mlagents-envs `UnityEnvironment` over real gRPC, and its dog sim."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import envs
from envs.standin.sim import ACT_SIZE, OBS_SIZE, STICK_RADIUS, HuggySim, SimConfig
from envs.standin.wire import ObservationEncoder
from tests.support.envs import env_kwargs, wait_until_gone
from tests.support.fixtures import fixtures_dir, mlagents_fixtures_dir
from tests.support.processes import free_port

BEHAVIOR = "Huggy?team=0"


def _fixture_normalizer() -> tuple[np.ndarray, np.ndarray]:
    """Running mean and std of the observations the baseline policy was trained on."""
    (path,) = (fixtures_dir() / "ppo_baseline" / "Huggy").glob("Huggy-*.pt")
    policy = torch.load(path, weights_only=True)["Policy"]
    prefix = "network_body.observation_encoder.processors.0.normalizer."
    mean = policy[prefix + "running_mean"].double().numpy()
    var = policy[prefix + "running_variance"].double().numpy()
    steps = float(policy[prefix + "normalization_steps"])
    return mean, np.sqrt(var / steps)


@pytest.fixture(scope="module")
def unity_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """1,000 random-action steps of the real UnityEnvironment against the stand-in."""
    from mlagents_envs.base_env import ActionTuple
    from mlagents_envs.environment import UnityEnvironment
    from mlagents_envs.side_channel.environment_parameters_channel import (
        EnvironmentParametersChannel,
    )

    log_folder = tmp_path_factory.mktemp("unity_run")
    parameters = EnvironmentParametersChannel()
    parameters.set_float_parameter("max_steps", 100)
    env = UnityEnvironment(file_name=envs.builtin_huggy_path(), base_port=free_port(),
                           seed=3, no_graphics=True, timeout_wait=20,
                           side_channels=[parameters], log_folder=str(log_folder))
    run: dict = {"decisions": [], "terminals": [], "obs": []}
    try:
        env.reset()
        run["specs"] = dict(env.behavior_specs)
        decision, _ = env.get_steps(BEHAVIOR)
        run["first_ids"] = decision.agent_id.copy()
        rng = np.random.default_rng(0)
        for _ in range(1000):
            actions = rng.uniform(-1, 1, (len(decision), ACT_SIZE)).astype(np.float32)
            env.set_actions(BEHAVIOR, ActionTuple(continuous=actions))
            env.step()
            decision, terminal = env.get_steps(BEHAVIOR)
            run["decisions"].append((decision.agent_id.copy(), decision.reward.copy()))
            run["terminals"].append((terminal.agent_id.copy(), terminal.interrupted.copy()))
            run["obs"].append(decision.obs[0].copy())
        run["process"] = env._process
    finally:
        env.close()
    run["log_folder"] = log_folder
    return run


@pytest.mark.standin
def test_unity_environment_sees_huggys_behavior(unity_run: dict) -> None:
    spec = unity_run["specs"][BEHAVIOR]
    assert list(unity_run["specs"]) == [BEHAVIOR]
    assert [o.shape for o in spec.observation_specs] == [(OBS_SIZE,)]
    assert spec.action_spec.continuous_size == ACT_SIZE
    assert spec.action_spec.discrete_size == 0
    assert len(unity_run["first_ids"]) == 18


@pytest.mark.standin
def test_1000_steps_with_episode_ends_and_new_ids(unity_run: dict) -> None:
    start = dict.fromkeys(unity_run["first_ids"].tolist(), 0)  # agent id -> first step
    ended = interrupted_count = 0
    for step, ((ids, _), (ended_ids, interrupted)) in enumerate(
        zip(unity_run["decisions"], unity_run["terminals"], strict=True), start=1
    ):
        assert len(ids) == 18
        assert not set(ended_ids.tolist()) & set(ids.tolist())  # successors get new ids
        for agent, cut in zip(ended_ids.tolist(), interrupted.tolist(), strict=True):
            length = step - start.pop(agent)  # only agents that existed can end
            assert length <= 100
            assert cut == (length == 100)  # max_steps=100 interrupts, reaching the stick ends
            interrupted_count += cut
        fresh = set(ids.tolist()) - set(start)
        assert len(fresh) == len(ended_ids)
        start.update(dict.fromkeys(fresh, step))
        ended += len(ended_ids)
    assert ended >= 170 and interrupted_count >= 150


@pytest.mark.standin
def test_standin_exits_on_close(unity_run: dict) -> None:
    """It exits by itself (not killed by mlagents-envs after its grace period): on the status-400
    answer, or, when the server stops before that answer is delivered, on the failed call."""
    assert unity_run["process"].poll() in (0, 1)
    assert wait_until_gone(str(unity_run["log_folder"])) == []
    log = next(unity_run["log_folder"].glob("Player-*.log")).read_text()
    assert "seed 3" in log
    assert "closing: status 400" in log or "the Python side is gone" in log


@pytest.mark.standin
def test_observations_look_like_what_the_policies_saw(unity_run: dict) -> None:
    """Each feature's mean and spread over a random-action rollout against the running mean
    and variance in the trained policy's normalizer."""
    obs = np.concatenate(unity_run["obs"]).astype(np.float64)
    mean, std = _fixture_normalizer()
    flags = [0] + [1 + 5 * part for part in range(8)]
    assert set(np.unique(obs[:, flags])) <= {0.0, 1.0}
    for start in (41, 53, 56):  # direction to stick, forward, up: unit vectors
        np.testing.assert_allclose(np.linalg.norm(obs[:, start:start + 3], axis=1), 1, atol=1e-5)
    assert np.abs(obs[:, [44, 46]]).max() <= SimConfig().arena_size + 1e-4
    # Features whose spread the stand-in does not reproduce (means still must match):
    # 42 direction-to-stick y (random dogs stay far from the stick, so it is near 0),
    # 57 up y (the stand-in's body tilts less than Huggy's bounding gait).
    loose = {42, 57}
    for i in range(OBS_SIZE):
        m, s = obs[:, i].mean(), obs[:, i].std()
        assert abs(m - mean[i]) <= 0.5 * std[i] + 0.1, (i, m, mean[i])
        if std[i] < 0.01:  # constant in Huggy (locked joint axes)
            assert s < 0.01, (i, s)
        elif i not in loose:
            assert 1 / 3 <= s / std[i] <= 3, (i, s, std[i])


def _stream(tmp_path, seed: int, reseed: int | None = None, steps: int = 150) -> list:
    out = []
    with envs.HuggyVectorEnv(**env_kwargs(tmp_path, seed=seed)) as env:
        obs, _ = env.reset(seed=reseed)
        out.append(obs)
        rng = np.random.default_rng(11)
        for _ in range(steps):
            obs, reward, *_ = env.step(rng.uniform(-1, 1, (env.num_envs, ACT_SIZE)))
            out += [obs, reward]
    return out


@pytest.mark.standin
def test_same_seed_same_streams(tmp_path) -> None:
    first, second = _stream(tmp_path, seed=5), _stream(tmp_path, seed=5)
    for a, b in zip(first, second, strict=True):
        np.testing.assert_array_equal(a, b)
    other = _stream(tmp_path, seed=6, steps=1)
    assert not np.array_equal(first[0], other[0])


@pytest.mark.standin
def test_seed_parameter_reseeds_on_reset(tmp_path) -> None:
    """reset(seed=s) gives the same stream whatever the handshake seed and history."""
    a = _stream(tmp_path, seed=1, reseed=77, steps=50)
    b = _stream(tmp_path, seed=2, reseed=77, steps=50)
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)


@pytest.mark.standin
def test_environment_parameters(tmp_path) -> None:
    kwargs = env_kwargs(tmp_path, num_agents=5, max_steps=10, arena_size=4.0)
    with envs.HuggyVectorEnv(**kwargs) as env:
        assert env.num_envs == 5
        env.reset()
        for step in range(1, 21):
            obs, _, terminated, truncated, _ = env.step(np.zeros((5, ACT_SIZE)))
            assert np.abs(obs[:, [44, 46]]).max() <= 4.0 + 1e-5
            if step % 10 == 0:
                assert truncated.all() or (terminated | truncated).all()


def test_reward_is_huggys() -> None:
    """+0.01 velocity . direction to stick, -0.001 per step, -0.001 x turn (clamped to [0, 1])."""
    sim = HuggySim(SimConfig(num_agents=6, max_steps=0), seed=4)
    rng = np.random.default_rng(4)
    for _ in range(50):
        actions = rng.uniform(-1.5, 1.5, (6, ACT_SIZE))
        result = sim.step(actions)
        velocity, direction = result.obs[:, 47:50], result.obs[:, 41:44]
        expected = (0.01 * (velocity.astype(np.float64) * direction).sum(1) - 0.001
                    - 0.001 * np.clip(actions[:, 20], 0, 1))
        np.testing.assert_allclose(result.reward, expected, atol=1e-6)


def test_reaching_the_stick_ends_the_episode() -> None:
    sim = HuggySim(SimConfig(num_agents=3, max_steps=0), seed=0)
    first_ids = sim.agent_id.copy()
    sim.stick[1] = sim.pos[1] + [0.5, -sim.pos[1, 1], 0.0]  # within STICK_RADIUS
    result = sim.step(np.zeros((3, ACT_SIZE)))
    assert result.done.tolist() == [False, True, False]
    assert not result.max_step_reached.any()
    assert result.agent_id[1] == first_ids[1]
    assert result.new_agent_id[1] not in first_ids
    assert np.linalg.norm(sim.stick[1] - sim.pos[1]) > 2 * STICK_RADIUS - 1e-9  # respawned


def test_sim_rejects_bad_action_shapes() -> None:
    with pytest.raises(ValueError, match=r"expected actions of shape \(2, 21\), got \(2, 20\)"):
        HuggySim(SimConfig(num_agents=2)).step(np.zeros((2, 20)))
    with pytest.raises(ValueError, match="num_agents must be >= 1, got 0"):
        SimConfig(num_agents=0).validated()


def test_wire_encoding_parses_as_the_protobuf_message() -> None:
    from mlagents_envs.communicator_objects.unity_message_pb2 import UnityMessageProto

    encoder = ObservationEncoder(BEHAVIOR, OBS_SIZE)
    obs = np.random.default_rng(0).standard_normal((2, OBS_SIZE)).astype(np.float32)
    data = encoder.message(encoder.agent_infos(
        np.array([7, 300]), np.array([0.25, -1.5]), np.array([False, True]),
        np.array([False, True]), obs), b"")
    message = UnityMessageProto.FromString(data)
    assert message.header.status == 200
    infos = message.unity_output.rl_output.agentInfos[BEHAVIOR].value
    assert [i.id for i in infos] == [7, 300]
    assert [i.reward for i in infos] == [0.25, -1.5]
    assert [(i.done, i.max_step_reached) for i in infos] == [(False, False), (True, True)]
    for info, row in zip(infos, obs, strict=True):
        (o,) = info.observations
        assert list(o.shape) == [OBS_SIZE] and list(o.dimension_properties) == [1]
        np.testing.assert_array_equal(np.array(o.float_data.data, np.float32), row)


def test_environment_parameters_channel_messages() -> None:
    """Parameters as mlagents-envs encodes them; bad values and unknown keys are ignored."""
    import io

    from mlagents_envs.side_channel.environment_parameters_channel import (
        EnvironmentParametersChannel,
    )
    from mlagents_envs.side_channel.side_channel_manager import SideChannelManager

    from envs.standin.client import StandIn
    from envs.standin.protocol import parse_environment_parameters

    channel = EnvironmentParametersChannel()
    for key, value in (("num_agents", 4), ("max_steps", -2), ("seed", 9), ("gravity", 1),
                       ("arena_size", float("inf")), ("episode_length", float("inf"))):
        channel.set_float_parameter(key, value)
    data = bytes(SideChannelManager([channel]).generate_side_channel_messages())
    assert parse_environment_parameters(data) == {
        "num_agents": 4.0, "max_steps": -2.0, "seed": 9.0, "gravity": 1.0,
        "arena_size": float("inf"), "episode_length": float("inf")}
    log = io.StringIO()
    standin = StandIn(log)
    standin.apply_parameters(data)
    assert (standin.config.num_agents, standin.config.max_steps) == (4, 500)
    assert standin.pending_seed == 9
    assert "ignoring environment parameter max_steps=-2.0" in log.getvalue()
    assert "ignoring unknown environment parameter gravity=1.0" in log.getvalue()
    assert "ignoring environment parameter episode_length=inf" in log.getvalue()


def test_vector_env_rejects_bad_parameters_before_starting() -> None:
    with pytest.raises(ValueError, match="num_agents must be >= 1, got 0"):
        envs.HuggyVectorEnv(num_agents=0)
    with pytest.raises(ValueError, match="arena_size must be >= 3.0, got 1.0"):
        envs.HuggyVectorEnv(arena_size=1.0)


def test_each_stand_in_refuses_the_parameters_it_would_ignore() -> None:
    """A key the stand-in does not take (the message lists, in order, those it does), a value
    its configuration refuses or that float32 (the side channel's type) makes infinite, and a
    seed that float32 cannot carry exactly are refused; the values at their limits are
    taken."""
    from envs.standin.parameters import check_parameters

    for stand_in, taken, refused in [
        ("huggy", [("num_agents", 1), ("max_steps", 0), ("arena_size", 3.0), ("seed", 2**24 - 1),
                   ("episode_length", 0), ("echo_actions", 1), ("render", 0)],
         [("num_agent", 4, "environment parameter 'num_agent' is not one that the Huggy "
           "stand-in takes; expected one of arena_size, echo_actions, episode_length, "
           "episode_length_step, max_steps, num_agents, render, seed"),
          ("num_agents", 0, "environment parameter num_agents=0 is refused by the Huggy "
           "stand-in: num_agents must be >= 1, got 0"),
          ("arena_size", 2.9, "arena_size must be >= 3.0, got 2.9"),
          ("render", 2, "render must be 0 or 1, got 2"),
          ("num_agents", float("nan"), "environment parameter num_agents=nan is not a finite "
           "float32, the type the side channel carries"),
          ("max_steps", 1e39, "environment parameter max_steps=1e+39 is not a finite float32"),
          ("arena_seed_0", 5, "environment parameter 'arena_seed_0' is not one that the Huggy "
           "stand-in takes"),
          ("seed", 0.5, "environment parameter seed must be a whole number, 0 to 2**24 - 1, "
           "got 0.5"),
          ("seed", 2**24, "got 1.67772e+07"), ("seed", -1, "got -1")]),
        ("spec", [("num_agents", 2), ("episode_length", 1), ("episode_length_step", 0)],
         [("max_steps", 10, "environment parameter 'max_steps' is not one that the "
           "spec-driven stand-in takes; expected one of episode_length, episode_length_step, "
           "num_agents, seed"),
          ("episode_length", 0, "need num_agents >= 1, episode_length >= 1")]),
        ("soccertwos", [("num_arenas", 1), ("max_environment_steps", 1), ("ball_touch", -2.5),
                        ("arena_seed_0", 0), ("arena_seed_31", 2**24 - 1)],
         [("num_agents", 4, "environment parameter 'num_agents' is not one that the stand-in "
           "SoccerTwos takes; expected one of ball_touch, max_environment_steps, num_arenas, "
           "seed, arena_seed_K"),
          ("ball_touch", float("inf"), "ball_touch=inf is not a finite float32"),
          ("ball_touch", 3.5e38, "ball_touch=3.5e+38 is not a finite float32"),
          ("arena_seed_2", 0.5, "environment parameter arena_seed_2 must be a whole number, 0 "
           "to 2**24 - 1, got 0.5"),
          ("num_arenas", 0, "num_arenas must be >= 1, got 0")]),
    ]:
        check_parameters(stand_in, taken)
        for key, value, message in refused:
            with pytest.raises(ValueError) as error:
                check_parameters(stand_in, [*taken, (key, value)])
            assert message in str(error.value), (stand_in, key, value)


def test_environments_refuse_a_stand_in_s_unknown_parameter_before_starting_it() -> None:
    """The Gymnasium and team environments check their built-in stand-in's parameters before
    a process starts; a Unity build's parameters are its own (nothing to check)."""
    from envs.teams import TeamsEnv, check_builtin_parameters

    with pytest.raises(ValueError, match="'num_agent' is not one that the Huggy stand-in"):
        envs.HuggyVectorEnv(env_parameters={"num_agent": 4})
    with pytest.raises(ValueError, match="'max_steps' is not one that the spec-driven"):
        envs.UnityVectorEnv(file_name=None, max_steps=10, behavior_spec={
            "inputs": [{"name": "obs_0", "shape": [3], "kind": "vector"}],
            "continuous_size": 2, "discrete_branches": []})
    with pytest.raises(ValueError, match="'gravity' is not one that the stand-in SoccerTwos"):
        TeamsEnv("builtin:soccertwos", env_parameters={"gravity": 1.0})
    check_builtin_parameters("/path/to/Huggy.x86_64", None, [("gravity", 1.0)])


def test_num_envs_for_the_stand_in_soccertwos_is_refused_by_its_name() -> None:
    """`num_envs` travels as `num_agents`, which SoccerTwos does not take: the refusal names
    what was written and what sizes the scene, before a process starts."""
    with pytest.raises(ValueError, match=re.escape(
            "num_envs=8 does not apply to the stand-in SoccerTwos: it is sent to the stand-in "
            "as num_agents, which that scene does not take; leave num_envs at 1 (every agent "
            "of the driven behavior) and size the scene with env_parameters={'num_arenas': N} "
            "(2 N slots per team in each instance), or play every team with "
            "envs.teams.TeamsEnv")):
        envs.UnityVectorEnv("builtin:soccertwos", num_envs=8)
    with pytest.raises(ValueError, match="'num_agents' is not one that the stand-in SoccerTwos"):
        envs.UnityVectorEnv("builtin:soccertwos", num_agents=8)  # written as num_agents


def test_the_commands_refuse_a_stand_in_s_unknown_parameter_before_any_work(
        capsys: pytest.CaptureFixture[str]) -> None:
    """`--env-param` for the stand-in: rollout, evaluate and tournament exit with 2 and say
    which parameter and why, before opening an environment or starting Ray."""
    from huggy_agent.cli import main

    policy = str(fixtures_dir() / "ppo_baseline" / "Huggy" / "Huggy-2000343.pt")
    for command, message in [
        (["rollout", "--env-param", "num_agent=4"],
         "huggy rollout: error: environment parameter 'num_agent' is not one that the Huggy "
         "stand-in takes"),
        (["evaluate", "--no-ray", "--env-param", "arena_size=1", policy],
         "huggy evaluate: error: environment parameter arena_size=1 is refused by the Huggy "
         "stand-in: arena_size must be >= 3.0, got 1.0"),
        (["tournament", "--no-ray", "--env-param", "max_environment_steps=0",
          "heuristic:idle", "heuristic:random"],
         "huggy tournament: error: environment parameter max_environment_steps=0 is refused by "
         "the stand-in SoccerTwos: max_environment_steps must be >= 1, got 0.0"),
        (["tournament", "--no-ray", "--env", "builtin", "heuristic:idle", "heuristic:random"],
         "huggy tournament: error: a tournament needs a scene whose two teams share a "
         "behavior: 'builtin:soccertwos' or a build, got 'builtin'"),
    ]:
        assert main([*command, "--no-progress"]) == 2
        assert message in capsys.readouterr().err, command


def test_evaluate_names_the_max_steps_flag_that_a_policy_s_stand_in_would_ignore(
        capsys: pytest.CaptureFixture[str]) -> None:
    """A policy other than Huggy plays on the spec-driven stand-in, which has no max_steps: the
    refusal names --max-steps, what the stand-in takes instead, and comes before any work."""
    from huggy_agent.cli import main

    policy = str(mlagents_fixtures_dir() / "discrete_multibranch" / "Target.onnx")
    assert main(["evaluate", "--no-ray", "--no-progress", "--max-steps", "10", policy]) == 2
    assert ("huggy evaluate: error: --max-steps 10 (the scene parameter max_steps): environment "
            "parameter 'max_steps' is not one that the spec-driven stand-in takes; expected one "
            "of episode_length, episode_length_step, num_agents, seed") in capsys.readouterr().err


@pytest.mark.parametrize("ids", [range(18), range(100, 118), range(120, 138), range(20000, 20018)])
@pytest.mark.parametrize("flags", ["none", "done", "max_step"])
def test_agent_infos_in_bulk_parse_as_protobuf(ids: range, flags: str) -> None:
    """Every row layout (one table when no row has a flag and the ids' varints have one length,
    row by row otherwise) parses to the values given."""
    from mlagents_envs.communicator_objects.unity_message_pb2 import UnityMessageProto

    encoder = ObservationEncoder(BEHAVIOR, OBS_SIZE)
    rng = np.random.default_rng(len(ids))
    n = len(ids)
    obs = rng.standard_normal((n, OBS_SIZE)).astype(np.float32)
    reward = rng.standard_normal(n).astype(np.float32)
    done = np.arange(n) % 5 == 1 if flags != "none" else np.zeros(n, bool)
    max_step = done & (flags == "max_step")
    for _ in range(2):  # the second time through the cached table
        message = UnityMessageProto.FromString(encoder.message(
            encoder.agent_infos(np.array(ids), reward, done, max_step, obs)))
        infos = message.unity_output.rl_output.agentInfos[BEHAVIOR].value
        assert [i.id for i in infos] == list(ids)
        assert [i.reward for i in infos] == reward.tolist()
        assert [i.done for i in infos] == done.tolist()
        assert [i.max_step_reached for i in infos] == max_step.tolist()
        np.testing.assert_array_equal([list(i.observations[0].float_data.data) for i in infos],
                                      obs)


def test_actions_in_bulk_equal_the_protobuf_fields() -> None:
    """`wire.continuous_actions` reads what mlagents-envs sends (both its encoders) and declines
    any other layout, which the stand-in then reads field by field."""
    from mlagents_envs.communicator_objects.agent_action_pb2 import AgentActionProto
    from mlagents_envs.communicator_objects.unity_rl_input_pb2 import UnityRLInputProto

    from envs.fast_step import encode_agent_actions
    from envs.standin.wire import continuous_actions

    actions = np.random.default_rng(2).uniform(-1, 1, (18, ACT_SIZE)).astype(np.float32)
    by_protobuf = UnityRLInputProto()
    for row in actions:
        by_protobuf.agent_actions[BEHAVIOR].value.append(AgentActionProto(
            vector_actions_deprecated=row.tolist(), continuous_actions=row.tolist()))
    by_numpy = UnityRLInputProto()
    by_numpy.agent_actions[BEHAVIOR].MergeFromString(encode_agent_actions(actions))
    for message in (by_protobuf, by_numpy):
        listing = message.agent_actions[BEHAVIOR]
        data = listing.SerializeToString()
        np.testing.assert_array_equal(continuous_actions(data, 18, ACT_SIZE), actions)
    uneven = UnityRLInputProto()
    for k, row in enumerate(actions[:3]):
        uneven.agent_actions[BEHAVIOR].value.append(AgentActionProto(
            continuous_actions=row.tolist(), discrete_actions=[1] * (k == 1)))
    data = uneven.agent_actions[BEHAVIOR].SerializeToString()
    assert continuous_actions(data, 3, ACT_SIZE) is None  # entries of different layouts
    assert continuous_actions(encode_agent_actions(actions), 18, ACT_SIZE - 1) is None
    assert continuous_actions(b"", 0, ACT_SIZE) is None
