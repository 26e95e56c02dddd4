"""One Unity instance as agent slots: `UnityInstance` drives one Unity process (a build or the
stand-in) through mlagents-envs and keeps its agents in stable slots.

It is the part of `HuggyVectorEnv` that runs beside each Unity process: in the caller's process
for one instance, in an instance worker (`envs.workers`) for several. It imports numpy and
mlagents-envs only (no Gymnasium, no torch), and writes each step into caller-owned arrays
(`StepBuffers`), which the workers place in shared memory.

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

MAX_SEED = 2**24  # seeds travel as float32 on the EnvironmentParameters channel
INSTANCE_SEED_STRIDE = 10_368_889
"""Odd, about 2**24 / golden ratio: `instance_seed` spreads the instances' seeds far apart."""


class EnvironmentStartError(RuntimeError):
    """The Unity executable could not be started, or it never connected."""


def instance_seed(seed: int, instance: int) -> int:
    """The seed of instance `instance` when an environment of several instances is seeded with
    `seed`: `(seed + instance * 10_368_889) mod 2**24`. Instance 0 keeps a valid seed as is; the
    stride is odd, so the instances of one reset get distinct seeds (up to 2**24 instances)."""
    return (int(seed) + int(instance) * INSTANCE_SEED_STRIDE) % MAX_SEED


def check_seed(seed: int) -> int:
    """`seed` as an int, or ValueError when it is outside [0, MAX_SEED)."""
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


