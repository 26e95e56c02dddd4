"""`HuggyVectorEnv`: a Gymnasium vector env over every agent of one ML-Agents behavior.

One Unity process (a real build or the built-in stand-in) holds N agents; slot i of the vector
env is one agent. Unity gives an agent a new id each episode; slots stay stable: an agent that
finishes frees its slot and its successor takes it. Autoreset is same-step (gymnasium 1.x
`AutoresetMode.SAME_STEP`): a finished slot returns its successor's first observation, with the
finished agent's last observation in `infos["final_obs"]` (mask `infos["_final_obs"]`).
ML-Agents' terminal steps map to `terminated`, interrupted ones (max step) to `truncated`.
"""

from __future__ import annotations

import socket
from typing import Any

import gymnasium
import numpy as np
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

MAX_SEED = 2**24  # seeds travel as float32 on the EnvironmentParameters channel


class EnvironmentStartError(RuntimeError):
    """The Unity executable could not be started, or it never connected."""


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("localhost", port))
        except OSError:
            return False
    return True


class HuggyVectorEnv(gymnasium.vector.VectorEnv):
    """All agents of a Unity behavior (Huggy: 18) as one `gymnasium.vector.VectorEnv`.

    Args:
        file_name: Unity executable; None starts the built-in stand-in.
        worker_id: offset from `base_port` (default 5005); a busy port moves on to the next
            worker id, up to `port_attempts` ports, then raises RuntimeError.
        seed: seed sent in the handshake.
        no_graphics: start the player with `-nographics -batchmode`.
        timeout_wait: seconds to wait for the executable to connect (and for each step).
        time_scale: Unity's time scale (engine configuration channel).
        num_agents, max_steps, arena_size: environment parameters (the stand-in honours them;
            a real build only where its scene reads them). None leaves the build's default.
        base_port: first port; None means ML-Agents' 5005.
        log_folder: where the player writes `Player-<worker_id>.log`.
        behavior_name: which behavior to drive when the build has several.
        num_envs: accepted for `gymnasium.make_vec`; 1 means every agent, more sets num_agents.
        env_parameters: more float parameters for the EnvironmentParameters side channel, as
            `mlagents-learn` sends from a config's `environment_parameters` (the stand-in reads
            `episode_length` and `episode_length_step`, see `envs.standin.sim.SimConfig`).
    """

    metadata = {"autoreset_mode": AutoresetMode.SAME_STEP, "render_modes": []}

    def __init__(
        self,
        file_name: str | None = None,
        worker_id: int = 0,
        seed: int = 0,
        no_graphics: bool = True,
        timeout_wait: int = 60,
        time_scale: float = 20.0,
        num_agents: int | None = None,
        max_steps: int | None = None,
        *,
        arena_size: float | None = None,
        base_port: int | None = None,
        log_folder: str | None = None,
        behavior_name: str | None = None,
        port_attempts: int = 16,
        num_envs: int = 1,
        env_parameters: dict[str, float] | None = None,
    ) -> None:
        from mlagents_envs import env_utils
        from mlagents_envs.environment import UnityEnvironment
        from mlagents_envs.side_channel.engine_configuration_channel import (
            EngineConfigurationChannel,
        )
        from mlagents_envs.side_channel.environment_parameters_channel import (
            EnvironmentParametersChannel,
        )

        from envs.standin.launcher import builtin_huggy_path

        if num_envs != 1:
            if num_agents not in (None, num_envs):
                raise ValueError(f"num_envs={num_envs} and num_agents={num_agents} disagree")
            num_agents = num_envs
        for key, value, low in (("num_agents", num_agents, 1), ("max_steps", max_steps, 0),
                                ("arena_size", arena_size, 3.0)):
            if value is not None and not value >= low:
                raise ValueError(f"{key} must be >= {low}, got {value}")
        if file_name is None:
            file_name = builtin_huggy_path()
        elif env_utils.validate_environment_path(str(file_name)) is None:
            raise FileNotFoundError(
                f"Unity executable not found: {file_name!r} (expected an executable file, "
                "e.g. path/to/Huggy.x86_64; pass file_name=None for the built-in stand-in)"
            )
        self.file_name = str(file_name)
        self.timeout_wait = timeout_wait
        self._engine = EngineConfigurationChannel()
        self._engine.set_configuration_parameters(time_scale=time_scale)
        self._parameters = EnvironmentParametersChannel()
        for key, value in (("num_agents", num_agents), ("max_steps", max_steps),
                           ("arena_size", arena_size), *(env_parameters or {}).items()):
            if value is not None:
                self._parameters.set_float_parameter(key, float(value))

        base = UnityEnvironment.BASE_ENVIRONMENT_PORT if base_port is None else base_port
        self._unity = None
        tried: list[int] = []
        for candidate in range(worker_id, worker_id + max(1, port_attempts)):
            if not _port_is_free(base + candidate):
                tried.append(base + candidate)
                continue
            self.worker_id, self.port = candidate, base + candidate
            self._unity = self._start(UnityEnvironment, candidate, base, seed, no_graphics,
                                      log_folder)
            break
        if self._unity is None:
            raise RuntimeError(
                f"ports {tried[0]}-{tried[-1]} are all in use (worker_id {worker_id} to "
                f"{worker_id + len(tried) - 1}); pass another worker_id or base_port"
            )
        try:
            self._unity.reset()
            self.behavior_name = self._choose_behavior(behavior_name)
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
            if num_agents is not None and len(decision) != num_agents:
                raise ValueError(
                    f"asked for {num_agents} agents, the environment has {len(decision)}"
                )
        except BaseException:
            self._unity.close()
            raise
        (obs_size,) = spec.observation_specs[0].shape
        self.num_envs = len(decision)
        self.single_observation_space = gymnasium.spaces.Box(
            -np.inf, np.inf, (obs_size,), np.float32
        )
        self.single_action_space = gymnasium.spaces.Box(
            -1.0, 1.0, (spec.action_spec.continuous_size,), np.float32
        )
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self._adopt(decision)

    # -- start-up -----------------------------------------------------------------------------

    def _start(self, unity_class: type, worker_id: int, base_port: int, seed: int,
               no_graphics: bool, log_folder: str | None) -> Any:
        from mlagents_envs.exception import (
            UnityEnvironmentException,
            UnityTimeOutException,
            UnityWorkerInUseException,
        )

        try:
            return unity_class(
                file_name=self.file_name, worker_id=worker_id, base_port=base_port, seed=seed,
                no_graphics=no_graphics, timeout_wait=self.timeout_wait, log_folder=log_folder,
                side_channels=[self._engine, self._parameters],
            )
        except UnityWorkerInUseException as error:
            raise RuntimeError(
                f"port {base_port + worker_id} is in use; pass another worker_id or base_port"
            ) from error
        except UnityTimeOutException as error:
            raise EnvironmentStartError(
                f"{self.file_name} did not connect on port {base_port + worker_id} within "
                f"{self.timeout_wait} s (is it an ML-Agents build started with --mlagents-port?)"
            ) from error
        except UnityEnvironmentException as error:
            raise EnvironmentStartError(f"{self.file_name} could not be started: {error}") from error

    def _choose_behavior(self, wanted: str | None) -> str:
        names = list(self._unity.behavior_specs)
        if wanted is not None:
            if wanted not in names:
                raise ValueError(f"behavior {wanted!r} not found; the build has {names}")
            return wanted
        if len(names) != 1:
            raise ValueError(f"the build has behaviors {names}; pass behavior_name=")
        return names[0]

    # -- slots ----------------------------------------------------------------------------------

    def _adopt(self, decision: Any) -> None:
        """Start a fresh slot table from a reset's decision steps (slot = position)."""
        ids = decision.agent_id
        if len(ids) != self.num_envs:
            raise RuntimeError(
                f"expected {self.num_envs} agents after reset, Unity reported {len(ids)}"
            )
        self._slot_ids = np.asarray(ids, dtype=np.int64).copy()
        self._slot_of = {int(i): s for s, i in enumerate(ids)}
        self._decision_slots = np.arange(self.num_envs)  # slot of each decision row
        self._obs = np.asarray(decision.obs[0], dtype=np.float32).copy()

    @property
    def agent_ids(self) -> np.ndarray:
        """Current Unity agent id of each slot."""
        return self._slot_ids.copy()

    @property
    def process_id(self) -> int | None:
        """Process id of the Unity executable (None when connected to an editor)."""
        process = getattr(self._unity, "_process", None)
        return None if process is None else process.pid

    # -- gymnasium API --------------------------------------------------------------------------

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Reset every agent. With `seed`, the environment is reseeded first (stand-in: every
        observation and reward after this depends only on `seed`)."""
        if seed is not None:
            if not 0 <= int(seed) < MAX_SEED:
                raise ValueError(f"seed must be in [0, {MAX_SEED}), got {seed}")
            self._parameters.set_float_parameter("seed", float(seed))
        super().reset(seed=seed)
        self._unity.reset()
        decision, _ = self._unity.get_steps(self.behavior_name)
        self._adopt(decision)
        return self._obs.copy(), {"agent_id": self._slot_ids.copy()}

    def step(
        self, actions: Any
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Send one action row per slot; returns (obs, rewards, terminated, truncated, infos).

        Returns:
            obs (N, obs_size) float32: next observation of each slot (a successor's first one
                where an episode ended); rewards (N,) float32; terminated (N,) bool: reached
                the episode's goal; truncated (N,) bool: interrupted at max step; infos with
                `agent_id` and, where an episode ended, `final_obs`/`final_info`.
        """
        from mlagents_envs.base_env import ActionTuple

        actions = np.asarray(actions, dtype=np.float32)
        expected = (self.num_envs, *self.single_action_space.shape)
        if actions.shape != expected:
            raise ValueError(f"expected actions of shape {expected}, got {actions.shape}")
        unity = self._unity
        unity.set_actions(self.behavior_name,
                          ActionTuple(continuous=actions[self._decision_slots]))
        unity.step()
        decision, terminal = unity.get_steps(self.behavior_name)

        n = self.num_envs
        rewards = np.zeros(n, dtype=np.float32)
        terminated = np.zeros(n, dtype=bool)
        truncated = np.zeros(n, dtype=bool)
        infos: dict[str, Any] = {}
        slot_of = self._slot_of
        if len(terminal):
            final_obs = np.full(n, None, dtype=object)
            ended = np.zeros(n, dtype=bool)
            ended_ids = np.full(n, -1, dtype=np.int64)
            for row, agent in enumerate(terminal.agent_id.tolist()):
                slot = slot_of.pop(agent, None)
                if slot is None:
                    continue  # an agent we never saw decide (cannot happen with Huggy)
                rewards[slot] = terminal.reward[row]
                truncated[slot] = terminal.interrupted[row]
                terminated[slot] = not terminal.interrupted[row]
                final_obs[slot] = terminal.obs[0][row].copy()
                ended[slot] = True
                ended_ids[slot] = agent
            infos = {"final_obs": final_obs, "_final_obs": ended,
                     "final_info": {"agent_id": ended_ids, "_agent_id": ended},
                     "_final_info": ended}
        ids = decision.agent_id.tolist()
        found = [slot_of.get(agent) for agent in ids]
        if None in found:  # successors take the freed slots, lowest first
            free = iter(sorted(set(range(n)) - set(slot_of.values())))
            for row, agent in enumerate(ids):
                if found[row] is None:
                    slot = next(free, None)
                    if slot is None:
                        raise RuntimeError(f"agent {agent} appeared but all {n} slots are taken")
                    slot_of[agent] = found[row] = slot
                    self._slot_ids[slot] = agent
        slots = np.array(found, dtype=np.int64)
        if len(ids) != n:
            raise RuntimeError(
                f"{len(ids)} of {n} agents requested a decision; HuggyVectorEnv needs every "
                "agent to decide at every step (Huggy's DecisionRequester does)"
            )
        fresh = ended if len(terminal) else np.zeros(n, dtype=bool)
        known = ~fresh[slots]
        rewards[slots[known]] += decision.reward[known]
        self._obs[slots] = decision.obs[0]
        self._decision_slots = slots
        infos["agent_id"] = self._slot_ids.copy()
        return self._obs.copy(), rewards, terminated, truncated, infos

    def close_extras(self, **kwargs: Any) -> None:
        """Close the connection and the Unity process (through `close()`, which is idempotent)."""
        unity = getattr(self, "_unity", None)
        if unity is not None:
            unity.close()

    def __enter__(self) -> HuggyVectorEnv:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"HuggyVectorEnv({self.file_name!r}, worker_id={self.worker_id}, "
                f"num_envs={self.num_envs})")
