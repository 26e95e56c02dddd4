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


def _set_obs(info: object, values: list[float]) -> None:
    data = info.observations[0].float_data.data
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
    for field, d, t in ((rows.agent_id, decision.agent_id, terminal.agent_id),
                        (rows.reward, decision.reward, terminal.reward),
                        (rows.obs[0], decision.obs[0], terminal.obs[0])):
        np.testing.assert_array_equal(field[~done], d)
        np.testing.assert_array_equal(field[done], t)
    np.testing.assert_array_equal(rows.interrupted[done], terminal.interrupted)
    assert not rows.interrupted[~done].any() and rows.mask is None


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