@dataclass
class StepBuffers:
    """The arrays a step reads and fills, one row per slot. The caller writes `actions`; a reset
    fills `obs` and `agent_id`; a step fills everything else. `final_obs` and `final_agent_id`
    are meaningful only where `terminated | truncated`."""

    obs: np.ndarray  # (n, obs_size) float32
    final_obs: np.ndarray  # (n, obs_size) float32
    actions: np.ndarray  # (n, act_size) float32
    reward: np.ndarray  # (n,) float32
    agent_id: np.ndarray  # (n,) int64
    final_agent_id: np.ndarray  # (n,) int64
    terminated: np.ndarray  # (n,) bool
    truncated: np.ndarray  # (n,) bool

    @staticmethod
    def _fields(n: int, obs_size: int, act_size: int) -> list[tuple[str, tuple[int, ...], Any]]:
        return [("obs", (n, obs_size), np.float32), ("final_obs", (n, obs_size), np.float32),
                ("actions", (n, act_size), np.float32), ("reward", (n,), np.float32),
                ("agent_id", (n,), np.int64), ("final_agent_id", (n,), np.int64),
                ("terminated", (n,), np.bool_), ("truncated", (n,), np.bool_)]

    @classmethod
    def nbytes(cls, n: int, obs_size: int, act_size: int) -> int:
        """Bytes `over` needs for `n` slots (each array starts on a 64-byte boundary)."""
        total = 0
        for _, shape, dtype in cls._fields(n, obs_size, act_size):
            total += -(-int(np.prod(shape)) * np.dtype(dtype).itemsize // 64) * 64
        return total

    @classmethod
    def over(cls, n: int, obs_size: int, act_size: int, buffer: Any = None) -> StepBuffers:
        """Buffers for `n` slots laid out in `buffer` (a writable buffer of at least `nbytes`
        bytes, such as a shared mmap), or in fresh memory when None."""
        if buffer is None:
            buffer = bytearray(cls.nbytes(n, obs_size, act_size))
        arrays, offset = {}, 0
        for name, shape, dtype in cls._fields(n, obs_size, act_size):
            count = int(np.prod(shape))
            arrays[name] = np.frombuffer(buffer, dtype, count, offset).reshape(shape)
            offset += -(-count * np.dtype(dtype).itemsize // 64) * 64
        return cls(**arrays)

    def rows(self, start: int, stop: int) -> StepBuffers:
        """Views of slots [start, stop)."""
        return StepBuffers(*(getattr(self, name)[start:stop] for name in (
            "obs", "final_obs", "actions", "reward", "agent_id", "final_agent_id", "terminated",
            "truncated")))


@dataclass(frozen=True)
class InstanceInfo:
    """What a started instance reports: its scene and where it runs."""

    num_agents: int
    obs_size: int
    act_size: int
    behavior_name: str
    worker_id: int
    port: int
    process_id: int | None
    """The Unity process (None when connected to an editor)."""


class UnityInstance:
    """One Unity process and its agents as `num_agents` stable slots (see the module docstring).

    Starts the executable on the first free port of `config.worker_ids`, resets it once, checks
    that the behavior has one vector observation and continuous actions only; `step` checks that
    every agent decides at every step. `reset` and `step` write into `StepBuffers` of
    `num_agents` rows. The caller checks that `config.file_name` exists.
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
        self._unity: Any = None
        tried: list[int] = []
        for candidate in config.worker_ids:
            port = config.base_port + candidate
            if not _port_is_free(port):
                tried.append(port)
                continue
            self.worker_id, self.port = candidate, port
            self._unity = self._start(candidate)
            break
        if self._unity is None:
            raise RuntimeError(_ports_in_use(tried, config.worker_ids))
        try:
            self._unity.reset()
            self.behavior_name = self._choose_behavior(config.behavior_name)
            spec = self._unity.behavior_specs[self.behavior_name]
            if len(spec.observation_specs) != 1 or len(spec.observation_specs[0].shape) != 1:
                raise ValueError(
                    f"behavior {self.behavior_name!r} must have one vector observation, got "
                    f"shapes {[o.shape for o in spec.observation_specs]}"
                )
            if spec.action_spec.discrete_size or not spec.action_spec.continuous_size:
                raise ValueError(
                    f"behavior {self.behavior_name!r} must have continuous actions only, got "
                    f"{spec.action_spec}"
                )
            decision, _ = self._unity.get_steps(self.behavior_name)
            if config.num_agents is not None and len(decision) != config.num_agents:
                raise ValueError(
                    f"asked for {config.num_agents} agents, the environment has {len(decision)}"
                )
        except BaseException:
            self._unity.close()
            raise
        (self.obs_size,) = spec.observation_specs[0].shape
        self.act_size = spec.action_spec.continuous_size
        self.num_agents = len(decision)

    # -- start-up -------------------------------------------------------------------------------

    def _start(self, worker_id: int) -> Any:
        from mlagents_envs.environment import UnityEnvironment
        from mlagents_envs.exception import (
            UnityEnvironmentException,
            UnityTimeOutException,
            UnityWorkerInUseException,
        )

        config = self.config
        try:
            return UnityEnvironment(
                file_name=config.file_name, worker_id=worker_id, base_port=config.base_port,
                seed=config.seed, no_graphics=config.no_graphics,
                timeout_wait=config.timeout_wait, log_folder=config.log_folder,
                side_channels=[self._engine, self._parameters],
            )
        except UnityWorkerInUseException as error:
            raise RuntimeError(
                f"port {config.base_port + worker_id} is in use; pass another worker_id or "
                "base_port"
            ) from error
        except UnityTimeOutException as error:
            raise EnvironmentStartError(
                f"{config.file_name} did not connect on port {config.base_port + worker_id} "
                f"within {config.timeout_wait} s (is it an ML-Agents build started with "
                "--mlagents-port?)"
            ) from error
        except UnityEnvironmentException as error:
            raise EnvironmentStartError(
                f"{config.file_name} could not be started: {error}") from error

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
        """The scene's sizes, the behavior, the worker id, port and Unity process id."""
        process = getattr(self._unity, "_process", None)
        return InstanceInfo(self.num_agents, self.obs_size, self.act_size, self.behavior_name,
                            self.worker_id, self.port, None if process is None else process.pid)

    # -- episodes -------------------------------------------------------------------------------

    def reset(self, seed: int | None, out: StepBuffers) -> None:
        """Reset every agent (reseeding the environment first when `seed` is given, which must
        be in [0, MAX_SEED)) and write the first observations and agent ids into `out`."""
        if seed is not None:
            self._parameters.set_float_parameter("seed", float(check_seed(seed)))
        self._unity.reset()
        decision, _ = self._unity.get_steps(self.behavior_name)
        self._adopt(decision, out)

    def _adopt(self, decision: Any, out: StepBuffers) -> None:
        """Start a fresh slot table from a reset's decision steps (slot = row)."""
        n = self.num_agents
        if len(decision) != n:
            raise RuntimeError(f"expected {n} agents after reset, Unity reported {len(decision)}")
        self._slot_ids = np.asarray(decision.agent_id, dtype=np.int64).copy()
        self._decision_ids = self._slot_ids.copy()  # agent id of each decision row
        self._decision_slots: np.ndarray | None = None  # slot of each row; None: row = slot
        out.obs[:] = decision.obs[0]
        out.agent_id[:] = self._slot_ids
        out.reward[:] = 0.0
        out.terminated[:] = False
        out.truncated[:] = False

    def step(self, out: StepBuffers) -> None:
        """Send `out.actions` (one row per slot) and fill `out` with the step's results: the
        next observation of each slot (its successor's first one where an episode ended, with
        the finished agent's last observation and id in `final_obs`/`final_agent_id`), the
        reward, terminated (ended before its max step) and truncated (interrupted at it)."""
        rows = self._exchange(
            out.actions if self._decision_slots is None else out.actions[self._decision_slots])
        n = self.num_agents
        slot_ids = self._slot_ids
        ids, done = rows.agent_id, rows.done
        ended = done.any()
        if not ended and np.array_equal(ids, self._decision_ids):
            # The usual step: the same agents deciding in the same order, nobody finished.
            slots = self._decision_slots
            if slots is None:
                out.reward[:] = rows.reward
                out.obs[:] = rows.obs
            else:
                out.reward[slots] = rows.reward
                out.obs[slots] = rows.obs
            out.terminated[:] = False
            out.truncated[:] = False
            return
        out.reward[:] = 0.0
        out.terminated[:] = False
        out.truncated[:] = False
        if ended:
            deciding = ~done
            finished = _rows_in(slot_ids, ids[done])  # slot of each terminal row, or -1
            known = finished >= 0  # an agent we never saw decide (cannot happen with Huggy): skip
            slots = finished[known]
            interrupted = rows.interrupted[done][known]
            out.reward[slots] = rows.reward[done][known]
            out.truncated[slots] = interrupted
            out.terminated[slots] = ~interrupted
            out.final_obs[slots] = rows.obs[done][known]
            out.final_agent_id[slots] = slot_ids[slots]
            slot_ids[slots] = -1  # freed for the successors
            ids, reward, obs = ids[deciding], rows.reward[deciding], rows.obs[deciding]
        else:
            reward, obs = rows.reward, rows.obs
        if len(ids) != n:
            raise RuntimeError(
                f"{len(ids)} of {n} agents requested a decision; HuggyVectorEnv needs every "
                "agent to decide at every step (Huggy's DecisionRequester does)"
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
        out.obs[slots] = obs
        out.agent_id[:] = slot_ids
        self._decision_ids = ids
        self._decision_slots = None if np.array_equal(slots, np.arange(n)) else slots

    def _exchange(self, actions: np.ndarray) -> Any:
        """One step of the Unity process with `actions` (one row per deciding agent, in
        Unity's order): `compat.lean_step` where it applies, else mlagents-envs' own calls."""
        from envs import compat

        rows = compat.lean_step(self._unity, self.behavior_name, actions)
        if rows is None:
            from mlagents_envs.base_env import ActionTuple

            self._unity.set_actions(self.behavior_name, ActionTuple(continuous=actions))
            self._unity.step()
            rows = compat.agent_rows(*self._unity.get_steps(self.behavior_name))
        return rows

    def close(self) -> None:
        """Close the connection and the Unity process (idempotent)."""
        if self._unity is not None:
            self._unity.close()


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
