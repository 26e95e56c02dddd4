"""One Unity instance as agent slots: `UnityInstance` drives one Unity process (a build or the
stand-in) through mlagents-envs and keeps its agents in stable slots.

It is the part of `UnityVectorEnv` that runs beside each Unity process: in the caller's process
for one instance, in an instance worker (`envs.workers`) for several. It imports numpy and
mlagents-envs only (no Gymnasium, no torch), and writes each step into caller-owned arrays
(`StepBuffers`), which the workers place in shared memory.

Any behavior: its observations (vectors, images, variable-length buffers), continuous and
discrete actions and action masks are laid out per slot by a `SlotLayout`. A behavior of one
vector observation and continuous actions (Huggy's) takes `fast_step.lean_step`, one exchange
straight into arrays; others go through mlagents-envs' own calls.

Slots: slot s is the agent at row s of the first decision after a reset. Unity gives an agent a
new id every episode; an agent that finishes frees its slot, and its successor (a new id in the
same message) takes the lowest free slot. Terminal steps map to `terminated`, interrupted ones
(ML-Agents' max step) to `truncated`.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from envs import fast_step
from envs.behaviors import resolve_key
from envs.rollout import step_seed
from envs.standin.poses import POSE_SIZE, RENDER_PARAMETER

MAX_SEED = 2**24  # seeds travel as float32 on the EnvironmentParameters channel
MAX_QUIET_EXCHANGES = 1000
"""Exchanges in a row in which agents only finish (nobody decides) before a step gives up."""
INSTANCE_SEED_STRIDE = 10_368_889
"""Odd, about 2**24 / golden ratio: `instance_seed` spreads the instances' seeds far apart."""


class EnvironmentStartError(RuntimeError):
    """The Unity executable could not be started, or it never connected."""


def instance_seed(seed: int, instance: int) -> int:
    """The seed of one instance when an environment of several instances is seeded.

    Instance 0 keeps a valid seed as is; the stride is odd, so the instances of one reset get
    distinct seeds (up to 2**24 instances).

    Args:
        seed: the environment's seed.
        instance: the instance's index.

    Returns:
        `(seed + instance * 10_368_889) mod 2**24`.
    """
    return (int(seed) + int(instance) * INSTANCE_SEED_STRIDE) % MAX_SEED


def check_seed(seed: int) -> int:
    """A seed checked to travel exactly as float32.

    Args:
        seed: an integer.

    Returns:
        `seed` as an int.

    Raises:
        ValueError: `seed` is outside [0, MAX_SEED).
    """
    if not 0 <= int(seed) < MAX_SEED:
        raise ValueError(f"seed must be in [0, {MAX_SEED}), got {seed}")
    return int(seed)


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("localhost", port))
        except OSError:
            return False
    return True


@dataclass(frozen=True)
class InstanceConfig:
    """How to start one Unity instance (plain data: it travels to instance workers)."""

    file_name: str
    """The executable (a Unity build, or the stand-in's launcher)."""
    worker_ids: tuple[int, ...]
    """Worker ids to try, in order: a busy port (`base_port + worker_id`) moves on to the next."""
    base_port: int
    seed: int
    """Seed sent in the handshake."""
    no_graphics: bool = True
    timeout_wait: int = 60
    time_scale: float = 20.0
    parameters: tuple[tuple[str, float], ...] = ()
    """EnvironmentParameters side-channel values, sent before the first reset."""
    log_folder: str | None = None
    behavior_name: str | None = None
    num_agents: int | None = None
    """The number of agents the scene must have after the first reset (None: any)."""
    layout: SlotLayout | None = None
    """The layout the behavior must have (None: any)."""
    additional_args: tuple[str, ...] = ()
    """More command-line arguments for the executable (the stand-in's `--behavior-spec`)."""
    cpu_core: int | None = None
    """The CPU core an instance worker and its Unity process are pinned to (None: not pinned)."""
    render: bool = False
    """Ask the stand-in for its agents' poses (the render side channel, `envs.standin.poses`),
    kept in `StepBuffers.pose`; a Unity build sends none."""
    opponents: tuple[tuple[str, str], ...] = ()
    """(key, policy source) of the behaviors played in the instance's own process: a key names
    one or more behaviors (`envs.teams.resolve_key`), a source what `envs.agents` loads."""
    opponents_deterministic: bool = False
    """Whether the opponents play their most likely actions instead of sampling."""

    @property
    def pose_size(self) -> int:
        """Columns of `StepBuffers.pose`: the stand-in's pose width when rendering, else 0."""
        return POSE_SIZE if self.render else 0


