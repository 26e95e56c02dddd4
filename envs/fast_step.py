"""The hot step path between Python and Unity: speed-ups of mlagents-envs' per-step work, with
the same results (checked against the originals in tests).

- The player's calls are served in the thread that steps the environment
  (`envs.lockstep.LockstepCommunicator`) instead of by `grpc`'s server threads, which handed
  each message to the main thread through a pickling `multiprocessing.Pipe`.
- `steps_from_proto` reads float observations with one bulk copy per agent.
- The step input is encoded to protobuf wire bytes with numpy (`encode_agent_actions`) instead
  of one `extend` per agent and field.
- `lean_step` goes further for a build with one behavior: one exchange that reads the agents
  straight into arrays, without mlagents-envs' per-step objects (`envs.instance` uses it).

Their NaN/inf errors are the originals', field for field (`raise_on_nan_and_inf`).
`install()` (called by `envs.compat.apply`) swaps them in; `set_fast_paths(False)` swaps the
originals back, for measuring and comparing.
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import numpy as np

from envs.lockstep import lockstep_communicator
from envs.protobuf_wire import varint


def encode_agent_actions(continuous: np.ndarray | None, discrete: np.ndarray | None = None
                         ) -> bytes | None:
    """The wire bytes of a `ListAgentActionProto` holding one `AgentActionProto` per row, as
    mlagents-envs' `_generate_step_input` builds it: `continuous_actions`, `discrete_actions`, and
    `vector_actions_deprecated` holding both (the continuous ones, then the discrete ones as
    floats). Parsing the result gives exactly that message.

    Args:
        continuous: (n, c) continuous actions, or None; may have no columns.
        discrete: (n, branches) discrete actions, or None; may have no columns.

    Returns:
        The bytes (empty for no rows); None (build it field by field) where a discrete action lies
            outside [0, 128), whose varint would not take one byte.
    """
    given = continuous if continuous is not None else discrete
    n = 0 if given is None else len(given)
    if n == 0:
        return b""
    floats = (None if continuous is None or not continuous.size
              else np.ascontiguousarray(continuous, dtype="<f4").reshape(n, -1))
    choices = None if discrete is None or not discrete.size else np.asarray(discrete).reshape(n, -1)
    if choices is not None and not ((choices >= 0).all() and (choices < 0x80).all()):
        return None
    width = 0 if floats is None else floats.shape[1]
    template, (deprecated, continuous_at, discrete_at) = _action_table(
        n, width, 0 if choices is None else choices.shape[1])
    table = template.copy()
    if floats is not None:
        float_bytes = floats.view(np.uint8).reshape(n, 4 * width)
        table[:, deprecated:deprecated + 4 * width] = float_bytes
        table[:, continuous_at:continuous_at + 4 * width] = float_bytes
    if choices is not None:
        start = deprecated + 4 * width
        table[:, start:start + 4 * choices.shape[1]] = (
            choices.astype("<f4").view(np.uint8).reshape(n, -1))
        table[:, discrete_at:discrete_at + choices.shape[1]] = choices
    return table.tobytes()


@functools.lru_cache(maxsize=16)
def _action_table(n: int, continuous: int, discrete: int) -> tuple[np.ndarray, tuple[int, ...]]:
    """A (n, entry bytes) template of `encode_agent_actions` whose constant bytes (the tags and
    lengths of each entry) are written, and where the values of each field start: the
    deprecated floats, the continuous floats, the discrete one-byte varints. Read-only:
    callers copy it."""
    from mlagents_envs.communicator_objects.agent_action_pb2 import AgentActionProto

    fields = AgentActionProto.DESCRIPTOR.fields_by_name
    parts = [("vector_actions_deprecated", 4 * (continuous + discrete)),
             ("continuous_actions", 4 * continuous), ("discrete_actions", discrete)]
    body = bytearray()
    starts = []
    for name, size in parts:
        if size:  # an empty packed field is not written
            body += varint(fields[name].number << 3 | 2) + varint(size)
        starts.append(len(body))
        body += bytes(size)
    head = varint(1 << 3 | 2) + varint(len(body))  # ListAgentActionProto.value = 1
    template = np.frombuffer(head + bytes(body), np.uint8)[None].repeat(n, 0)
    template.flags.writeable = False
    return template, tuple(len(head) + start for start in starts)


_ORIGINALS: dict[str, Any] = {}
_FAST: dict[str, Any] = {}
_lean_enabled = True


def install() -> None:
    """Swap mlagents-envs' step functions for this module's (once, by `envs.compat.apply`)."""
    from mlagents_envs import environment, rpc_utils

    _ORIGINALS.update(
        communicator=environment.UnityEnvironment.__dict__["_get_communicator"],
        steps_from_proto=rpc_utils.steps_from_proto,
        generate_step_input=environment.UnityEnvironment._generate_step_input,
    )
    _FAST.update(
        communicator=staticmethod(lockstep_communicator),
        steps_from_proto=_steps_from_proto,
        generate_step_input=_generate_step_input,
    )
    set_fast_paths(True)


def set_fast_paths(enabled: bool) -> None:
    """Switch the speed-ups on (the default) or back to mlagents-envs' originals (`lean_step` then
    declines).

    For measuring them (bench/bench_envs.py) and checking they change nothing (tests); takes
    effect for environments created afterwards (the communicator is chosen at creation).

    Args:
        enabled: True for this module's step functions, False for mlagents-envs' own.
    """
    from mlagents_envs import environment, rpc_utils

    global _lean_enabled
    _lean_enabled = enabled
    chosen = _FAST if enabled else _ORIGINALS
    environment.UnityEnvironment._get_communicator = chosen["communicator"]
    rpc_utils.steps_from_proto = chosen["steps_from_proto"]
    environment.steps_from_proto = chosen["steps_from_proto"]
    environment.UnityEnvironment._generate_step_input = chosen["generate_step_input"]


def original_steps_from_proto(agent_info_list: Any, behavior_spec: Any) -> Any:
    """mlagents-envs' own `rpc_utils.steps_from_proto`.

    Args:
        agent_info_list: one behavior's `AgentInfoProto`s.
        behavior_spec: the behavior's spec.

    Returns:
        (DecisionSteps, TerminalSteps).
    """
    return _ORIGINALS["steps_from_proto"](agent_info_list, behavior_spec)


def _steps_from_proto(agent_info_list: Any, behavior_spec: Any) -> Any:
    """`rpc_utils.steps_from_proto` reading the agents in bulk (`read_agent_infos`): vector
    and variable-length observations, any actions, masks and groups; anything else (visual
    observations, compressed ones, no agents) goes to the original."""
    return _fast_steps_from_proto(agent_info_list, behavior_spec, original_steps_from_proto)


def _generate_step_input(self: Any, vector_action: dict) -> Any:
    """`UnityEnvironment._generate_step_input` encoding the actions with numpy
    (`encode_agent_actions`); the original where a discrete action is outside [0, 128)."""
    from mlagents_envs.communicator_objects.command_pb2 import STEP
    from mlagents_envs.communicator_objects.unity_rl_input_pb2 import UnityRLInputProto

    rl_in = UnityRLInputProto()
    for name, action in vector_action.items():
        if len(self._env_state[name][0]) == 0:
            continue
        encoded = encode_agent_actions(action.continuous, action.discrete)
        if encoded is None:
            return _ORIGINALS["generate_step_input"](self, vector_action)
        rl_in.agent_actions[name].MergeFromString(encoded)
        rl_in.command = STEP
    rl_in.side_channel = bytes(self._side_channel_manager.generate_side_channel_messages())
    return self._wrap_unity_input(rl_in)


# -- reading agent infos in bulk ------------------------------------------------------------------


class AgentColumns(NamedTuple):
    """One behavior's agent infos as arrays, one row per agent in Unity's order."""

    obs: list[np.ndarray]  # each (n, *shape) float32
    reward: np.ndarray  # (n,) float32
    group_reward: np.ndarray  # (n,) float32
    agent_id: np.ndarray  # (n,) int64
    group_id: np.ndarray  # (n,) int64
    done: np.ndarray  # (n,) bool
    max_step: np.ndarray  # (n,) bool
    masked: np.ndarray | None  # (n, sum of branches) bool, mlagents-envs' (True = not allowed)


def _float_rows(infos: list, index: int, size: int) -> np.ndarray | None:
    """(len(infos), size) float32 of every agent's observation `index`, read as packed bytes
    (one serialization per agent); None when an agent has no such observation or its float
    data is not exactly `size` floats."""
    try:
        joined = b"".join([info.observations[index].float_data.SerializeToString()
                           for info in infos])
    except IndexError:  # an agent without that observation
        return None
    head = bytes([0x0A]) + varint(4 * size)  # FloatData.data = 1, packed
    row = len(head) + 4 * size
    if not size or len(joined) != row * len(infos):
        return None
    table = np.frombuffer(joined, dtype=np.uint8).reshape(len(infos), row)
    if not (table[:, : len(head)] == np.frombuffer(head, np.uint8)).all():
        return None
    return table[:, len(head):].copy().view("<f4").astype(np.float32, copy=False)


def _masks(infos: list, width: int) -> np.ndarray:
    """(len(infos), width) bool: each agent's action mask (True = not allowed), all False for
    an agent whose mask is not `width` long, as mlagents-envs reads them."""
    masks = [info.action_mask for info in infos]
    if all(len(mask) == width for mask in masks):
        return np.array(masks, dtype=bool).reshape(len(infos), width)
    return np.array([list(mask) if len(mask) == width else [False] * width for mask in masks],
                    dtype=bool).reshape(len(infos), width)


def read_agent_infos(agent_info_list: Any, behavior_spec: Any) -> AgentColumns | None:
    """One behavior's agent infos as arrays: the scalars in one pass over the agents, each
    observation in one bulk copy. The values are exactly those of `rpc_utils.steps_from_proto`.

    Args:
        agent_info_list: mlagents-envs' `AgentInfoProto`s of one behavior.
        behavior_spec: the behavior's spec.

    Returns:
        The agents as `AgentColumns`, in Unity's order; None, to leave them to mlagents-envs' own
            code, for no agents, a visual (rank 3) observation, or an observation whose float data
            is not the spec's size.
    """
    specs = behavior_spec.observation_specs
    if not len(agent_info_list) or any(len(spec.shape) > 2 for spec in specs):
        return None
    infos = list(agent_info_list)
    n = len(infos)
    obs = []
    for index, spec in enumerate(specs):
        values = _float_rows(infos, index, math.prod(spec.shape))
        if values is None:
            return None
        obs.append(values.reshape((n, *spec.shape)))
    # float64 holds the float32 rewards and the int32 ids exactly
    scalars = np.array([(i.reward, i.group_reward, i.id, i.group_id, i.done, i.max_step_reached)
                        for i in infos], dtype=np.float64).reshape(n, 6)
    # one conversion per dtype; the columns are views of its result
    rewards, ids, flags = (scalars[:, 0:2].astype(np.float32), scalars[:, 2:4].astype(np.int64),
                           scalars[:, 4:6] != 0)
    width = sum(behavior_spec.action_spec.discrete_branches)
    return AgentColumns(obs, rewards[:, 0], rewards[:, 1], ids[:, 0], ids[:, 1], flags[:, 0],
                        flags[:, 1], _masks(infos, width) if width else None)


_FLOAT32_MAX = float(np.finfo(np.float32).max)


def _mean_cannot_overflow(values: np.ndarray) -> bool:
    """True when every value is finite and no float32 sum of any of them, in any order, can
    reach inf: n * max |x| stays under half of float32's largest value (a margin for rounding).
    Then mlagents-envs' check passes on every subset of `values`."""
    return values.size == 0 or float(np.abs(values).max()) * values.size < _FLOAT32_MAX / 2


