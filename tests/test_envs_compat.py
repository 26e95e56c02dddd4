"""mlagents-envs 1.1.0 on protobuf >= 5: rebuilt messages, and fast paths equal to the originals."""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest

import envs  # noqa: F401  (applies the compatibility layer)
from envs import compat, fast_step


def test_protobuf_is_current_and_messages_round_trip() -> None:
    import google.protobuf
    from mlagents_envs.communicator_objects.unity_message_pb2 import UnityMessageProto

    assert int(google.protobuf.__version__.split(".")[0]) >= 5
    message = UnityMessageProto()
    message.header.status = 200
    message.unity_input.rl_initialization_input.seed = 42
    message.unity_input.rl_initialization_input.communication_version = "1.5.0"
    parsed = UnityMessageProto.FromString(message.SerializeToString())
    assert parsed.unity_input.rl_initialization_input.seed == 42
    assert parsed == message


def test_rebuilt_descriptors_are_the_shipped_ones() -> None:
    """Each rebuilt module's descriptor serializes to the bytes embedded in the shipped file."""
    import importlib.util
    from pathlib import Path

    from google.protobuf import descriptor_pb2

    folder = Path(importlib.util.find_spec("mlagents_envs.communicator_objects").origin).parent
    modules = sorted(folder.glob("*_pb2.py"))
    assert len(modules) >= 20
    for path in modules:
        shipped = compat._serialized_descriptor(path.read_text(), path)
        module = sys.modules[f"mlagents_envs.communicator_objects.{path.stem}"]
        rebuilt = descriptor_pb2.FileDescriptorProto()
        module.DESCRIPTOR.CopyToProto(rebuilt)
        assert rebuilt == descriptor_pb2.FileDescriptorProto.FromString(shipped), path.name