@dataclass(frozen=True)
class SlotLayout:
    """What one slot holds: the shape of each observation (a vector (size,), an image
    (C, H, W), a variable-length buffer (entities, size)), the continuous action size and the
    discrete branch sizes. Plain data: it travels to instance workers."""

    observations: tuple[tuple[int, ...], ...]
    continuous_size: int = 0
    discrete_branches: tuple[int, ...] = ()

    @classmethod
    def of(cls, behavior_spec: Any) -> SlotLayout:
        """The layout of an mlagents-envs behavior.

        Args:
            behavior_spec: its `BehaviorSpec`.

        Returns:
            The layout.
        """
        action = behavior_spec.action_spec
        return cls(tuple(tuple(int(d) for d in o.shape) for o in behavior_spec.observation_specs),
                   int(action.continuous_size), tuple(int(b) for b in action.discrete_branches))

    @classmethod
    def of_policy(cls, spec: Any) -> SlotLayout:
        """The layout a policy acts in.

        Args:
            spec: its interface (`huggy_agent_client.spec.ActorSpec`).

        Returns:
            The layout.
        """
        return cls(tuple(tuple(int(d) for d in i.shape) for i in spec.inputs),
                   int(spec.continuous_size), tuple(int(b) for b in spec.discrete_branches))

    def check_fits(self, spec: Any, source: str, behavior: str) -> None:
        """Check that a policy acts in this layout, the layout of `behavior`.

        Args:
            spec: the policy's interface (`huggy_agent_client.spec.ActorSpec`).
            source: where the policy came from, named in the error.
            behavior: the behavior, named in the error.

        Raises:
            ValueError: the policy's layout differs, naming both.
        """
        theirs = SlotLayout.of_policy(spec)
        if theirs != self:
            raise ValueError(f"{source} ({theirs.describe()}) does not fit {behavior} "
                             f"({self.describe()})")

    @property
    def mask_size(self) -> int:
        """Columns of a slot's action mask: one per action of every branch."""
        return sum(self.discrete_branches)

    @property
    def lean(self) -> bool:
        """One vector observation and continuous actions only: the fast exchange applies."""
        return (len(self.observations) == 1 and len(self.observations[0]) == 1
                and not self.discrete_branches)

    def split_actions(self, actions: Any) -> tuple[Any, Any]:
        """The two kinds of a step's actions, in this layout's form (unchecked).

        Args:
            actions: a hybrid behavior's pair (continuous, discrete), else one array of the kind it has.

        Returns:
            (continuous, discrete), None for a kind the layout does not have.

        Raises:
            ValueError: a hybrid behavior's actions that are not a pair.
        """
        if self.continuous_size and self.discrete_branches:
            if not isinstance(actions, tuple) or len(actions) != 2:
                raise ValueError("expected (continuous, discrete) actions for this hybrid "
                                 f"behavior, got {type(actions).__name__}")
            return actions[0], actions[1]
        return (actions, None) if self.continuous_size else (None, actions)

    def describe(self) -> str:
        """The layout in words.

        Returns:
            Such as `(59,) -> 21 continuous` or `(3, 84, 84), (8,) -> discrete (3, 2)`.
        """
        actions = [f"{self.continuous_size} continuous"] if self.continuous_size else []
        if self.discrete_branches:
            actions.append(f"discrete {self.discrete_branches}")
        return (", ".join(str(shape) for shape in self.observations) + " -> "
                + " + ".join(actions))