def raise_on_nan_and_inf(obs: list[np.ndarray], reward: np.ndarray, group_reward: np.ndarray,
                         done: np.ndarray) -> None:
    """Raise mlagents-envs' NaN/inf errors for one behavior's agents, as `rpc_utils.steps_from_proto`
    raises them: the same checks on the same arrays in its order (each observation, of deciding
    agents then of finished ones; then rewards, then group rewards, each deciding first), so the
    same first field and message.

    Its check is `np.mean` in float32: NaN anywhere gives "NaN values" (so do +inf and -inf
    together), inf "Infinite values", and so do finite values whose float32 sum overflows
    (observations of 2e38). That last behaviour is kept on purpose: the fast paths promise the
    original's errors, and a policy has nothing useful to do with such observations anyway.
    A cheap exact test (`_mean_cannot_overflow`) skips the checks when none can fail.

    Args:
        obs: the behavior's vector and variable-length observations, rows in Unity's order.
        reward: each agent's reward.
        group_reward: each agent's group reward.
        done: which rows are finished agents.

    Raises:
        RuntimeError: mlagents-envs' message for the first field holding NaN or infinite values.
    """
    fields = [*((values, "observations") for values in obs), (reward, "rewards"),
              (group_reward, "group_rewards")]
    if all(_mean_cannot_overflow(values) for values, _ in fields):
        return
    from mlagents_envs.rpc_utils import _raise_on_nan_and_inf

    for values, source in fields:
        _raise_on_nan_and_inf(values[~done], source)
        _raise_on_nan_and_inf(values[done], source)


