"""Make mlagents-envs 1.1.0 run on a current stack (Python 3.11+, protobuf 5-7, numpy 2).

`apply()` is called once by `import envs` (and by the instance workers, `envs.bootstrap`); it
imports nothing from `mlagents_envs.envs` (which would fetch a registry over the network and
import gym/pettingzoo). It does three things:

1. **Protobuf.** The `*_pb2.py` modules of mlagents-envs use the pre-3.20 generated-code style that
   protobuf >= 4.21 rejects. Each embeds its serialized file descriptor; we read those bytes from
   the module source (without executing it), add them to the default descriptor pool and build the
   message classes with `google.protobuf.internal.builder`, exactly as current protoc output does.
   The rebuilt modules are installed in `sys.modules` under their original names.
2. **distutils.** `mlagents_envs.environment` imports `distutils.version.StrictVersion`, gone from
   Python 3.12; when it is missing a minimal equivalent is installed.
3. **Speed** (same results, checked against the originals in tests): the servicer hands messages
   to the main thread through in-process queues instead of a pickling `multiprocessing.Pipe`,
   `steps_from_proto` reads float observations with one bulk copy per agent, and the step input is
   encoded to protobuf wire bytes with numpy instead of one `extend` per agent and field.
   Their NaN/inf errors are the originals', field for field (`raise_on_nan_and_inf`).
   `lean_step` goes further for a build with one behavior: one exchange that reads the agents
   straight into arrays, without mlagents-envs' per-step objects (`envs.instance` uses it).
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import queue
import re
import sys
import threading
import types
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

_PACKAGE = "mlagents_envs.communicator_objects"
_applied = False
_lock = threading.Lock()


def apply(own_distutils: bool = False) -> None:
    """Apply every fix once (idempotent, thread-safe). `own_distutils` installs the distutils
    shim even where Python has distutils (saves importing it, ~8 MB): only for processes where
    nothing else needs distutils, such as the instance workers (`envs.bootstrap`)."""
    global _applied
    with _lock:
        if _applied:
            return
        _install_distutils_shim(own_distutils)
        _install_protobuf_modules()
        _install_fast_paths()
        _install_close_guard()
        _applied = True


def install_protobuf_modules() -> None:
    """Only part 1: mlagents-envs' message classes, for processes that just encode and parse
    messages (the stand-in). Idempotent."""
    with _lock:
        _install_protobuf_modules()


# --- 1. protobuf --------------------------------------------------------------------------------


def _serialized_descriptor(source: str, path: Path) -> bytes:
    """The descriptor bytes of a generated module, read with `ast` (never executed).

    Old-style modules pass them as `serialized_pb=_b('...')`, newer ones (mlagents-envs ships one)
    to `AddSerializedFile(b'...')`.
    """
    for node in ast.walk(ast.parse(source, filename=str(path))):
        value = None
        if isinstance(node, ast.keyword) and node.arg == "serialized_pb":
            value = node.value
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "AddSerializedFile"
        ):
            value = node
        if value is not None:
            if isinstance(value, ast.Call) and value.args:
                value = value.args[0]
            if isinstance(value, ast.Constant) and isinstance(value.value, (str, bytes)):
                raw = value.value
                return raw.encode("latin1") if isinstance(raw, str) else raw
    raise RuntimeError(f"no serialized_pb descriptor found in {path}")


def _install_protobuf_modules() -> None:
    """Rebuild every `mlagents_envs.communicator_objects.*_pb2` module for the installed protobuf."""
    if f"{_PACKAGE}.unity_message_pb2" in sys.modules:
        return  # already imported (by us, or by an old protobuf that accepts the originals)
    from google.protobuf import descriptor_pb2, descriptor_pool
    from google.protobuf.internal import builder

    spec = importlib.util.find_spec(_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            "mlagents-envs is not installed; install it with "
            "`pip install --no-deps --ignore-requires-python mlagents-envs==1.1.0`"
        )
    package = importlib.import_module(_PACKAGE)
    folder = Path(next(iter(spec.submodule_search_locations)))
    files: dict[str, tuple[str, bytes]] = {}  # proto file name -> (module name, descriptor bytes)
    for path in sorted(folder.glob("*_pb2.py")):
        data = _serialized_descriptor(path.read_text(encoding="utf-8"), path)
        proto = descriptor_pb2.FileDescriptorProto.FromString(data)
        files[proto.name] = (f"{_PACKAGE}.{path.stem}", data)

    pool = descriptor_pool.Default()
    done: set[str] = set()

    def add(name: str) -> None:
        if name in done or name not in files:
            return  # google/protobuf/*.proto dependencies are in the pool already
        module_name, data = files[name]
        for dependency in descriptor_pb2.FileDescriptorProto.FromString(data).dependency:
            add(dependency)
        try:
            file_descriptor = pool.FindFileByName(name)
        except KeyError:
            file_descriptor = pool.AddSerializedFile(data)
        module = types.ModuleType(module_name)
        module.__file__ = str(folder / f"{module_name.rsplit('.', 1)[1]}.py")
        namespace = module.__dict__
        namespace["DESCRIPTOR"] = file_descriptor
        builder.BuildMessageAndEnumDescriptors(file_descriptor, namespace)
        builder.BuildTopDescriptorsAndMessages(file_descriptor, module_name, namespace)
        sys.modules[module_name] = module
        setattr(package, module_name.rsplit(".", 1)[1], module)
        done.add(name)

    for name in files:
        add(name)


# --- 2. distutils -------------------------------------------------------------------------------


class StrictVersion:
    """The part of distutils' StrictVersion that mlagents-envs uses: `.version` as ints."""

    def __init__(self, text: str) -> None:
        match = re.fullmatch(r"(\d+)\.(\d+)(?:\.(\d+))?", text.strip())
        if match is None:
            raise ValueError(f"invalid version number {text!r}")
        self.version = tuple(int(part or 0) for part in match.groups())