@dataclass
class StepBuffers:
    """The arrays a step reads and fills, one row per slot. The caller writes `actions` and
    `discrete`; a reset fills `obs`, `mask` and `agent_id`; a step fills everything else.
    `obs[k]` is observation k of every slot; `mask` is True where an action is allowed (one
    column per action of every branch); `final_obs` and `final_agent_id` are meaningful only
    where `terminated | truncated`. With rendering, `pose` holds each slot's pose after the step
    and `final_pose` the last pose of a slot whose episode ended (`envs.standin.poses`); they
    have no columns otherwise."""

    obs: tuple[np.ndarray, ...]  # each (n, *shape) float32
    final_obs: tuple[np.ndarray, ...]
    actions: np.ndarray  # (n, continuous) float32
    discrete: np.ndarray  # (n, branches) int32
    mask: np.ndarray  # (n, sum of branches) bool, True = allowed
    reward: np.ndarray  # (n,) float32
    agent_id: np.ndarray  # (n,) int64
    final_agent_id: np.ndarray  # (n,) int64
    terminated: np.ndarray  # (n,) bool
    truncated: np.ndarray  # (n,) bool
    pose: np.ndarray  # (n, pose size) float32
    final_pose: np.ndarray  # (n, pose size) float32

    @staticmethod
    def _fields(n: int, layout: SlotLayout, pose_size: int
                ) -> list[tuple[str, tuple[int, ...], Any]]:
        observations = [(f"obs.{k}", (n, *shape), np.float32)
                        for k, shape in enumerate(layout.observations)]
        finals = [(f"final_obs.{k}", (n, *shape), np.float32)
                  for k, shape in enumerate(layout.observations)]
        return [*observations, *finals,
                ("actions", (n, layout.continuous_size), np.float32),
                ("discrete", (n, len(layout.discrete_branches)), np.int32),
                ("mask", (n, layout.mask_size), np.bool_), ("reward", (n,), np.float32),
                ("agent_id", (n,), np.int64), ("final_agent_id", (n,), np.int64),
                ("terminated", (n,), np.bool_), ("truncated", (n,), np.bool_),
                ("pose", (n, pose_size), np.float32), ("final_pose", (n, pose_size), np.float32)]

    @classmethod
    def nbytes(cls, n: int, layout: SlotLayout, pose_size: int = 0) -> int:
        """Bytes `over` needs for `n` slots (each array starts on a 64-byte boundary).

        Args:
            n: the slots.
            layout: what one slot holds.
            pose_size: columns of the pose arrays (0 without rendering).

        Returns:
            The size in bytes.
        """
        total = 0
        for _, shape, dtype in cls._fields(n, layout, pose_size):
            total += -(-int(np.prod(shape)) * np.dtype(dtype).itemsize // 64) * 64
        return total

    @classmethod
    def over(cls, n: int, layout: SlotLayout, buffer: Any = None,
             pose_size: int = 0) -> StepBuffers:
        """Buffers for `n` slots, their masks all True.

        Args:
            n: the slots.
            layout: what one slot holds.
            buffer: a writable buffer of at least `nbytes` bytes (such as a shared mmap) to lay them
                out in; None for fresh memory.
            pose_size: columns of the pose arrays (0 without rendering).

        Returns:
            The buffers, views of `buffer`.
        """
        if buffer is None:
            buffer = bytearray(cls.nbytes(n, layout, pose_size))
        arrays, offset = {}, 0
        for name, shape, dtype in cls._fields(n, layout, pose_size):
            count = int(np.prod(shape))
            arrays[name] = np.frombuffer(buffer, dtype, count, offset).reshape(shape)
            offset += -(-count * np.dtype(dtype).itemsize // 64) * 64
        count = len(layout.observations)
        buffers = cls(obs=tuple(arrays.pop(f"obs.{k}") for k in range(count)),
                      final_obs=tuple(arrays.pop(f"final_obs.{k}") for k in range(count)),
                      **arrays)
        buffers.mask[:] = True
        return buffers

    def rows(self, start: int, stop: int) -> StepBuffers:
        """Views of some slots.

        Args:
            start: the first slot.
            stop: the slot after the last.

        Returns:
            Buffers of slots [start, stop), sharing memory with these.
        """
        return StepBuffers(
            tuple(o[start:stop] for o in self.obs), tuple(o[start:stop] for o in self.final_obs),
            *(getattr(self, name)[start:stop] for name in (
                "actions", "discrete", "mask", "reward", "agent_id", "final_agent_id",
                "terminated", "truncated", "pose", "final_pose")))


@dataclass(frozen=True)
class InstanceInfo:
    """What a started instance reports: its scene and where it runs."""

    num_agents: int
    layout: SlotLayout
    behavior_name: str
    worker_id: int
    port: int
    process_id: int | None
    """The Unity process (None when connected to an editor)."""
    sends_poses: bool = False
    """It answered the render side channel (the stand-in playing Huggy, when rendering)."""


def open_unity(config: InstanceConfig, side_channels: Sequence[Any]) -> tuple[Any, int, int]:
    """Start a `UnityEnvironment` on the first free port of `config.worker_ids`.

    A port another process takes between the check and the bind moves on to the next worker id
    (programs on one machine race for free ports).

    Args:
        config: how to start the instance.
        side_channels: mlagents-envs side channels to register.

    Returns:
        (the environment, its worker id, its port).

    Raises:
        RuntimeError: every port is in use.
        EnvironmentStartError: the executable cannot be started or never connects.
    """
    from mlagents_envs.environment import UnityEnvironment
    from mlagents_envs.exception import (
        UnityEnvironmentException,
        UnityTimeOutException,
        UnityWorkerInUseException,
    )

    tried: list[int] = []
    for worker_id in config.worker_ids:
        port = config.base_port + worker_id
        if _port_is_free(port):
            try:
                unity = UnityEnvironment(
                    file_name=config.file_name, worker_id=worker_id, base_port=config.base_port,
                    seed=config.seed, no_graphics=config.no_graphics,
                    timeout_wait=config.timeout_wait, log_folder=config.log_folder,
                    side_channels=list(side_channels),
                    additional_args=list(config.additional_args))
                return unity, worker_id, port
            except UnityWorkerInUseException:
                pass
            except UnityTimeOutException as error:
                raise EnvironmentStartError(
                    f"{config.file_name} did not connect on port {port} within "
                    f"{config.timeout_wait} s (is it an ML-Agents build started with "
                    "--mlagents-port?)") from error
            except UnityEnvironmentException as error:
                raise EnvironmentStartError(
                    f"{config.file_name} could not be started: {error}") from error
        tried.append(port)
    raise RuntimeError(_ports_in_use(tried, config.worker_ids))


class UnityInstance:
    """One Unity process and its agents as `num_agents` stable slots: slot s is the agent at row s of
    the first decision after a reset, and a successor takes the lowest slot that an agent freed.

    Starts the executable on the first free port of `config.worker_ids`, resets it once, checks the
    behavior's layout against `config.layout` and its agents against `config.num_agents` where
    given; `step` checks that every agent decides at every step. `reset` and `step` write into
    `StepBuffers` of `num_agents` rows. The caller checks that `config.file_name` exists.

    Args:
        config: how to start the instance.

    Raises:
        RuntimeError: every port tried is in use.
        EnvironmentStartError: the executable cannot be started or never connects.
        ValueError: the behavior is not found (or several and none named), its layout or agent
            count differs from `config`'s, or an opponent names the driven behavior or does not fit
            its own.
    """

    def __init__(self, config: InstanceConfig) -> None:
        from mlagents_envs.side_channel.engine_configuration_channel import (
            EngineConfigurationChannel,
        )
        from mlagents_envs.side_channel.environment_parameters_channel import (
            EnvironmentParametersChannel,
        )

        self.config = config
        self._engine = EngineConfigurationChannel()
        self._engine.set_configuration_parameters(time_scale=config.time_scale)
        self._parameters = EnvironmentParametersChannel()
        for key, value in config.parameters:
            self._parameters.set_float_parameter(key, float(value))
        self._pose_channel: Any = None
        if config.render:
            from envs.render_channel import PoseChannel

            self._pose_channel = PoseChannel()
            self._parameters.set_float_parameter(RENDER_PARAMETER, 1.0)
        channels = [self._engine, self._parameters,
                    *([self._pose_channel] if self._pose_channel else [])]
        self._unity, self.worker_id, self.port = open_unity(config, channels)
        try:
            self._unity.reset()
            self.behavior_name = self._choose_behavior(config.behavior_name)
            self._opponents = self._load_opponents(config)
            spec = self._unity.behavior_specs[self.behavior_name]
            self.layout = SlotLayout.of(spec)
            if config.layout is not None and self.layout != config.layout:
                raise ValueError(f"behavior {self.behavior_name!r} has {self.layout.describe()}, "
                                 f"expected {config.layout.describe()}")
            decision, _ = self._unity.get_steps(self.behavior_name)
            self.sends_poses = (self._pose_channel is not None
                                and self._pose_channel.take() is not None)
            if config.num_agents is not None and len(decision) != config.num_agents:
                raise ValueError(
                    f"asked for {config.num_agents} agents, the environment has {len(decision)}"
                )
        except BaseException:
            self._unity.close()
            raise
        self.num_agents = len(decision)

    # -- start-up -------------------------------------------------------------------------------

    def _load_opponents(self, config: InstanceConfig) -> dict[str, Any]:
        """The agent of each behavior that `config.opponents` names (never the driven one)."""
        if not config.opponents:
            return {}
        # start-up time: an instance worker imports torch only where it plays opponents
        from envs.agents import agent_from_source

        behaviors = list(self._unity.behavior_specs)
        found: dict[str, Any] = {}
        for key, source in config.opponents:
            named = resolve_key(key, behaviors)
            if self.behavior_name in named:
                raise ValueError(f"opponent key {key!r} names the driven behavior "
                                 f"{self.behavior_name!r}; opponents play the others: "
                                 f"{[b for b in behaviors if b != self.behavior_name]}")
            agent = agent_from_source(source)
            for behavior in named:
                SlotLayout.of(self._unity.behavior_specs[behavior]).check_fits(
                    agent.spec, source, behavior)
                found[behavior] = agent
        return found

    def _choose_behavior(self, wanted: str | None) -> str:
        names = list(self._unity.behavior_specs)
        if wanted is not None:
            if wanted not in names:
                raise ValueError(f"behavior {wanted!r} not found; the build has {names}")
            return wanted
        if len(names) != 1:
            raise ValueError(f"the build has behaviors {names}; pass behavior_name=")
        return names[0]

    def info(self) -> InstanceInfo:
        """What the started instance reports.

        Returns:
            The scene's sizes, the behavior, the worker id, port and Unity process id, and whether the
                stand-in sends poses.
        """
        process = getattr(self._unity, "_process", None)
        return InstanceInfo(self.num_agents, self.layout, self.behavior_name, self.worker_id,
                            self.port, None if process is None else process.pid,
                            self.sends_poses)

    # -- episodes -------------------------------------------------------------------------------

    def reset(self, seed: int | None, out: StepBuffers) -> None:
        """Reset every agent and write the first observations and agent ids into `out`.

        Args:
            seed: reseeds the environment first, in [0, MAX_SEED); None keeps its seed.
            out: the buffers of `num_agents` rows.

        Raises:
            ValueError: `seed` is out of range.
            RuntimeError: another number of agents than at start decides after the reset.
        """
        if seed is not None:
            self._parameters.set_float_parameter("seed", float(check_seed(seed)))
        self._unity.reset()
        self._opponent_seed = self.config.seed if seed is None else seed
        self._decisions = 0
        decision, _ = self._unity.get_steps(self.behavior_name)
        self._adopt(decision, out)
        if self._pose_channel is not None:
            self._write_poses(out)

    def _adopt(self, decision: Any, out: StepBuffers) -> None:
        """Start a fresh slot table from a reset's decision steps (slot = row)."""
        n = self.num_agents
        if len(decision) != n:
            raise RuntimeError(f"expected {n} agents after reset, Unity reported {len(decision)}")
        self._slot_ids = np.asarray(decision.agent_id, dtype=np.int64).copy()
        self._decision_ids = self._slot_ids.copy()  # agent id of each decision row
        self._decision_slots: np.ndarray | None = None  # slot of each row; None: row = slot
        for target, values in zip(out.obs, decision.obs, strict=True):
            target[:] = values
        _write_mask(out.mask, decision.action_mask, None)
        out.agent_id[:] = self._slot_ids
        out.reward[:] = 0.0
        out.terminated[:] = False
        out.truncated[:] = False

    def step(self, out: StepBuffers) -> None:
        """Send `out.actions` (one row per slot) and fill `out` with the step's results.

        The next observation of each slot is its successor's first one where an episode ended, with the
        finished agent's last observation and id in `final_obs`/`final_agent_id`; then the reward,
        terminated (ended before its max step) and truncated (interrupted at it); with rendering, the
        poses.

        Args:
            out: the buffers of `num_agents` rows.

        Raises:
            RuntimeError: not every agent decides at the step (a DecisionRequester with period 1 is
                needed), more agents appear than there are slots, or agents only finish for
                `MAX_QUIET_EXCHANGES` exchanges in a row.
        """
        self._step(out)
        if self._pose_channel is not None:
            self._write_poses(out)

    def _write_poses(self, out: StepBuffers) -> None:
        """Each slot's pose from the render side channel's latest record, and the last pose of
        each slot whose episode just ended (found by the finished agent's id)."""
        message = self._pose_channel.take()
        if message is None:
            return
        slots = _rows_in(self._slot_ids, message.ids)
        known = slots >= 0
        out.pose[slots[known]] = message.poses[known]
        if len(message.final_ids):
            ended = np.flatnonzero(out.terminated | out.truncated)
            rows = _rows_in(message.final_ids, out.final_agent_id[ended])
            found = rows >= 0
            out.final_pose[ended[found]] = message.final_poses[rows[found]]

    def _step(self, out: StepBuffers) -> None:
        order = self._decision_slots
        rows = self._exchange(out.actions if order is None else out.actions[order],
                              out.discrete if order is None else out.discrete[order])
        n = self.num_agents
        slot_ids = self._slot_ids
        ids, done = rows.agent_id, rows.done
        ended = done.any()
        if not ended and np.array_equal(ids, self._decision_ids):
            # The usual step: the same agents deciding in the same order, nobody finished.
            slots = self._decision_slots
            if slots is None:
                out.reward[:] = rows.total_reward()
                for target, values in zip(out.obs, rows.obs, strict=True):
                    target[:] = values
            else:
                out.reward[slots] = rows.total_reward()
                for target, values in zip(out.obs, rows.obs, strict=True):
                    target[slots] = values
            _write_mask(out.mask, rows.mask, slots)
            out.terminated[:] = False
            out.truncated[:] = False
            return
        out.reward[:] = 0.0
        out.terminated[:] = False
        out.truncated[:] = False
        if ended:
            deciding = ~done
            finished = _rows_in(slot_ids, ids[done])  # slot of each terminal row, or -1
            known = finished >= 0  # skips agents never seen deciding (none with a period-1 requester)
            slots = finished[known]
            interrupted = rows.interrupted[done][known]
            out.reward[slots] = rows.total_reward()[done][known]
            out.truncated[slots] = interrupted
            out.terminated[slots] = ~interrupted
            for target, values in zip(out.final_obs, rows.obs, strict=True):
                target[slots] = values[done][known]
            out.final_agent_id[slots] = slot_ids[slots]
            slot_ids[slots] = -1  # freed for the successors
            ids, reward = ids[deciding], rows.total_reward()[deciding]
            obs = [values[deciding] for values in rows.obs]
        else:
            reward, obs = rows.total_reward(), rows.obs
        if len(ids) != n:
            raise RuntimeError(
                f"{len(ids)} of {n} agents requested a decision; the vector env needs every "
                "agent to decide at every step (a DecisionRequester with period 1, as Huggy's)"
            )
        slots = _rows_in(slot_ids, ids)
        fresh = slots < 0
        if fresh.any():  # successors take the freed slots, lowest first
            free = np.flatnonzero(slot_ids < 0)
            if int(fresh.sum()) > len(free):
                raise RuntimeError(
                    f"agent {int(ids[fresh][len(free)])} appeared but all {n} slots are taken")
            slots[fresh] = free[: int(fresh.sum())]
            slot_ids[slots[fresh]] = ids[fresh]
        known = ~fresh
        out.reward[slots[known]] = reward[known]
        for target, values in zip(out.obs, obs, strict=True):
            target[slots] = values
        _write_mask(out.mask, rows.mask, slots)
        out.agent_id[:] = slot_ids
        self._decision_ids = ids
        self._decision_slots = None if np.array_equal(slots, np.arange(n)) else slots

    def _exchange(self, continuous: np.ndarray, discrete: np.ndarray) -> Any:
        """One step of the Unity process with the actions (one row per deciding agent, in
        Unity's order), the opponents' too: `fast_step.lean_step` where it applies, else
        mlagents-envs' own calls. An exchange in which agents finish between decision steps
        (nobody decides) is followed by the next one, and their rows are joined: the finished
        agents, then the next decisions."""
        self._decisions += 1
        rows = (fast_step.lean_step(self._unity, self.behavior_name, continuous)
                if self.layout.lean else None)
        if rows is None:
            rows = self._unity_step(continuous, discrete)
        for _ in range(MAX_QUIET_EXCHANGES):
            if not len(rows.done) or not rows.done.all():
                return rows
            rows = fast_step.join_rows(rows, self._unity_step(continuous[:0], discrete[:0]))
        raise RuntimeError(f"agents finished in {MAX_QUIET_EXCHANGES} exchanges in a row "
                           "without any deciding")

    def _unity_step(self, continuous: np.ndarray, discrete: np.ndarray) -> Any:
        """mlagents-envs' set_actions (the driven behavior's and the opponents'), step and
        get_steps, as `AgentRows` of the driven behavior."""
        from mlagents_envs.base_env import ActionTuple

        layout = self.layout
        self._unity.set_actions(self.behavior_name, ActionTuple(
            continuous=continuous if layout.continuous_size else None,
            discrete=discrete if layout.discrete_branches else None))
        for index, (behavior, agent) in enumerate(self._opponents.items()):
            decision, _ = self._unity.get_steps(behavior)
            if not len(decision):
                continue
            obs = decision.obs[0] if len(decision.obs) == 1 else list(decision.obs)
            mask = (None if decision.action_mask is None
                    else ~np.concatenate(decision.action_mask, axis=1))
            seed = step_seed(len(self._opponents) * self._opponent_seed + index, self._decisions)
            action = agent.compute_action(obs, deterministic=self.config.opponents_deterministic,
                                          seed=seed, action_mask=mask)
            spec = self._unity.behavior_specs[behavior].action_spec
            self._unity.set_actions(behavior, ActionTuple(
                continuous=action.continuous if spec.continuous_size and spec.discrete_size
                else action if spec.continuous_size else None,
                discrete=action.discrete if spec.continuous_size and spec.discrete_size
                else action if spec.discrete_size else None))
        self._unity.step()
        return fast_step.agent_rows(*self._unity.get_steps(self.behavior_name))

    def close(self) -> None:
        """Close the connection and the Unity process (idempotent)."""
        if self._unity is not None:
            self._unity.close()


def _write_mask(out: np.ndarray, masked: Any, slots: np.ndarray | None) -> None:
    """Write the deciding agents' action masks into `out` (True = allowed), rows in `slots`
    order (None: row = slot). `masked` is mlagents-envs' (True = not allowed): a list of one
    (rows, branch size) array per branch, an already joined (rows, actions) array, or None (no
    masks: everything allowed)."""
    if not out.shape[1]:
        return
    if masked is None:
        out[:] = True
        return
    joined = np.concatenate(masked, axis=1) if isinstance(masked, list) else masked
    if slots is None:
        out[:] = ~joined
    else:
        out[slots] = ~joined


def _rows_in(slot_ids: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """For each id in `ids`, the slot that holds it in `slot_ids`, or -1 (int64 array)."""
    order = np.argsort(slot_ids, kind="stable")
    held = slot_ids[order]
    ids = np.asarray(ids, dtype=np.int64)
    where = np.minimum(np.searchsorted(held, ids), len(held) - 1)
    return np.where(held[where] == ids, order[where], -1)


def _ports_in_use(tried: Sequence[int], worker_ids: Sequence[int]) -> str:
    step = worker_ids[1] - worker_ids[0] if len(worker_ids) > 1 else 1
    every = "" if step == 1 else f", every {step}th"
    return (f"ports {tried[0]}-{tried[-1]}{every} are all in use (worker_id {worker_ids[0]} to "
            f"{worker_ids[-1]}{every}); pass another worker_id or base_port")