def _split_indices(branches: tuple[int, ...]) -> list[int]:
    """Where `np.split` cuts a joined mask into one array per branch."""
    return np.cumsum(branches)[:-1].tolist()


def _fast_steps_from_proto(agent_info_list: Any, behavior_spec: Any, fallback: Any) -> Any:
    """`steps_from_proto` from `read_agent_infos`; anything it does not read goes to
    `fallback`."""
    from mlagents_envs.base_env import DecisionSteps, TerminalSteps

    columns = read_agent_infos(agent_info_list, behavior_spec)
    if columns is None:
        return fallback(agent_info_list, behavior_spec)
    done = columns.done
    raise_on_nan_and_inf(columns.obs, columns.reward, columns.group_reward, done)
    steps = []
    for rows in (~done, done):
        steps.append(([values[rows] for values in columns.obs], columns.reward[rows],
                      columns.agent_id[rows].astype(np.int32), columns.group_id[rows].tolist(),
                      columns.group_reward[rows]))
    (obs_d, rew_d, ids_d, gid_d, grew_d), (obs_t, rew_t, ids_t, gid_t, grew_t) = steps
    mask = None
    if columns.masked is not None and len(ids_d):
        mask = np.split(columns.masked[~done], _split_indices(
            behavior_spec.action_spec.discrete_branches), axis=1)
    return (DecisionSteps(obs_d, rew_d, ids_d, mask, gid_d, grew_d),
            TerminalSteps(obs_t, rew_t, columns.max_step[done], ids_t, gid_t, grew_t))