def _install_distutils_shim(own: bool = False) -> None:
    """Provide `distutils.version.StrictVersion` where Python (3.12+) no longer has it, or, with
    `own`, wherever distutils is not imported yet."""
    if not own or "distutils" in sys.modules:
        try:
            from distutils.version import StrictVersion as _  # noqa: F401

            return
        except ImportError:
            pass
    distutils = sys.modules.get("distutils") or types.ModuleType("distutils")
    version = types.ModuleType("distutils.version")
    version.StrictVersion = StrictVersion  # type: ignore[attr-defined]
    distutils.version = version  # type: ignore[attr-defined]
    sys.modules["distutils"] = distutils
    sys.modules["distutils.version"] = version


# --- 3. speed -----------------------------------------------------------------------------------


class _QueueConnection:
    """One end of an in-process duplex channel with the `Connection` methods the servicer uses."""

    _CLOSED = object()

    def __init__(self, incoming: queue.SimpleQueue, outgoing: queue.SimpleQueue) -> None:
        self._incoming = incoming
        self._outgoing = outgoing
        self._peeked: list[Any] = []

    def send(self, obj: Any) -> None:
        self._outgoing.put(obj)

    def recv(self) -> Any:
        item = self._peeked.pop() if self._peeked else self._incoming.get()
        if item is self._CLOSED:
            self._peeked.append(item)
            raise EOFError("connection closed")
        return item

    def poll(self, timeout: float = 0.0) -> bool:
        if self._peeked:
            return True
        try:
            self._peeked.append(self._incoming.get(timeout=max(float(timeout), 0.0)))
        except queue.Empty:
            return False
        return True

    def close(self) -> None:
        self._outgoing.put(self._CLOSED)


def _fast_servicer_class() -> type:
    from mlagents_envs import rpc_communicator

    base = rpc_communicator.UnityToExternalServicerImplementation

    class QueueServicer(base):  # type: ignore[misc, valid-type]
        """Hands each request to the main thread and waits for its answer, without pickling."""

        def __init__(self) -> None:  # does not call the Pipe-creating base init
            to_parent: queue.SimpleQueue = queue.SimpleQueue()
            to_child: queue.SimpleQueue = queue.SimpleQueue()
            self.parent_conn = _QueueConnection(to_parent, to_child)
            self.child_conn = _QueueConnection(to_child, to_parent)

    return QueueServicer


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _packed_floats_header(field: int, count: int) -> bytes:
    return _varint(field << 3 | 2) + _varint(4 * count)