def test_import_envs_needs_no_gym_pettingzoo_or_network() -> None:
    code = (
        "import socket\n"
        "def refuse(*a, **k): raise AssertionError('network used at import')\n"
        "socket.socket.connect = refuse\n"
        "socket.create_connection = refuse\n"
        "import sys, envs\n"
        "from mlagents_envs.environment import UnityEnvironment\n"
        "bad = [m for m in ('gym', 'pettingzoo', 'mlagents_envs.envs', 'ray') if m in sys.modules]\n"
        "assert not bad, bad\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_distutils_shim_compares_like_strictversion(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "distutils", None)  # makes `import distutils` fail
    monkeypatch.setitem(sys.modules, "distutils.version", None)
    compat._install_distutils_shim()
    from distutils.version import StrictVersion  # the shim

    assert StrictVersion is compat.StrictVersion

    assert StrictVersion("1.5.0").version == (1, 5, 0)
    assert StrictVersion("2.1").version == (2, 1, 0)
    with pytest.raises(ValueError, match="invalid version number 'x.y'"):
        StrictVersion("x.y")


def test_encode_agent_actions_matches_the_protobuf_api() -> None:
    from mlagents_envs.communicator_objects.agent_action_pb2 import AgentActionProto
    from mlagents_envs.communicator_objects.unity_rl_input_pb2 import UnityRLInputProto

    actions = np.random.default_rng(0).standard_normal((18, 21)).astype(np.float32)
    fast = UnityRLInputProto()
    fast.agent_actions["Huggy?team=0"].MergeFromString(fast_step.encode_agent_actions(actions))
    slow = UnityRLInputProto()
    for row in actions:
        action = AgentActionProto()
        action.vector_actions_deprecated.extend(row)
        action.continuous_actions.extend(row)
        slow.agent_actions["Huggy?team=0"].value.extend([action])
    assert fast == slow
    assert fast_step.encode_agent_actions(np.zeros((0, 21), np.float32)) == b""


@pytest.mark.parametrize("continuous,branches", [(0, (3, 3, 3)), (2, (2, 5)), (0, ()), (4, ())])
def test_generate_step_input_equals_the_original(continuous: int, branches: tuple) -> None:
    """Discrete, hybrid and continuous actions of several behaviors (one with no agents) encode
    to the message mlagents-envs' own `_generate_step_input` builds."""
    from mlagents_envs.base_env import ActionSpec, ActionTuple
    from mlagents_envs.communicator_objects.unity_input_pb2 import UnityInputProto

    rng = np.random.default_rng(7)
    spec = ActionSpec(continuous, branches)
    actions, env = {}, _bare_environment()
    for name, n in (("A?team=0", 9), ("B?team=1", 0), ("C?team=1", 130)):
        empty = spec.empty_action(n)
        actions[name] = ActionTuple(
            rng.standard_normal((n, continuous)).astype(np.float32) if continuous
            else empty.continuous,
            np.stack([rng.integers(0, b, n) for b in branches], axis=1).astype(np.int32)
            if branches else empty.discrete)
        env._env_state[name] = (range(n), None)  # only len() of the decision steps is read
    fast = fast_step._generate_step_input(env, actions)
    slow = fast_step._ORIGINALS["generate_step_input"](env, actions)
    assert UnityInputProto.FromString(fast.SerializeToString()) == slow
    assert len(slow.rl_input.agent_actions["C?team=1"].value) == 130


def test_discrete_actions_outside_one_byte_take_the_original_path() -> None:
    """A discrete action of 128 or more, or below 0, needs a longer varint: the numpy encoder
    declines and the message is built field by field, as mlagents-envs does."""
    from mlagents_envs.base_env import ActionTuple
    from mlagents_envs.communicator_objects.unity_input_pb2 import UnityInputProto

    for value in (128, 300, -1):
        discrete = np.array([[1, value], [0, 2]], np.int32)
        assert fast_step.encode_agent_actions(None, discrete) is None
        env = _bare_environment()
        env._env_state["A?team=0"] = (range(2), None)
        actions = {"A?team=0": ActionTuple(np.zeros((2, 0), np.float32), discrete)}
        fast = fast_step._generate_step_input(env, actions)
        assert UnityInputProto.FromString(fast.SerializeToString()) == \
            fast_step._ORIGINALS["generate_step_input"](env, actions)
        assert list(fast.rl_input.agent_actions["A?team=0"].value[0].discrete_actions) == \
            [1, value]


def _bare_environment():  # mlagents_envs imported lazily
    """A `UnityEnvironment` with just what `_generate_step_input` reads."""
    from mlagents_envs.environment import UnityEnvironment
    from mlagents_envs.side_channel.side_channel_manager import SideChannelManager

    env = UnityEnvironment.__new__(UnityEnvironment)
    env._env_state = {}
    env._side_channel_manager = SideChannelManager([])
    return env


def _agent_infos(rng: np.random.Generator, n: int, width: int) -> list:
    from mlagents_envs.communicator_objects.agent_info_pb2 import AgentInfoProto

    infos = []
    for i in range(n):
        info = AgentInfoProto(id=int(rng.integers(0, 10_000)), reward=float(rng.normal()),
                              done=bool(i % 3 == 0), max_step_reached=bool(i % 6 == 0),
                              group_id=i % 2, group_reward=float(rng.normal()))
        obs = info.observations.add()
        obs.shape.append(width)
        obs.dimension_properties.append(1)
        obs.float_data.data.extend(rng.standard_normal(width).astype(np.float32))
        infos.append(info)
    return infos


def _vector_spec(obs_size: int, act_size: int):  # mlagents_envs imported lazily
    """A BehaviorSpec with one vector observation and continuous actions."""
    from mlagents_envs.base_env import (
        ActionSpec,
        BehaviorSpec,
        DimensionProperty,
        ObservationSpec,
        ObservationType,
    )

    return BehaviorSpec(
        [ObservationSpec((obs_size,), (DimensionProperty.NONE,), ObservationType.DEFAULT, "")],
        ActionSpec(act_size, ()),
    )


def test_fast_steps_from_proto_equals_the_original() -> None:
    from mlagents_envs import rpc_utils

    spec = _vector_spec(59, 21)
    infos = _agent_infos(np.random.default_rng(1), 18, 59)
    fast = rpc_utils.steps_from_proto(infos, spec)
    slow = fast_step.original_steps_from_proto(infos, spec)
    for mine, theirs in zip(fast, slow, strict=True):
        np.testing.assert_array_equal(mine.obs[0], theirs.obs[0])
        np.testing.assert_array_equal(mine.reward, theirs.reward)
        np.testing.assert_array_equal(mine.agent_id, theirs.agent_id)
        np.testing.assert_array_equal(mine.group_id, theirs.group_id)
        np.testing.assert_array_equal(mine.group_reward, theirs.group_reward)
        assert mine.obs[0].dtype == theirs.obs[0].dtype == np.float32
    np.testing.assert_array_equal(fast[1].interrupted, slow[1].interrupted)
    assert len(fast[0]) == 12 and len(fast[1]) == 6


def test_fast_steps_from_proto_rejects_nan_like_the_original() -> None:
    from mlagents_envs import rpc_utils

    spec = _vector_spec(4, 2)
    infos = _agent_infos(np.random.default_rng(2), 3, 4)
    infos[1].observations[0].float_data.data[2] = float("nan")
    with pytest.raises(RuntimeError, match="observations provided had NaN values"):
        rpc_utils.steps_from_proto(infos, spec)


def _set_obs(info: object, values: list[float], index: int = 0) -> None:
    data = info.observations[index].float_data.data
    data[:len(values)] = values


NAN, INF = float("nan"), float("inf")
# Six agents, 4 floats each; agents 0 and 3 are finished (done), 1, 2, 4, 5 are deciding. The
# original checks observations (deciding, then finished), then rewards, then group rewards, each
# with `np.mean` in float32.
BAD_STEPS = {
    "nan-obs-finished-and-inf-reward-deciding": (
        lambda i: (_set_obs(i[0], [NAN]), setattr(i[1], "reward", INF)),
        "The observations provided had NaN values."),
    "inf-reward-deciding-and-nan-group-reward-finished": (
        lambda i: (setattr(i[1], "reward", INF), setattr(i[0], "group_reward", NAN)),
        "The rewards provided had Infinite values."),
    "nan-reward-finished": (
        lambda i: setattr(i[3], "reward", NAN), "The rewards provided had NaN values."),
    "nan-group-reward-deciding": (
        lambda i: setattr(i[2], "group_reward", NAN), "The group_rewards provided had NaN values."),
    "inf-group-reward-finished": (
        lambda i: setattr(i[3], "group_reward", -INF),
        "The group_rewards provided had Infinite values."),
    "2e38-obs-deciding": (  # finite, but their float32 mean overflows
        lambda i: _set_obs(i[4], [2e38, 2e38, 2e38, 2e38]),
        "The observations provided had Infinite values."),
    "inf-and-minus-inf-obs-deciding": (  # inf - inf: the mean is NaN
        lambda i: (_set_obs(i[1], [INF]), _set_obs(i[2], [-INF])),
        "The observations provided had NaN values."),
    "inf-obs-deciding-and-minus-inf-obs-finished": (  # checked apart: no cancelling
        lambda i: (_set_obs(i[1], [INF]), _set_obs(i[0], [-INF])),
        "The observations provided had Infinite values."),
}


def _three_paths() -> dict[str, object]:
    """mlagents-envs' `steps_from_proto`, and the two fast paths that stand in for it."""
    from mlagents_envs import rpc_utils

    return {"original": fast_step.original_steps_from_proto, "fast": rpc_utils.steps_from_proto,
            "lean": fast_step.lean_rows}


# mlagents-envs finds infinities through a float32 mean, which overflows (or meets inf - inf) on
# purpose in these cases; numpy warns about it.
@pytest.mark.filterwarnings("ignore:overflow encountered in reduce:RuntimeWarning")
@pytest.mark.filterwarnings("ignore:invalid value encountered in reduce:RuntimeWarning")
@pytest.mark.parametrize("path", ["original", "fast", "lean"])
@pytest.mark.parametrize("case", BAD_STEPS)
def test_fast_paths_raise_the_original_error_on_the_same_field(case: str, path: str) -> None:
    spec = _vector_spec(4, 2)
    infos = _agent_infos(np.random.default_rng(4), 6, 4)
    assert [info.done for info in infos] == [True, False, False, True, False, False]
    spoil, message = BAD_STEPS[case]
    spoil(infos)
    with pytest.raises(RuntimeError, match=f"^{re.escape(message)}$"):
        _three_paths()[path](infos, spec)


def test_finite_values_whose_mean_does_not_overflow_pass_every_path() -> None:
    """3e38 once per field: no float32 sum overflows, so nothing raises; it takes the exact
    check (past the cheap test) in the fast paths."""
    spec = _vector_spec(4, 2)
    infos = _agent_infos(np.random.default_rng(5), 6, 4)
    _set_obs(infos[1], [3e38])
    infos[2].reward = 3e38
    decision, terminal = fast_step.original_steps_from_proto(infos, spec)
    fast_decision, fast_terminal = _three_paths()["fast"](infos, spec)
    for mine, theirs in ((fast_decision, decision), (fast_terminal, terminal)):
        np.testing.assert_array_equal(mine.obs[0], theirs.obs[0])
        np.testing.assert_array_equal(mine.reward, theirs.reward)
    assert decision.obs[0][0, 0] == np.float32(3e38) and decision.reward[1] == np.float32(3e38)
    _assert_rows_are_the_steps(fast_step.lean_rows(infos, spec), infos, decision, terminal)


def test_lean_rows_equal_the_original_steps() -> None:
    spec = _vector_spec(59, 21)
    infos = _agent_infos(np.random.default_rng(6), 18, 59)
    _assert_rows_are_the_steps(fast_step.lean_rows(infos, spec), infos,
                               *fast_step.original_steps_from_proto(infos, spec))


def _assert_rows_are_the_steps(rows: fast_step.AgentRows, infos: list, decision: object,
                               terminal: object) -> None:
    """`rows` (Unity's order) hold the original's decision steps, then its terminal steps."""
    done = np.array([info.done for info in infos])
    np.testing.assert_array_equal(rows.done, done)
    pairs = [(rows.agent_id, decision.agent_id, terminal.agent_id),
             (rows.reward, decision.reward, terminal.reward),
             *zip(rows.obs, decision.obs, terminal.obs, strict=True)]
    for field, d, t in pairs:
        np.testing.assert_array_equal(field[~done], d)
        np.testing.assert_array_equal(field[done], t)
    np.testing.assert_array_equal(rows.interrupted[done], terminal.interrupted)
    assert not rows.interrupted[~done].any()
    if decision.action_mask is None:
        assert rows.mask is None
    else:
        np.testing.assert_array_equal(rows.mask, np.concatenate(decision.action_mask, axis=1))
    np.testing.assert_array_equal(rows.total_reward()[~done],
                                  decision.reward + decision.group_reward)
    np.testing.assert_array_equal(rows.total_reward()[done],
                                  terminal.reward + terminal.group_reward)


def _spec(shapes: list[tuple[int, ...]], continuous: int, branches: tuple[int, ...]):
    """A BehaviorSpec with observations of `shapes` and the given actions."""
    from mlagents_envs.base_env import (
        ActionSpec,
        BehaviorSpec,
        DimensionProperty,
        ObservationSpec,
        ObservationType,
    )

    return BehaviorSpec([ObservationSpec(shape, (DimensionProperty.NONE,) * len(shape),
                                         ObservationType.DEFAULT, f"obs_{k}")
                         for k, shape in enumerate(shapes)], ActionSpec(continuous, branches))


# Agent ids and group ids of every varint length, negative ones (10 bytes) and 0 (not written).
IDS = [0, 1, 127, 128, 16_383, 16_384, 2**21, 2**31 - 1, -1, -2**31]


def _many_agent_infos(rng: np.random.Generator, n: int, shapes: list, mask_size: int) -> list:
    """Agents of every kind: deciding and finished (some at the max step), rewards and group
    rewards zero or not, every id length, masks of the right size, of another size, or none."""
    from mlagents_envs.communicator_objects.agent_info_pb2 import AgentInfoProto

    infos = []
    for i in range(n):
        info = AgentInfoProto(id=IDS[i % len(IDS)] if i % 3 else 1000 + i,
                              reward=0.0 if i % 4 == 0 else float(rng.normal()),
                              done=i % 5 in (1, 3), max_step_reached=i % 5 == 3,
                              group_id=IDS[(i * 7) % len(IDS)] if i % 2 else 0,
                              group_reward=0.0 if i % 3 == 0 else float(rng.normal()))
        if mask_size and i % 6 != 5:
            info.action_mask.extend((rng.random(mask_size + (i % 7 == 6)) < 0.4).tolist())
        for shape in shapes:
            obs = info.observations.add()
            obs.shape.extend(shape)
            obs.dimension_properties.extend([1] * len(shape))
            obs.float_data.data.extend(rng.standard_normal(int(np.prod(shape))).astype(np.float32))
        infos.append(info)
    return infos


SCENES = {  # observation shapes, continuous actions, discrete branches
    "soccer": ([(264,), (72,)], 0, (3, 3, 3)),
    "vector and variable-length, hybrid": ([(8,), (3, 4)], 2, (2, 5)),
    "one vector, continuous": ([(59,)], 21, ()),
    "one vector, discrete": ([(6,)], 0, (4,)),
}


def _assert_steps_equal(mine: tuple, theirs: tuple) -> None:
    """Every array of mlagents-envs' DecisionSteps and TerminalSteps, with dtypes and types."""
    for side, (m, t) in enumerate(zip(mine, theirs, strict=True)):
        assert len(m.obs) == len(t.obs)
        for a, b in zip(m.obs, t.obs, strict=True):
            assert a.dtype == b.dtype and a.shape == b.shape
            np.testing.assert_array_equal(a, b)
        for name in ("reward", "agent_id", "group_reward"):
            a, b = getattr(m, name), getattr(t, name)
            assert a.dtype == b.dtype, name
            np.testing.assert_array_equal(a, b)
        assert m.group_id == t.group_id and all(type(g) is int for g in m.group_id)
        if side == 0:
            if t.action_mask is None:
                assert m.action_mask is None
            else:
                assert [a.dtype for a in m.action_mask] == [b.dtype for b in t.action_mask]
                for a, b in zip(m.action_mask, t.action_mask, strict=True):
                    np.testing.assert_array_equal(a, b)
        else:
            np.testing.assert_array_equal(m.interrupted, t.interrupted)


@pytest.mark.parametrize("scene", SCENES)
@pytest.mark.parametrize("n", [1, 7, 40])
def test_bulk_steps_from_proto_equal_the_original(scene: str, n: int) -> None:
    """Several observations, discrete and hybrid actions, masks (of the branches' size, of
    another size, none), group ids and rewards, every id length, deciding and finished agents:
    read in bulk, exactly as mlagents-envs reads them one by one."""
    shapes, continuous, branches = SCENES[scene]
    spec = _spec(shapes, continuous, branches)
    infos = _many_agent_infos(np.random.default_rng(n), n, shapes, sum(branches))
    assert fast_step.read_agent_infos(infos, spec) is not None  # the bulk path, not a fallback
    theirs = fast_step.original_steps_from_proto(infos, spec)
    _assert_steps_equal(fast_step._steps_from_proto(infos, spec), theirs)
    _assert_rows_are_the_steps(fast_step.lean_rows(infos, spec), infos, *theirs)


def test_visual_compressed_and_odd_sized_observations_take_the_original_path() -> None:
    """What the bulk reader does not read (an image, a size other than the spec's, an agent
    short of an observation) goes to mlagents-envs' own code, with its results and errors."""
    from mlagents_envs.exception import UnityObservationException

    rng = np.random.default_rng(3)
    image = _spec([(2, 3, 4), (5,)], 0, (3,))
    infos = _many_agent_infos(rng, 6, [(2, 3, 4), (5,)], 3)
    assert fast_step.read_agent_infos(infos, image) is None
    _assert_steps_equal(fast_step._steps_from_proto(infos, image),
                        fast_step.original_steps_from_proto(infos, image))
    vector = _spec([(5,)], 2, ())
    infos = _many_agent_infos(rng, 6, [(5,)], 0)
    infos[4].observations[0].float_data.data.append(1.0)
    infos[4].observations[0].shape[0] = 6
    assert fast_step.read_agent_infos(infos, vector) is None
    with pytest.raises(UnityObservationException, match="id=.*Expected shape \\(5,\\)"):
        fast_step._steps_from_proto(infos, vector)


# Two observations, six agents (0 and 3 finished): the original checks each observation in turn
# (deciding agents, then finished ones), then rewards, then group rewards.
TWO_OBSERVATION_CASES = {
    "inf-obs1-deciding-and-nan-obs0-finished": (
        lambda i: (_set_obs(i[1], [INF], 1), _set_obs(i[0], [NAN], 0)),
        "The observations provided had NaN values."),
    "inf-obs0-finished-and-nan-obs1-deciding": (
        lambda i: (_set_obs(i[3], [INF], 0), _set_obs(i[2], [NAN], 1)),
        "The observations provided had Infinite values."),
    "nan-obs1-finished-and-inf-reward": (
        lambda i: (_set_obs(i[0], [NAN], 1), setattr(i[1], "reward", INF)),
        "The observations provided had NaN values."),
    "nan-group-reward-deciding": (
        lambda i: setattr(i[4], "group_reward", NAN), "The group_rewards provided had NaN values."),
}


@pytest.mark.filterwarnings("ignore:overflow encountered in reduce:RuntimeWarning")
@pytest.mark.filterwarnings("ignore:invalid value encountered in reduce:RuntimeWarning")
@pytest.mark.parametrize("path", ["original", "fast", "lean"])
@pytest.mark.parametrize("case", TWO_OBSERVATION_CASES)
def test_several_observations_raise_the_original_error(case: str, path: str) -> None:
    spec = _spec([(4,), (2, 3)], 0, (3, 2))
    infos = _many_agent_infos(np.random.default_rng(9), 6, [(4,), (2, 3)], 5)
    for info in infos:
        info.done = info in (infos[0], infos[3])
    spoil, message = TWO_OBSERVATION_CASES[case]
    spoil(infos)
    with pytest.raises(RuntimeError, match=f"^{re.escape(message)}$"):
        _three_paths()[path](infos, spec)


@pytest.mark.standin
def test_fast_paths_change_nothing_on_the_wire(tmp_path) -> None:
    """The same seeded run with mlagents-envs' original code paths and with ours."""
    from envs import HuggyVectorEnv
    from tests.support.envs import env_kwargs

    streams = []
    for fast in (False, True):
        fast_step.set_fast_paths(fast)
        try:
            with HuggyVectorEnv(**env_kwargs(tmp_path, max_steps=20, seed=8)) as env:
                stream = [env.reset(seed=8)[0]]
                rng = np.random.default_rng(3)
                for _ in range(45):
                    obs, reward, terminated, truncated, _ = env.step(
                        rng.uniform(-1, 1, (18, 21)))
                    stream += [obs, reward, terminated, truncated]
        finally:
            fast_step.set_fast_paths(True)
        streams.append(stream)
    for slow, fast in zip(*streams, strict=True):
        np.testing.assert_array_equal(slow, fast)