class AgentRows(NamedTuple):
    """One behavior's agents after a step, one row per agent in Unity's order: decision steps
    (`done` False) and terminal steps (`done` True, `interrupted` where the max step ended it).
    `mask` holds the deciding agents' action masks, mlagents-envs' way (True = not allowed):
    None without discrete actions or masks."""

    agent_id: np.ndarray  # (m,) int64
    reward: np.ndarray  # (m,) float32
    done: np.ndarray  # (m,) bool
    interrupted: np.ndarray  # (m,) bool
    obs: list[np.ndarray]  # each (m, *shape) float32
    mask: np.ndarray | None = None  # (deciding agents, sum of branches) bool
    group_reward: np.ndarray | None = None  # (m,) float32, the agents' groups' rewards

    def total_reward(self) -> np.ndarray:
        """Each agent's own reward plus its group's (a POCA scene rewards groups).

        Returns:
            (m,) float32.
        """
        return self.reward if self.group_reward is None else self.reward + self.group_reward


def join_rows(first: AgentRows, second: AgentRows) -> AgentRows:
    """The rows of two exchanges in a row.

    Args:
        first: the first exchange's rows.
        second: the second's.

    Returns:
        `first`'s rows then `second`'s; the masks are `second`'s (the deciding agents', where
            `first` has none deciding).
    """
    return AgentRows(
        np.concatenate([first.agent_id, second.agent_id]),
        np.concatenate([first.reward, second.reward]),
        np.concatenate([first.done, second.done]),
        np.concatenate([first.interrupted, second.interrupted]),
        [np.concatenate([a, b]) for a, b in zip(first.obs, second.obs, strict=True)],
        second.mask, np.concatenate([first.total_reward() - first.reward,
                                     second.total_reward() - second.reward]))