def encode_agent_actions(continuous: np.ndarray, deprecated: bool = True) -> bytes:
    """Wire bytes of a `ListAgentActionProto` holding one `AgentActionProto` per row.

    Each row goes into `continuous_actions` (and, as mlagents-envs does, `vector_actions_deprecated`
    when `deprecated`). Parsing the result gives exactly the message mlagents-envs builds.
    """
    rows = np.ascontiguousarray(continuous, dtype="<f4")
    n, width = rows.shape
    if n == 0:
        return b""
    template, float_columns = _action_table(n, width, deprecated)
    table = template.copy()
    row_bytes = rows.view(np.uint8).reshape(n, 4 * width)
    for start in float_columns:
        table[:, start : start + 4 * width] = row_bytes
    return table.tobytes()


@functools.lru_cache(maxsize=8)
def _action_table(n: int, width: int, deprecated: bool) -> tuple[np.ndarray, tuple[int, ...]]:
    """A (n, entry bytes) template whose constant columns (the tags and lengths of each entry)
    are written, and the first column of each copy of the floats. Read-only: callers copy it."""
    from mlagents_envs.communicator_objects.agent_action_pb2 import AgentActionProto

    fields = AgentActionProto.DESCRIPTOR.fields_by_name
    heads = [_packed_floats_header(fields[name].number, width) for name in (
        ["vector_actions_deprecated"] if deprecated else []) + ["continuous_actions"]] \
        if width else []
    body_len = sum(len(head) + 4 * width for head in heads)
    entry = bytearray(_varint(1 << 3 | 2) + _varint(body_len))  # ListAgentActionProto.value = 1
    float_columns = []
    for head in heads:
        entry += head
        float_columns.append(len(entry))
        entry += bytes(4 * width)
    template = np.frombuffer(bytes(entry), np.uint8)[None].repeat(n, 0)
    template.flags.writeable = False
    return template, tuple(float_columns)


_ORIGINALS: dict[str, Any] = {}
_FAST: dict[str, Any] = {}
_lean_enabled = True


def _install_close_guard() -> None:
    """`UnityEnvironment.__init__` registers its `_close` with atexit before it binds its port;
    when the port is taken it raises, and at exit `_close` fails on the missing communicator
    with a traceback. The guard closes only an environment that got that far."""
    from mlagents_envs.environment import UnityEnvironment

    close = UnityEnvironment._close

    def close_if_built(self: Any, timeout: int | None = None) -> None:
        if hasattr(self, "_communicator"):
            close(self, timeout)

    UnityEnvironment._close = close_if_built


def _install_fast_paths() -> None:
    from mlagents_envs import environment, rpc_communicator, rpc_utils

    environment.StrictVersion = StrictVersion  # same result, without distutils' deprecation
    _ORIGINALS.update(
        servicer=rpc_communicator.UnityToExternalServicerImplementation,
        steps_from_proto=rpc_utils.steps_from_proto,
        generate_step_input=environment.UnityEnvironment._generate_step_input,
    )
    _FAST.update(
        servicer=_fast_servicer_class(),
        steps_from_proto=_steps_from_proto,
        generate_step_input=_generate_step_input,
    )
    set_fast_paths(True)


def set_fast_paths(enabled: bool) -> None:
    """Switch the speed-ups of part 3 on (the default) or back to mlagents-envs' originals
    (`lean_step` then declines).

    For measuring them (bench/bench_envs.py) and checking they change nothing (tests); takes
    effect for environments created afterwards (the servicer is chosen at creation).
    """
    from mlagents_envs import environment, rpc_communicator, rpc_utils

    global _lean_enabled
    _lean_enabled = enabled
    chosen = _FAST if enabled else _ORIGINALS
    rpc_communicator.UnityToExternalServicerImplementation = chosen["servicer"]
    rpc_utils.steps_from_proto = chosen["steps_from_proto"]
    environment.steps_from_proto = chosen["steps_from_proto"]
    environment.UnityEnvironment._generate_step_input = chosen["generate_step_input"]


