"""Scenes with several behaviors or teams, batch by batch: `TeamsEnv` drives every behavior of
one Unity process (a build, or a built-in stand-in) and gives, after each exchange, each
behavior's agents as arrays (`BehaviorRows`): those that decide now and those whose episode just
ended, with their group ids and group rewards (POCA).

mlagents-envs names a behavior `Name?team=T`; an agent is `Name?team=T?agent_id=K` (`agent_name`),
as ML-Agents itself names them. Unity gives an agent a new id every episode, so agents appear
(a first decision), finish (a terminal step) and may skip decisions (neither): nothing here
assumes that every agent decides at every step. An exchange in which no agent of any behavior
decides or finishes (possible in a build whose agents request decisions every few steps) is
stepped through at once.

`envs.parallel_env.UnityParallelEnv` is the PettingZoo face of this class; team rollouts and
matches (`envs.matches`) use it directly, batching each behavior's rows into one policy call.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from envs.behaviors import agent_name
from envs.instance import InstanceConfig, SlotLayout, check_seed, open_unity
from envs.standin.launcher import SCENES, builtin_path, spec_arguments
from envs.standin.parameters import check_parameters

BUILTIN = "builtin"
"""`file_name` of the built-in stand-ins: "builtin" (Huggy, or the behaviors of
`behavior_spec`) and "builtin:<scene>" (such as "builtin:soccertwos")."""
MAX_QUIET_EXCHANGES = 1000
"""Exchanges in a row in which no agent decides or finishes before `step` gives up."""


def builtin_stand_in(file_name: str | None, behavior_spec: Any = None) -> str | None:
    """The built-in stand-in a `file_name` starts, as `resolve_builtin` reads it.

    Args:
        file_name: None, "builtin", "builtin:<scene>" or a Unity build.
        behavior_spec: the behaviors the spec-driven stand-in plays, or None.

    Returns:
        A key of `envs.standin.parameters.STAND_INS` ("huggy", "spec" with `behavior_spec`, or a
            scene); None for a Unity build or an unknown scene.
    """
    if file_name is None or file_name == BUILTIN:
        return "huggy" if behavior_spec is None else "spec"
    if file_name.startswith(BUILTIN + ":") and file_name.split(":", 1)[1] in SCENES:
        return file_name.split(":", 1)[1]
    return None


def check_builtin_parameters(file_name: str | None, behavior_spec: Any = None,
                             parameters: Iterable[tuple[str, float]] = ()) -> None:
    """Refuse EnvironmentParameters that the built-in stand-in of `file_name` would ignore
    (`envs.standin.parameters`); nothing for a Unity build, whose parameters are its own.

    Args:
        file_name: None, "builtin", "builtin:<scene>" or a Unity build.
        behavior_spec: the behaviors the spec-driven stand-in plays, or None.
        parameters: (key, value) pairs.

    Raises:
        ValueError: a key or value the stand-in would ignore.
    """
    stand_in = builtin_stand_in(file_name, behavior_spec)
    if stand_in is not None:
        check_parameters(stand_in, parameters)


def resolve_builtin(file_name: str | None, behavior_spec: Any = None,
                    parameters: Iterable[tuple[str, float]] = ()
                    ) -> tuple[str, tuple[str, ...]]:
    """The executable and extra arguments of a `file_name`.

    Args:
        file_name: a build (as it is); "builtin" or None (the Huggy stand-in, or the spec-driven
            stand-in playing `behavior_spec`); "builtin:<scene>" (that scene of the stand-in).
        behavior_spec: the behaviors the spec-driven stand-in plays, or None.
        parameters: (key, value) EnvironmentParameters, checked against the stand-in.

    Returns:
        (executable, arguments).

    Raises:
        ValueError: an unknown scene, or `parameters` the stand-in would ignore.
        FileNotFoundError: a build that is not there.
    """
    check_builtin_parameters(file_name, behavior_spec, parameters)
    if file_name is None or file_name == BUILTIN:
        if behavior_spec is not None:
            return builtin_path(), spec_arguments(behavior_spec)
        return builtin_path(), ()
    if file_name.startswith(BUILTIN + ":"):
        return builtin_path(file_name.split(":", 1)[1]), ()
    if not Path(file_name).exists():
        raise FileNotFoundError(f"Unity build not found: {file_name} (or use 'builtin' or "
                                "'builtin:soccertwos')")
    return file_name, ()


@dataclass(frozen=True)
class BehaviorRows:
    """One behavior's agents after an exchange, deciding agents first (in Unity's order), then
    those whose episode ended. `mask` is the deciding agents' action mask (True = allowed), or
    None without discrete actions; `obs[k]` is observation k of every row."""

    behavior: str
    agent_id: np.ndarray  # (m,) int64
    obs: tuple[np.ndarray, ...]  # each (m, *shape) float32
    reward: np.ndarray  # (m,) float32: the agent's own reward since its last decision
    group_id: np.ndarray  # (m,) int64, 0 = no group
    group_reward: np.ndarray  # (m,) float32
    done: np.ndarray  # (m,) bool: the episode ended (terminal step)
    interrupted: np.ndarray  # (m,) bool: ended by the step limit (truncated)
    mask: np.ndarray | None  # (deciding, sum of branches) bool

    @property
    def deciding(self) -> int:
        """How many rows (the first ones) ask for a decision."""
        return int(len(self.done) - self.done.sum())

    def names(self) -> list[str]:
        """The rows' agent names.

        Returns:
            `Name?team=T?agent_id=K` per row (`agent_name`).
        """
        return [agent_name(self.behavior, int(i)) for i in self.agent_id]


def _rows(behavior: str, decision: Any, terminal: Any) -> BehaviorRows:
    mask = decision.action_mask
    return BehaviorRows(
        behavior=behavior,
        agent_id=np.concatenate([decision.agent_id, terminal.agent_id]).astype(np.int64),
        obs=tuple(np.concatenate([d, t]).astype(np.float32, copy=False)
                  for d, t in zip(decision.obs, terminal.obs, strict=True)),
        reward=np.concatenate([decision.reward, terminal.reward]).astype(np.float32),
        group_id=np.concatenate([decision.group_id, terminal.group_id]).astype(np.int64),
        group_reward=np.concatenate([decision.group_reward,
                                     terminal.group_reward]).astype(np.float32),
        done=np.repeat([False, True], [len(decision), len(terminal)]),
        interrupted=np.concatenate([np.zeros(len(decision), bool),
                                    np.asarray(terminal.interrupted, bool)]),
        mask=None if mask is None else ~np.concatenate(mask, axis=1))


class TeamsEnv:
    """Every behavior of one Unity process, batch by batch.

    Args:
        file_name: a Unity build, "builtin" (the stand-in: Huggy, or `behavior_spec`'s
            behaviors) or "builtin:<scene>" ("builtin:soccertwos").
        behavior_spec: for "builtin", the behaviors the spec-driven stand-in plays: a policy's
            spec, or a list of specs with their "behavior", "team" and "agents".
        worker_id: as for `envs.UnityVectorEnv`.
        base_port: as for `envs.UnityVectorEnv`.
        seed: as for `envs.UnityVectorEnv`, in [0, 2**24).
        no_graphics: as for `envs.UnityVectorEnv`.
        timeout_wait: as for `envs.UnityVectorEnv`.
        time_scale: as for `envs.UnityVectorEnv`.
        env_parameters: floats for the EnvironmentParameters side channel (the stand-in
            SoccerTwos reads `num_arenas`, `max_environment_steps`, `ball_touch`).
        log_folder: as for `envs.UnityVectorEnv`.

    Raises:
        ValueError: an unknown scene, parameters the stand-in would ignore, or a seed out of range.
        FileNotFoundError: a build that is not there.
        RuntimeError: every port tried was busy.
        EnvironmentStartError: the executable could not be started, or never connected.
    """

    def __init__(self, file_name: str | None = BUILTIN, *, behavior_spec: Any = None,
                 worker_id: int = 0, base_port: int | None = None, seed: int = 0,
                 no_graphics: bool = True, timeout_wait: int = 60, time_scale: float = 20.0,
                 env_parameters: Mapping[str, float] | None = None,
                 log_folder: str | None = None) -> None:
        from mlagents_envs import env_utils
        from mlagents_envs.environment import UnityEnvironment
        from mlagents_envs.side_channel.engine_configuration_channel import (
            EngineConfigurationChannel,
        )
        from mlagents_envs.side_channel.environment_parameters_channel import (
            EnvironmentParametersChannel,
        )

        parameters = tuple((env_parameters or {}).items())
        executable, arguments = resolve_builtin(file_name, behavior_spec, parameters)
        base_port = (UnityEnvironment.BASE_ENVIRONMENT_PORT if base_port is None else base_port)
        config = InstanceConfig(
            file_name=env_utils.validate_environment_path(executable) or executable,
            worker_ids=tuple(worker_id + k for k in range(16)), base_port=base_port,
            seed=check_seed(seed), no_graphics=no_graphics, timeout_wait=timeout_wait,
            time_scale=time_scale, parameters=parameters,
            log_folder=log_folder, additional_args=arguments)
        engine = EngineConfigurationChannel()
        engine.set_configuration_parameters(time_scale=time_scale)
        self._parameters = EnvironmentParametersChannel()
        for key, value in config.parameters:
            self._parameters.set_float_parameter(key, float(value))
        self.file_name = file_name or BUILTIN
        self._unity, self.worker_id, self.port = open_unity(config, [engine, self._parameters])
        try:
            self._unity.reset()
            self.behaviors: tuple[str, ...] = tuple(sorted(self._unity.behavior_specs))
            self.layouts: dict[str, SlotLayout] = {
                name: SlotLayout.of(spec) for name, spec in self._unity.behavior_specs.items()}
        except BaseException:
            self._unity.close()
            raise
        self._deciding = dict.fromkeys(self.behaviors, 0)

    @property
    def process_id(self) -> int | None:
        process = getattr(self._unity, "_process", None)
        return None if process is None else process.pid

    def set_parameters(self, values: Mapping[str, float]) -> None:
        """Send EnvironmentParameters side-channel values, applied by the scene at its next reset (such
        as the stand-in SoccerTwos' `arena_seed_K`).

        Args:
            values: {key: value}.
        """
        for key, value in values.items():
            self._parameters.set_float_parameter(key, float(value))

    def reset(self, seed: int | None = None) -> dict[str, BehaviorRows]:
        """Start new episodes for every agent.

        Args:
            seed: reseeds the scene first, in [0, 2**24); None keeps its seed.

        Returns:
            Each behavior's rows: its first decisions.

        Raises:
            ValueError: `seed` is out of range.
        """
        if seed is not None:
            self._parameters.set_float_parameter("seed", float(check_seed(seed)))
        self._unity.reset()
        return self._collect()

    def step(self, actions: Mapping[str, tuple[np.ndarray | None, np.ndarray | None]]
             ) -> dict[str, BehaviorRows]:
        """Send each behavior's actions for its deciding rows of the last exchange, then exchange until
        some agent decides or finishes.

        Args:
            actions: {behavior: (continuous (n, c) float32 or None, discrete (n, branches) integers
                or None)}; a behavior left out, or a kind given as None, gets zeros.

        Returns:
            Each behavior's rows after the exchange.

        Raises:
            ValueError: actions for an unknown behavior, or of another shape.
            RuntimeError: no agent decided or finished in `MAX_QUIET_EXCHANGES` exchanges.
        """
        from mlagents_envs.base_env import ActionTuple

        unknown = sorted(set(actions) - set(self.behaviors))
        if unknown:
            raise ValueError(f"actions for unknown behavior(s) {unknown}; the scene has "
                             f"{list(self.behaviors)}")
        for behavior in self.behaviors:
            deciding = self._deciding[behavior]
            if not deciding:
                continue
            layout = self.layouts[behavior]
            continuous, discrete = actions.get(behavior, (None, None))
            if continuous is None:
                continuous = np.zeros((deciding, layout.continuous_size), np.float32)
            if discrete is None:
                discrete = np.zeros((deciding, len(layout.discrete_branches)), np.int32)
            continuous = np.asarray(continuous, np.float32).reshape(deciding, -1)
            discrete = np.asarray(discrete, np.int32).reshape(deciding, -1)
            if continuous.shape[1] != layout.continuous_size or \
                    discrete.shape[1] != len(layout.discrete_branches):
                raise ValueError(f"{behavior}: expected ({deciding}, {layout.continuous_size}) "
                                 f"continuous and ({deciding}, {len(layout.discrete_branches)}) "
                                 f"discrete actions, received {continuous.shape} and "
                                 f"{discrete.shape}")
            self._unity.set_actions(behavior, ActionTuple(continuous, discrete))
        for _ in range(MAX_QUIET_EXCHANGES):
            self._unity.step()
            found = self._collect()
            if any(len(rows.done) for rows in found.values()):
                return found
        raise RuntimeError(f"no agent decided or finished in {MAX_QUIET_EXCHANGES} exchanges")

    def _collect(self) -> dict[str, BehaviorRows]:
        found = {behavior: _rows(behavior, *self._unity.get_steps(behavior))
                 for behavior in self.behaviors}
        self._deciding = {behavior: rows.deciding for behavior, rows in found.items()}
        return found

    def close(self) -> None:
        """Close the Unity process."""
        self._unity.close()

    def __enter__(self) -> TeamsEnv:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
