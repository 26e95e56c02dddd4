"""The stand-in SoccerTwos: its simulation and rays against hand-worked cases from the scene's
numbers, its wire messages, the real mlagents-envs `UnityEnvironment` over real gRPC, a policy
of the real interface acting in it, and the spec-driven mode with several behaviors."""

from __future__ import annotations

import io
import json
import math

import numpy as np
import pytest

import envs
from envs.standin.launcher import builtin_path, builtin_soccertwos_path, spec_arguments
from envs.standin.soccer import field, rays
from envs.standin.soccer.sim import SoccerConfig, SoccerSim
from envs.standin.soccer.standin import BEHAVIORS, SoccerStandIn
from envs.standin.spec_client import parse_behavior_spec
from tests.support.processes import free_port

# The scene's numbers, written out here as the reference (SoccerFieldTwos.prefab, AgentSoccer.cs).
AGENT_RADIUS, BALL_RADIUS, CAST_RADIUS, RAY_LENGTH = 0.5, 0.015 * 41.61146, 0.5, 20.0
SIDE_WALL_FACE = 7.75 - 0.011573717 - 0.4607078 / 2  # the side wall's inner face, |z|
BLUE_NET_FACE = 16.5 + 0.9363 - 0.0637  # the blue net's back face, -x
CAST_HEIGHT = 0.5  # casts start 0.5 above the bodies' centres
OBS_SIZES = (264, 72)


def _sim(**config: float) -> SoccerSim:
    return SoccerSim(SoccerConfig(**{"num_arenas": 1, **config}), seed=0)


def _place(sim: SoccerSim, bodies: dict[int, tuple[float, float]],
           yaw_degrees: dict[int, float] | None = None) -> None:
    """Put bodies (0-3 agents, 4 the ball) of arena 0 at rest where given; the others out of
    the way (the agents in the field's corners, the ball near a side wall)."""
    away = {0: (-12.0, -6.0), 1: (-12.0, 6.0), 2: (12.0, -6.0), 3: (12.0, 6.0), 4: (0.0, -6.5)}
    for body in range(5):
        sim.pos[:, 0, body] = bodies.get(body, away[body])
    sim.vel[:] = 0.0
    for agent, yaw in (yaw_degrees or {}).items():
        sim.yaw[0, agent] = math.radians(yaw)


def _idle(sim: SoccerSim) -> np.ndarray:
    return np.zeros((sim.num_agents, 3), dtype=np.int64)