def agent_rows(decision: Any, terminal: Any) -> AgentRows:
    """`AgentRows` of mlagents-envs' step results.

    Args:
        decision: DecisionSteps (their rows first).
        terminal: TerminalSteps.

    Returns:
        The rows, the masks joined into one array per deciding agent.
    """
    mask = decision.action_mask
    return AgentRows(
        np.concatenate([decision.agent_id, terminal.agent_id]).astype(np.int64),
        np.concatenate([decision.reward, terminal.reward]).astype(np.float32),
        np.repeat([False, True], [len(decision), len(terminal)]),
        np.concatenate([np.zeros(len(decision), bool), terminal.interrupted]),
        [np.concatenate([d, t]).astype(np.float32)
         for d, t in zip(decision.obs, terminal.obs, strict=True)],
        None if mask is None else np.concatenate(mask, axis=1),
        np.concatenate([decision.group_reward, terminal.group_reward]).astype(np.float32))


def lean_step(env: Any, behavior: str, continuous: np.ndarray) -> AgentRows | None:
    """`env.set_actions(behavior, ActionTuple(continuous))`, `env.step()` and `env.get_steps`, as
    one exchange that reads the agents straight into `AgentRows`: no ActionTuple, no copies of the
    input message, no DecisionSteps or TerminalSteps. Side channels and behavior specs are
    processed as `UnityEnvironment.step` does; observations, rewards and group rewards are checked
    for NaN and inf exactly as mlagents-envs checks them (`raise_on_nan_and_inf`). While it is
    used, `env.get_steps` is not kept up to date (a reset refreshes it).

    Args:
        env: a loaded `UnityEnvironment` whose only behavior is `behavior`, with one vector
            observation and continuous actions (checked by the caller).
        behavior: the behavior's name.
        continuous: (n, c) actions of its deciding agents.

    Returns:
        The agents after the step; None, sending nothing, for any other env or when the fast paths
            are off (the caller then uses mlagents-envs' own calls).

    Raises:
        UnityCommunicatorStoppedException: the player answered with a status other than 200.
        RuntimeError: NaN or infinite values in what the player sent.
    """
    from mlagents_envs.communicator_objects.command_pb2 import STEP
    from mlagents_envs.communicator_objects.unity_message_pb2 import UnityMessageProto
    from mlagents_envs.exception import UnityCommunicatorStoppedException

    specs = env._env_specs
    if not _lean_enabled or env._is_first_message or len(specs) != 1 or behavior not in specs:
        return None
    message = UnityMessageProto()
    message.header.status = 200
    rl_in = message.unity_input.rl_input
    if len(continuous):
        rl_in.agent_actions[behavior].MergeFromString(encode_agent_actions(continuous))
    rl_in.command = STEP
    rl_in.side_channel = bytes(env._side_channel_manager.generate_side_channel_messages())
    communicator = env._communicator  # what RpcCommunicator.exchange does, without its copy
    connection = communicator.unity_to_external.parent_conn
    connection.send(message)
    communicator.poll_for_timeout(env._poll_process)
    answer = connection.recv()
    if answer.header.status != 200:
        raise UnityCommunicatorStoppedException("Communicator has exited.")
    output = answer.unity_output
    env._update_behavior_specs(output)
    rl_output = output.rl_output
    if len(specs) != 1:  # a behavior appeared: mlagents-envs keeps the state of them all
        env._update_state(rl_output)
        return agent_rows(*env.get_steps(behavior))
    env._side_channel_manager.process_side_channel_message(rl_output.side_channel)
    infos = rl_output.agentInfos[behavior].value if behavior in rl_output.agentInfos else []
    return lean_rows(infos, specs[behavior])


def lean_rows(infos: Any, spec: Any) -> AgentRows:
    """`AgentRows` of one behavior's agent infos, read in bulk where `read_agent_infos` can.

    Args:
        infos: the behavior's `AgentInfoProto`s.
        spec: its behavior spec.

    Returns:
        The rows in Unity's order; the masks are the deciding agents' (None when all are done).

    Raises:
        RuntimeError: the NaN/inf errors of `steps_from_proto` (`raise_on_nan_and_inf`).
    """
    columns = read_agent_infos(infos, spec)
    if columns is None:
        return agent_rows(*original_steps_from_proto(infos, spec))
    done, group_reward = columns.done, columns.group_reward
    raise_on_nan_and_inf(columns.obs, columns.reward, group_reward, done)
    masked = columns.masked
    return AgentRows(columns.agent_id, columns.reward, done, done & columns.max_step,
                     columns.obs, None if masked is None or done.all() else masked[~done],
                     group_reward if group_reward.any() else None)