def original_steps_from_proto(agent_info_list: Any, behavior_spec: Any) -> Any:
    """mlagents-envs' own `rpc_utils.steps_from_proto`."""
    return _ORIGINALS["steps_from_proto"](agent_info_list, behavior_spec)


def _steps_from_proto(agent_info_list: Any, behavior_spec: Any) -> Any:
    """`rpc_utils.steps_from_proto` with a bulk path for one flat float observation."""
    specs = behavior_spec.observation_specs
    if (
        len(specs) != 1
        or len(specs[0].shape) != 1
        or behavior_spec.action_spec.discrete_size > 0
        or len(agent_info_list) == 0
    ):
        return original_steps_from_proto(agent_info_list, behavior_spec)
    return _fast_steps_from_proto(agent_info_list, behavior_spec, original_steps_from_proto)


def _generate_step_input(self: Any, vector_action: dict) -> Any:
    """`UnityEnvironment._generate_step_input` encoding continuous actions with numpy."""
    from mlagents_envs.communicator_objects.command_pb2 import STEP
    from mlagents_envs.communicator_objects.unity_rl_input_pb2 import UnityRLInputProto

    if any(a.discrete is not None and a.discrete.size for a in vector_action.values()):
        return _ORIGINALS["generate_step_input"](self, vector_action)
    rl_in = UnityRLInputProto()
    for name, action in vector_action.items():
        if len(self._env_state[name][0]) == 0:
            continue
        rl_in.agent_actions[name].MergeFromString(encode_agent_actions(action.continuous))
        rl_in.command = STEP
    rl_in.side_channel = bytes(self._side_channel_manager.generate_side_channel_messages())
    return self._wrap_unity_input(rl_in)


def _float_rows(agent_infos: list, width: int) -> np.ndarray | None:
    """(len(agent_infos), width) float32 of every agent's first observation, read as packed bytes;
    None when any agent's float data is not exactly `width` floats (as with compressed ones)."""
    try:
        joined = b"".join([info.observations[0].float_data.SerializeToString()
                           for info in agent_infos])
    except IndexError:  # an agent without observations
        return None
    head = bytes([0x0A]) + _varint(4 * width)  # FloatData.data = 1, packed
    row = len(head) + 4 * width
    if len(joined) != row * len(agent_infos):
        return None
    table = np.frombuffer(joined, dtype=np.uint8).reshape(len(agent_infos), row)
    if not (table[:, : len(head)] == np.frombuffer(head, np.uint8)).all():
        return None
    return table[:, len(head):].copy().view("<f4").astype(np.float32, copy=False)


_FLOAT32_MAX = float(np.finfo(np.float32).max)


def _mean_cannot_overflow(values: np.ndarray) -> bool:
    """True when every value is finite and no float32 sum of any of them, in any order, can
    reach inf: n * max |x| stays under half of float32's largest value (a margin for rounding).
    Then mlagents-envs' check passes on every subset of `values`."""
    return values.size == 0 or float(np.abs(values).max()) * values.size < _FLOAT32_MAX / 2


def raise_on_nan_and_inf(obs: np.ndarray, reward: np.ndarray, group_reward: np.ndarray,
                         done: np.ndarray) -> None:
    """mlagents-envs' NaN/inf errors for one behavior's agents (rows in Unity's order, `done`
    marking finished ones), as `rpc_utils.steps_from_proto` raises them: the same checks on
    the same arrays in its order (observations of deciding agents, then of finished ones, then
    rewards, then group rewards, each deciding first), so the same first field and message.

    Its check is `np.mean` in float32: NaN anywhere gives "NaN values" (so do +inf and -inf
    together), inf "Infinite values", and so do finite values whose float32 sum overflows
    (observations of 2e38). That last behaviour is kept on purpose: the fast paths promise the
    original's errors, and a policy has nothing useful to do with such observations anyway.
    A cheap exact test (`_mean_cannot_overflow`) skips the checks when none can fail.
    """
    fields = ((obs, "observations"), (reward, "rewards"), (group_reward, "group_rewards"))
    if all(_mean_cannot_overflow(values) for values, _ in fields):
        return
    from mlagents_envs.rpc_utils import _raise_on_nan_and_inf

    for values, source in fields:
        _raise_on_nan_and_inf(values[~done], source)
        _raise_on_nan_and_inf(values[done], source)