def _frame(obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The newest forward (11, 8) and backward (3, 8) frames of one agent's observation."""
    return obs[176:264].reshape(11, 8), obs[264 + 48:].reshape(3, 8)


def _ray(tag: int | None, fraction: float) -> np.ndarray:
    """One ray's 8 values as RayPerceptionSensor writes them."""
    out = np.zeros(8)
    if tag is None:
        out[6:] = 1.0
    else:
        out[tag], out[7] = 1.0, fraction
    return out


# -- rays --------------------------------------------------------------------------------------


def test_ray_angles_and_sizes_are_the_scenes() -> None:
    """5 rays per direction over 60 degrees and 1 over 45, alternating from the centre."""
    np.testing.assert_array_equal(rays.FORWARD_ANGLES,
                                  [90, 78, 102, 66, 114, 54, 126, 42, 138, 30, 150])
    np.testing.assert_array_equal(rays.BACKWARD_ANGLES, [90, 45, 135])
    assert (rays.FORWARD_SIZE, rays.BACKWARD_SIZE) == OBS_SIZES == (11 * 8 * 3, 3 * 8 * 3)


def test_ball_straight_ahead_and_goal_straight_behind() -> None:
    """A blue agent at the centre facing +x: the ball 6 m ahead, its own goal's net behind."""
    sim = _sim()
    _place(sim, {0: (0.0, 0.0), 4: (6.0, 0.0)}, {0: 90.0})
    report = sim.step(_idle(sim))
    ahead, behind = _frame(report.obs[report.slot == 0][0])
    ball_reach = math.sqrt((CAST_RADIUS + BALL_RADIUS) ** 2 - CAST_HEIGHT**2)
    np.testing.assert_allclose(ahead[0], _ray(rays.BALL, (6.0 - ball_reach) / RAY_LENGTH),
                               atol=1e-6)
    net = BLUE_NET_FACE - CAST_RADIUS  # straight back into the mouth of its own goal
    np.testing.assert_allclose(behind[0], _ray(rays.OWN_GOAL, net / RAY_LENGTH), atol=1e-6)


def test_side_wall_miss_and_the_other_teams_view() -> None:
    """Rays at an angle meet the wall farther away; a ray reaching nothing within 20 m reports
    a miss; purple agents see purple's goal as their own, purple as teammates and blue as
    opponents."""
    sim = _sim()
    blue_1 = (-4 * math.sin(math.radians(24)), 4 * math.cos(math.radians(24)))
    _place(sim, {0: (-6.0, -3.0), 1: blue_1, 2: (0.0, 0.0), 3: (6.0, 0.0), 4: (0.0, -5.0)},
           {0: 90.0, 2: 0.0, 3: 90.0})
    report = sim.step(_idle(sim))
    blue_ahead, _ = _frame(report.obs[report.slot == 0][0])
    # 22.9 m to purple's net: nothing within reach
    np.testing.assert_array_equal(blue_ahead[0], _ray(None, 1.0))
    ahead, behind = _frame(report.obs[report.slot == 2][0])  # purple, at the centre facing +z
    wall = SIDE_WALL_FACE - CAST_RADIUS
    np.testing.assert_allclose(ahead[0], _ray(rays.WALL, wall / RAY_LENGTH), atol=1e-6)
    slant = wall / math.cos(math.radians(12))  # ray 1 leans 12 degrees right of forward
    np.testing.assert_allclose(ahead[1], _ray(rays.WALL, slant / RAY_LENGTH), atol=1e-6)
    agent_reach = math.sqrt((AGENT_RADIUS + CAST_RADIUS) ** 2 - CAST_HEIGHT**2)
    # ray 4 leans 24 degrees left (+114): blue agent 1 stands 4 m along it
    np.testing.assert_allclose(ahead[4], _ray(rays.OPPONENT, (4 - agent_reach) / RAY_LENGTH),
                               atol=1e-6)
    ball_reach = math.sqrt((CAST_RADIUS + BALL_RADIUS) ** 2 - CAST_HEIGHT**2)
    np.testing.assert_allclose(behind[0], _ray(rays.BALL, (5 - ball_reach) / RAY_LENGTH),
                               atol=1e-6)
    ahead, behind = _frame(report.obs[report.slot == 3][0])  # purple, at (6, 0) facing +x
    purple_net = 16.47 + 0.936 - 0.05 - CAST_RADIUS - 6.0
    np.testing.assert_allclose(ahead[0], _ray(rays.OWN_GOAL, purple_net / RAY_LENGTH),
                               atol=1e-6)
    np.testing.assert_allclose(behind[0], _ray(rays.TEAMMATE, (6 - agent_reach) / RAY_LENGTH),
                               atol=1e-6)


def test_cast_ignores_what_it_starts_inside_and_reports_the_nearest() -> None:
    """`rays.cast` directly: an agent never sees itself; of two bodies on one ray the nearer is
    reported; a body within the cast's reach at the start is not seen (Unity's sphere casts)."""
    x, z, yaw = np.array([0.0]), np.array([0.0]), np.array([math.radians(90)])
    agent_reach = math.sqrt((AGENT_RADIUS + CAST_RADIUS) ** 2 - CAST_HEIGHT**2)
    bodies_x = np.array([[0.0, 3.0, 8.0, 0.5, -20.0]])  # itself, teammate, opponent, ...
    bodies_z = np.array([[0.0, 0.0, 0.0, 0.0, 0.0]])
    radius = np.array([agent_reach] * 4 + [1.0])
    tags = np.array([[rays.TEAMMATE, rays.TEAMMATE, rays.OPPONENT, rays.OPPONENT, rays.BALL]])
    distance, tag = rays.cast(x, z, yaw, bodies_x, bodies_z, radius, tags,
                              np.full((1, len(field.WALL_KIND)), rays.WALL))
    # body 3 at 0.5 m overlaps the cast at its start: skipped; the teammate at 3 m is first
    assert tag[0, 0] == rays.TEAMMATE
    assert distance[0, 0] == pytest.approx(3.0 - agent_reach, abs=1e-9)


def test_stacking_is_oldest_first_and_restarts_from_zeros() -> None:
    """Frames enter at the end and move toward the front each decision; a new episode's first
    observation is (0, 0, frame)."""
    sim = _sim()
    first = sim.opening.obs
    assert not first[:, :176].any() and not first[:, 264:312].any()
    assert first[:, 176:].any()
    frames = [first]
    for _ in range(2):
        report = sim.step(_idle(sim))
        assert not report.done.any()
        frames.append(report.obs)
    newest = [f[:, 176:264] for f in frames]
    np.testing.assert_array_equal(frames[2][:, 0:88], newest[0])
    np.testing.assert_array_equal(frames[2][:, 88:176], newest[1])
    np.testing.assert_array_equal(frames[1][:, 88:176], newest[0])
    np.testing.assert_array_equal(frames[2][:, 264:288], frames[0][:, 312:336])


# -- rules -------------------------------------------------------------------------------------


@pytest.mark.parametrize("scorer", [0, 1])
def test_goal_rewards_and_episode_ends(scorer: int) -> None:
    """The ball crossing into purple's goal (+x) is blue's goal and the other way round: the
    scorers' group gets 1 - t / max_environment_steps, the others -1, all four agents' episodes
    end (terminal) in the report after that physics step, and the arena restarts with new ids."""
    sim = _sim(max_environment_steps=100)
    _place(sim, {4: (15.0 if scorer == 0 else -15.0, 0.0)})
    sim.vel[0, 0, 4] = 20.0 if scorer == 0 else -20.0  # crosses the goal line in one step
    sim.timer[0] = 39  # 40 physics steps into the episode when it scores
    ids = sim.agent_id[0].copy()
    report = sim.step(_idle(sim))
    assert sim.academy_step == 1 and report.done.all() and len(report.slot) == 4
    assert not report.interrupted.any()
    np.testing.assert_array_equal(report.agent_id, ids)
    expected = np.where(np.array([0, 0, 1, 1]) == scorer, np.float32(1 - 40 / 100), -1.0)
    np.testing.assert_array_equal(report.group_reward, expected.astype(np.float32))
    np.testing.assert_array_equal(report.reward, 0.0)
    np.testing.assert_array_equal(report.group_id, [1, 1, 2, 2])
    assert (sim.agent_id[0] > ids.max()).all() and sim.timer[0] == 0
    # the new agents ask for their first decision at the next decision step
    report = sim.step(_idle(sim))
    assert sim.academy_step == 5 and not report.done.any()
    np.testing.assert_array_equal(report.agent_id, sim.agent_id[0])


def test_step_limit_interrupts_every_arena() -> None:
    """At max_environment_steps physics steps both groups are interrupted (group reward 0); on a
    decision step the finished agents and their successors come in one report."""
    sim = _sim(num_arenas=3, max_environment_steps=10)
    sim.pos[:, :, 4] = 0.0  # keep the balls out of the goals
    first_ids = sim.agent_id.copy()
    report = sim.step(_idle(sim))
    assert not report.done.any()
    report = sim.step(_idle(sim))
    assert sim.academy_step == 10
    ended = report.done
    assert ended.sum() == 12 and report.interrupted[ended].all()
    np.testing.assert_array_equal(report.group_reward, 0.0)
    np.testing.assert_array_equal(np.sort(report.agent_id[ended]), np.sort(first_ids.ravel()))
    np.testing.assert_array_equal(np.sort(report.agent_id[~ended]), np.sort(sim.agent_id.ravel()))


def test_ball_touch_rewards_the_agent_that_touches() -> None:
    """With ball_touch = 1, an agent running into the ball gets 0.2 (AgentSoccer)."""
    sim = _sim(ball_touch=1.0)
    _place(sim, {0: (0.0, 0.0), 4: (1.6, 0.0)}, {0: 90.0})
    actions = _idle(sim)
    actions[0] = (1, 0, 0)  # forward
    report = sim.step(actions)
    np.testing.assert_allclose(report.reward, [np.float32(0.2), 0.0, 0.0, 0.0])


def test_moves_and_turns_have_the_scenes_speeds() -> None:
    """A forward move adds agentRunSpeed (2 m/s) of velocity per physics step, drag 3 takes
    (1 - 3 * 0.02) of it each step; a turn is 2 degrees per step; a sideways move replaces the
    forward one at 0.3 of the speed."""
    sim = _sim()
    _place(sim, {0: (0.0, 0.0), 1: (0.0, 3.0)}, {0: 90.0, 1: 90.0})
    actions = _idle(sim)
    actions[0] = (1, 0, 2)  # forward, turning right
    actions[1] = (1, 1, 0)  # forward and sideways right: sideways wins
    sim.step(actions)
    # Each step pushes along the heading before that step's turn, then drag damps it.
    yaws = np.radians(90.0 + 2.0 * np.arange(5))
    weights = 2.0 * 0.94 ** np.arange(5, 0, -1)
    expected = [(weights * np.sin(yaws)).sum(), (weights * np.cos(yaws)).sum()]
    np.testing.assert_allclose(sim.vel[:, 0, 0], expected, rtol=1e-9)
    assert math.degrees(sim.yaw[0, 0]) == pytest.approx(90.0 + 5 * 2.0, rel=1e-9)
    speed = weights.sum()
    # agent 1 faces +x, so its right is -z
    assert sim.vel[0, 0, 1] == pytest.approx(0.0, abs=1e-12)
    assert sim.vel[1, 0, 1] == pytest.approx(-0.3 * speed, rel=1e-9)


def test_the_two_sides_play_alike() -> None:
    """Side balance: arena 1 holds arena 0 turned half round with the teams' roles swapped
    (blue agent k plays as purple agent k + 2, actions too). They stay each other's images,
    and each agent sees what its counterpart sees: the same own goal, teammates and opponents.
    Distances agree to 0.1 m (0.005 of the ray length): the scene's two nets differ by a few
    centimetres (blue's back face at x = -17.372, purple's at 17.356; the side nets start at
    |x| = 15.50 and 15.47), more along a slanted ray."""
    sim = _sim(num_arenas=2)
    rng = np.random.default_rng(4)
    swap = np.array([2, 3, 0, 1, 4])  # body k of arena 0 is body swap[k] of arena 1
    sim.pos[:, 0] = rng.uniform([[-10], [-5]], [[10], [5]], (2, 5))
    sim.pos[:, 1, swap] = -sim.pos[:, 0]
    sim.yaw[0] = rng.uniform(-math.pi, math.pi, 4)
    sim.yaw[1, swap[:4]] = sim.yaw[0] + math.pi
    sim.vel[:] = 0.0
    for _ in range(15):
        actions = rng.integers(0, 3, (4, 3))
        both = np.concatenate([actions, actions[[2, 3, 0, 1]]])
        report = sim.step(both)
        if report.done.any():
            break
        np.testing.assert_allclose(sim.pos[:, 1, swap], -sim.pos[:, 0], atol=1e-9)
        obs = report.obs[np.argsort(report.slot)]
        newest = np.r_[176:264, 312:336]  # (the older frames predate the placement)
        np.testing.assert_allclose(obs[4 + swap[:4]][:, newest], obs[:4, newest], atol=0.005)


def test_start_positions_follow_reset_scene() -> None:
    sim = SoccerSim(SoccerConfig(num_arenas=64), seed=3)
    x, z = sim.pos
    yaw = np.degrees(sim.yaw)
    assert (x[:, :2] >= -13.19 - 1e-9).all() and (x[:, :2] <= -3.19 + 1e-9).all()
    assert (x[:, 2:4] >= 3.19 - 1e-9).all() and (x[:, 2:4] <= 13.19 + 1e-9).all()
    np.testing.assert_array_equal(z[:, :4], np.tile([1.2, -1.2, 1.2, -1.2], (64, 1)))
    assert (yaw[:, :2] >= 80).all() and (yaw[:, :2] <= 100).all()
    assert (yaw[:, 2:] >= -100).all() and (yaw[:, 2:] <= -80).all()
    assert (np.abs(sim.pos[:, :, 4]) <= 2.5).all()


def test_bodies_stay_in_the_field() -> None:
    """Random play for 600 decisions: no agent or ball ever crosses a wall or a net."""
    sim = SoccerSim(SoccerConfig(num_arenas=8), seed=1)
    rng = np.random.default_rng(0)
    radius = np.array([AGENT_RADIUS] * 4 + [BALL_RADIUS])
    for _ in range(600):
        actions = rng.integers(0, 3, (sim.num_agents, 3))
        actions[:, 0] = np.where(rng.random(sim.num_agents) < 0.7, 1, actions[:, 0])
        sim.step(actions)
        x, z = sim.pos
        assert (np.abs(z) <= SIDE_WALL_FACE - radius + 1e-6).all()
        assert (np.abs(x) <= BLUE_NET_FACE - radius + 1e-6).all()
        assert np.isfinite(sim.vel).all()


def test_same_seed_same_episodes() -> None:
    def run(seed: int) -> list[np.ndarray]:
        sim = SoccerSim(SoccerConfig(num_arenas=4), seed=seed)
        rng = np.random.default_rng(1)
        out = [sim.opening.obs]
        for _ in range(60):
            report = sim.step(rng.integers(0, 3, (sim.num_agents, 3)))
            out += [report.obs, report.group_reward, report.agent_id]
        return out

    first, second = run(5), run(5)
    for a, b in zip(first, second, strict=True):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(first[0], run(6)[0])


def test_arenas_are_independent_and_seeded_apart() -> None:
    """An arena's episode depends only on its own seed and actions: arena 3 of five, seeded
    123, plays as the only arena of another simulation seeded 123 (positions compared to 1e-9,
    far below any effect of one 0.02 s step; in fact they are equal)."""
    alone = SoccerSim(SoccerConfig(num_arenas=1), seed=0, arena_seeds={0: 123})
    among = SoccerSim(SoccerConfig(num_arenas=5), seed=9, arena_seeds={3: 123})
    pattern = np.array([[1, 0, 2], [1, 1, 0], [2, 0, 1], [1, 2, 2]])
    for step in range(40):
        actions = np.roll(pattern, step, axis=0)
        alone.step(actions)
        among.step(np.tile(actions, (5, 1)))
        np.testing.assert_allclose(among.pos[:, 3], alone.pos[:, 0], rtol=0, atol=1e-9)
        np.testing.assert_allclose(among.yaw[3], alone.yaw[0], rtol=0, atol=1e-12)


def test_arena_seed_parameter_seeds_that_arenas_next_episode() -> None:
    """`arena_seed_K` sent before the first reset seeds arena K's first episode; sent later,
    its next one (here after a goal), as `SoccerSim(arena_seeds=...)` does."""
    from mlagents_envs.side_channel.environment_parameters_channel import (
        EnvironmentParametersChannel,
    )
    from mlagents_envs.side_channel.side_channel_manager import SideChannelManager

    def side_channel(**values: float) -> bytes:
        channel = EnvironmentParametersChannel()
        for key, value in values.items():
            channel.set_float_parameter(key, value)
        return bytes(SideChannelManager([channel]).generate_side_channel_messages())

    def start(seed: int) -> np.ndarray:
        return SoccerSim(SoccerConfig(num_arenas=1), arena_seeds={0: seed}).pos[:, 0]

    log = io.StringIO()
    standin = SoccerStandIn(log)
    standin.apply_parameters(side_channel(num_arenas=3, arena_seed_1=77, arena_seed_2=-1))
    standin.reset(5)
    assert "ignoring environment parameter arena_seed_2=-1.0" in log.getvalue()
    np.testing.assert_array_equal(standin.sim.pos[:, 1], start(77))
    standin.apply_parameters(side_channel(arena_seed_0=4000))
    sim = standin.sim
    sim.pos[:, 0, 4] = (15.0, 0.0)
    sim.vel[:, 0, 4] = (20.0, 0.0)
    standin.step(np.zeros((12, 3), np.int64))  # a goal in arena 0: its next episode starts
    np.testing.assert_array_equal(sim.pos[:, 0], start(4000))


def test_config_is_validated() -> None:
    with pytest.raises(ValueError, match="num_arenas must be >= 1, got 0"):
        SoccerConfig(num_arenas=0).validated()
    with pytest.raises(ValueError, match="max_environment_steps must be >= 1, got 0"):
        SoccerConfig(max_environment_steps=0).validated()
    with pytest.raises(ValueError, match=r"expected actions of shape \(4, 3\), got \(4, 2\)"):
        _sim().step(np.zeros((4, 2)))


# -- the protocol side, without a process ------------------------------------------------------


def test_messages_parse_as_the_protobuf_messages() -> None:
    """What SoccerStandIn writes, read back through protobuf: both behaviors with their brain
    parameters, two named observations per agent, group ids and rewards."""
    from mlagents_envs.communicator_objects.unity_message_pb2 import UnityMessageProto

    standin = SoccerStandIn(io.StringIO())
    standin.config = SoccerConfig(num_arenas=2)
    message = UnityMessageProto.FromString(standin.reset(7))
    output = message.unity_output
    brains = {b.brain_name: b for b in output.rl_initialization_output.brain_parameters}
    assert list(brains) == list(BEHAVIORS)
    for brain in brains.values():
        assert list(brain.action_spec.discrete_branch_sizes) == [3, 3, 3]
        assert brain.action_spec.num_continuous_actions == 0
    report = standin.sim.opening
    for team, behavior in enumerate(BEHAVIORS):
        infos = output.rl_output.agentInfos[behavior].value
        rows = np.flatnonzero(report.team == team)
        assert [i.id for i in infos] == report.agent_id[rows].tolist()
        assert [i.group_id for i in infos] == [1 + team, 1 + team, 3 + team, 3 + team]
        colour = ("Blue", "Purple")[team]
        for info, row in zip(infos, rows, strict=True):
            names = [o.name for o in info.observations]
            assert names == [f"StackingSensor_size3_{colour}RayPerceptionSensor",
                             f"StackingSensor_size3_{colour}RayPerceptionSensorReverse"]
            data = np.concatenate([np.array(o.float_data.data, np.float32)
                                   for o in info.observations])
            np.testing.assert_array_equal(data, report.obs[row])
            assert not info.action_mask


def test_discrete_actions_in_bulk_equal_the_protobuf_fields() -> None:
    from mlagents_envs.communicator_objects.agent_action_pb2 import AgentActionProto
    from mlagents_envs.communicator_objects.unity_rl_input_pb2 import UnityRLInputProto

    from envs.standin.wire import discrete_actions

    actions = np.random.default_rng(3).integers(0, 3, (20, 3))
    message = UnityRLInputProto()
    for row in actions:  # as mlagents-envs writes them: the deprecated float copy too
        message.agent_actions["B"].value.append(AgentActionProto(
            vector_actions_deprecated=row.tolist(), discrete_actions=row.tolist()))
    data = message.agent_actions["B"].SerializeToString()
    np.testing.assert_array_equal(discrete_actions(data, 20, 3), actions)
    big = UnityRLInputProto()
    for row in ([1, 200, 0], [1, 2, 0]):  # a two-byte varint: not one layout
        big.agent_actions["B"].value.append(AgentActionProto(discrete_actions=row))
    assert discrete_actions(big.agent_actions["B"].SerializeToString(), 2, 3) is None
    assert discrete_actions(data, 20, 2) is None


def test_launchers_and_spec_arguments() -> None:
    assert builtin_soccertwos_path().endswith("SoccerTwos.x86_64")
    assert builtin_path("huggy").endswith("Huggy.x86_64")
    with pytest.raises(ValueError, match="unknown stand-in scene 'pong'; expected one of"):
        builtin_path("pong")
    entries = [{"behavior": "Striker", "team": 0, "agents": 2, "inputs": [
        {"name": "obs_0", "shape": [6], "kind": "vector"}], "continuous_size": 0,
        "discrete_branches": [3, 3]}]
    flag, text = spec_arguments(entries)
    assert flag == "--behavior-spec" and json.loads(text) == entries


def test_behavior_spec_lists_are_validated() -> None:
    spec = {"inputs": [{"name": "obs_0", "shape": [4], "kind": "vector"}],
            "continuous_size": 2, "discrete_branches": []}
    (single,) = parse_behavior_spec(json.dumps({**spec, "behavior": "Walker"}))
    assert (single.wire_name, single.agents) == ("Walker?team=0", None)
    with pytest.raises(ValueError, match="entry 1: team must be an integer >= 0, got -1"):
        parse_behavior_spec(json.dumps([spec, {**spec, "team": -1}]))
    with pytest.raises(ValueError, match="entry 0: agents must be an integer >= 1, got 0"):
        parse_behavior_spec(json.dumps([{**spec, "agents": 0}]))
    with pytest.raises(ValueError, match="each behavior and team may appear once"):
        parse_behavior_spec(json.dumps([spec, spec]))
    with pytest.raises(ValueError, match="entry 0: expected an ActorSpec.as_dict()"):
        parse_behavior_spec(json.dumps([{"behavior": "X"}]))


# -- real mlagents-envs over gRPC --------------------------------------------------------------


def _unity(tmp_path, file_name: str, seed: int = 1, additional_args: tuple[str, ...] = (),
           **parameters: float):
    from mlagents_envs.environment import UnityEnvironment
    from mlagents_envs.side_channel.environment_parameters_channel import (
        EnvironmentParametersChannel,
    )

    channel = EnvironmentParametersChannel()
    for key, value in parameters.items():
        channel.set_float_parameter(key, value)
    return UnityEnvironment(file_name=file_name, base_port=free_port(), seed=seed,
                            no_graphics=True, timeout_wait=30, side_channels=[channel],
                            additional_args=list(additional_args), log_folder=str(tmp_path))


@pytest.mark.standin
def test_unity_environment_sees_the_scenes_behaviors(tmp_path) -> None:
    from mlagents_envs.base_env import ActionTuple

    env = _unity(tmp_path, builtin_soccertwos_path(), num_arenas=3, max_environment_steps=200)
    try:
        env.reset()
        assert list(env.behavior_specs) == list(BEHAVIORS)
        for behavior, colour in zip(BEHAVIORS, ("Blue", "Purple"), strict=True):
            spec = env.behavior_specs[behavior]
            assert [o.shape for o in spec.observation_specs] == [(264,), (72,)]
            assert spec.observation_specs[0].name == \
                f"StackingSensor_size3_{colour}RayPerceptionSensor"
            assert spec.action_spec.discrete_branches == (3, 3, 3)
            assert spec.action_spec.continuous_size == 0
            decision, _ = env.get_steps(behavior)
            assert len(decision) == 6
            assert sorted(decision.group_id) == sorted([1, 1, 3, 3, 5, 5] if colour == "Blue"
                                                       else [2, 2, 4, 4, 6, 6])
        rng = np.random.default_rng(0)
        seen_ids: set[int] = set()
        ends = 0
        for _ in range(500):
            for behavior in BEHAVIORS:
                decision, _ = env.get_steps(behavior)
                env.set_actions(behavior, ActionTuple(discrete=rng.integers(
                    0, 3, (len(decision), 3)).astype(np.int32)))
            env.step()
            finished = {}
            for behavior in BEHAVIORS:
                decision, terminal = env.get_steps(behavior)
                seen_ids.update(decision.agent_id.tolist())
                finished[behavior] = terminal
            blue, purple = (finished[b] for b in BEHAVIORS)
            assert len(blue) == len(purple)  # a goal or the limit ends both teams' episodes
            for terminal in (blue, purple):
                ends += len(terminal)
                goal = ~terminal.interrupted
                assert np.all((terminal.group_reward[goal] == -1)
                              | ((terminal.group_reward[goal] > 0)
                                 & (terminal.group_reward[goal] <= 1)))
                np.testing.assert_array_equal(terminal.group_reward[terminal.interrupted], 0)
        # 500 decisions with a 40-decision limit: every arena's episodes ended at least 12 times
        assert ends >= 3 * 4 * 12
        assert len(seen_ids) >= ends
    finally:
        env.close()


@pytest.mark.standin
def test_seed_parameter_reproduces_episodes(tmp_path) -> None:
    from mlagents_envs.base_env import ActionTuple

    def observations(seed: int) -> list[np.ndarray]:
        env = _unity(tmp_path, builtin_soccertwos_path(), seed=seed, num_arenas=2)
        try:
            env.reset()
            out = []
            for step in range(30):
                for behavior in BEHAVIORS:
                    decision, _ = env.get_steps(behavior)
                    actions = np.full((len(decision), 3), step % 3, dtype=np.int32)
                    env.set_actions(behavior, ActionTuple(discrete=actions))
                env.step()
                out += [env.get_steps(b)[0].obs[0] for b in BEHAVIORS]
            return out
        finally:
            env.close()

    first, second = observations(4), observations(4)
    for a, b in zip(first, second, strict=True):
        np.testing.assert_array_equal(a, b)
    assert not all(np.array_equal(a, b) for a, b in zip(first, observations(5), strict=True))


@pytest.fixture(scope="module")
def soccer_policy(tmp_path_factory: pytest.TempPathFactory):
    """A small untrained policy of the real SoccerTwos interface (two ray inputs, 336 values,
    3 x 3 discrete), exported to ML-Agents' ONNX by the project's exporter."""
    import torch

    from huggy_agent.actor.networks import Actor, ActorArchitecture, InputArchitecture
    from huggy_agent.formats.export_onnx import export_onnx
    from huggy_agent_client.spec import ObservationInput

    architecture = ActorArchitecture(
        inputs=(InputArchitecture(ObservationInput("obs_0", (264,), "vector")),
                InputArchitecture(ObservationInput("obs_1", (72,), "vector"))),
        hidden_units=32, num_layers=2, discrete_branches=(3, 3, 3))
    torch.manual_seed(0)
    actor = Actor(architecture).eval()
    return export_onnx(actor, tmp_path_factory.mktemp("soccer_policy") / "SoccerTwos.onnx")


def test_policy_of_the_real_interface_matches_onnxruntime(soccer_policy) -> None:
    """HuggyAgent loads it with the scene's spec and its deterministic actions are the ONNX
    graph's own (onnxruntime)."""
    import onnxruntime

    from huggy_agent import HuggyAgent

    agent = HuggyAgent(soccer_policy, device="cpu")
    assert [i.shape for i in agent.spec.inputs] == [(264,), (72,)]
    assert agent.spec.discrete_branches == (3, 3, 3)
    obs = SoccerSim(SoccerConfig(num_arenas=4), seed=2).opening.obs
    first, second = obs[:, :264], obs[:, 264:]
    session = onnxruntime.InferenceSession(str(soccer_policy))
    (reference,) = session.run(["deterministic_discrete_actions"], {
        "obs_0": first, "obs_1": second, "action_masks": np.ones((16, 9), np.float32)})
    np.testing.assert_array_equal(agent.compute_action([first, second]), reference)


@pytest.mark.standin
def test_policy_plays_both_teams_through_mlagents_envs(tmp_path, soccer_policy) -> None:
    from mlagents_envs.base_env import ActionTuple

    from huggy_agent import HuggyAgent

    agent = HuggyAgent(soccer_policy, device="cpu")
    env = _unity(tmp_path, builtin_soccertwos_path(), num_arenas=2)
    try:
        env.reset()
        for step in range(40):
            for behavior in BEHAVIORS:
                decision, _ = env.get_steps(behavior)
                actions = agent.compute_action(decision.obs, deterministic=False, seed=step)
                assert actions.shape == (len(decision), 3)
                env.set_actions(behavior, ActionTuple(discrete=actions.astype(np.int32)))
            env.step()
        assert all(len(env.get_steps(b)[0]) in (0, 4) for b in BEHAVIORS)
    finally:
        env.close()


STRIKER = {"behavior": "Striker", "team": 0, "agents": 2, "continuous_size": 0,
           "discrete_branches": [3, 3, 3],
           "inputs": [{"name": "obs_0", "shape": [294], "kind": "vector"}]}
GOALIE = {"behavior": "Goalie", "team": 1, "agents": 1, "continuous_size": 2,
          "discrete_branches": [],
          "inputs": [{"name": "obs_0", "shape": [8], "kind": "vector"},
                     {"name": "obs_1", "shape": [3, 4], "kind": "variable"}]}


@pytest.mark.standin
def test_two_different_behaviors_in_one_scene(tmp_path) -> None:
    from mlagents_envs.base_env import ActionTuple

    env = _unity(tmp_path, envs.builtin_huggy_path(), additional_args=spec_arguments(
        [STRIKER, GOALIE]), episode_length=5)
    try:
        env.reset()
        assert list(env.behavior_specs) == ["Striker?team=0", "Goalie?team=1"]
        striker, goalie = (env.behavior_specs[b] for b in env.behavior_specs)
        assert [o.shape for o in striker.observation_specs] == [(294,)]
        assert striker.action_spec.discrete_branches == (3, 3, 3)
        assert [o.shape for o in goalie.observation_specs] == [(8,), (3, 4)]
        assert goalie.action_spec.continuous_size == 2
        ends = {"Striker?team=0": 0, "Goalie?team=1": 0}
        for _ in range(10):
            decision, _ = env.get_steps("Striker?team=0")
            assert len(decision) == 2
            env.set_actions("Striker?team=0", ActionTuple(discrete=np.ones((2, 3), np.int32)))
            decision, _ = env.get_steps("Goalie?team=1")
            assert len(decision) == 1
            env.set_actions("Goalie?team=1", ActionTuple(continuous=np.zeros((1, 2),
                                                                            np.float32)))
            env.step()
            for behavior in ends:
                ends[behavior] += len(env.get_steps(behavior)[1])
        assert ends == {"Striker?team=0": 4, "Goalie?team=1": 2}  # 5-decision episodes
    finally:
        env.close()