def _fast_steps_from_proto(agent_info_list: Any, behavior_spec: Any, fallback: Any) -> Any:
    """`steps_from_proto` for one (width,) float observation: one pass over the agents for the
    scalars, one bulk copy for the observations. Anything else goes to `fallback`."""
    from mlagents_envs.base_env import DecisionSteps, TerminalSteps

    infos = list(agent_info_list)
    (width,) = behavior_spec.observation_specs[0].shape
    obs = _float_rows(infos, width)
    if obs is None:
        return fallback(agent_info_list, behavior_spec)
    scalars = np.array([(i.reward, i.group_reward, i.id, i.group_id, i.done, i.max_step_reached)
                        for i in infos], dtype=np.float64).reshape(len(infos), 6)
    done = scalars[:, 4] != 0
    rewards, group_rewards = scalars[:, 0].astype(np.float32), scalars[:, 1].astype(np.float32)
    raise_on_nan_and_inf(obs, rewards, group_rewards, done)
    steps = []
    for mask in (~done, done):
        part = scalars[mask]
        steps.append((obs[mask], rewards[mask], group_rewards[mask], part[:, 2].astype(np.int32),
                      part[:, 3].astype(np.int64).tolist(), part[:, 5] != 0))
    (obs_d, rew_d, grew_d, ids_d, gid_d, _), (obs_t, rew_t, grew_t, ids_t, gid_t, cut) = steps
    return (
        DecisionSteps([obs_d], rew_d, ids_d, None, gid_d, grew_d),
        TerminalSteps([obs_t], rew_t, cut, ids_t, gid_t, grew_t),
    )


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


def agent_rows(decision: Any, terminal: Any) -> AgentRows:
    """`AgentRows` of mlagents-envs' DecisionSteps (first) and TerminalSteps."""
    mask = decision.action_mask
    return AgentRows(
        np.concatenate([decision.agent_id, terminal.agent_id]).astype(np.int64),
        np.concatenate([decision.reward, terminal.reward]).astype(np.float32),
        np.repeat([False, True], [len(decision), len(terminal)]),
        np.concatenate([np.zeros(len(decision), bool), terminal.interrupted]),
        [np.concatenate([d, t]).astype(np.float32)
         for d, t in zip(decision.obs, terminal.obs, strict=True)],
        None if mask is None else np.concatenate(mask, axis=1))


def lean_step(env: Any, behavior: str, continuous: np.ndarray) -> AgentRows | None:
    """`env.set_actions(behavior, ActionTuple(continuous))`, `env.step()` and `env.get_steps`,
    as one exchange that reads the agents straight into `AgentRows`: no ActionTuple, no copies
    of the input message, no DecisionSteps or TerminalSteps. Side channels and behavior specs
    are processed as `UnityEnvironment.step` does; observations, rewards and group rewards are
    checked for NaN and inf exactly as mlagents-envs checks them (`raise_on_nan_and_inf`).

    For a loaded `env` whose only behavior is `behavior`, with one vector observation and
    continuous actions (checked by the caller): returns None, sending nothing, for any other
    env or when the fast paths are off (the caller then uses mlagents-envs' own calls). While
    it is used, `env.get_steps` is not kept up to date (a reset refreshes it).
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
    """`AgentRows` of one behavior's agent infos (one vector observation), in Unity's order,
    with the NaN/inf errors of `steps_from_proto` (`raise_on_nan_and_inf`)."""
    (width,) = spec.observation_specs[0].shape
    obs = _float_rows(infos, width) if len(infos) else np.zeros((0, width), np.float32)
    if obs is None:
        return agent_rows(*original_steps_from_proto(infos, spec))
    scalars = np.array([(i.reward, i.group_reward, i.id, i.done, i.max_step_reached)
                        for i in infos], dtype=np.float64).reshape(len(infos), 5)
    reward = scalars[:, 0].astype(np.float32)
    done = scalars[:, 3] != 0
    raise_on_nan_and_inf(obs, reward, scalars[:, 1].astype(np.float32), done)
    return AgentRows(scalars[:, 2].astype(np.int64), reward, done, done & (scalars[:, 4] != 0),
                     [obs])
