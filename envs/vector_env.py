"""`UnityVectorEnv`: a Gymnasium vector env over every agent of one ML-Agents behavior, in one
Unity process or in several; `HuggyVectorEnv` is its Huggy preset.

Spaces come from the behavior: one observation is a Box, several a Tuple of Boxes (an image
(C, H, W) in [0, 1]); continuous actions a Box in [-1, 1], discrete ones a MultiDiscrete of the
branch sizes, both a Tuple (continuous, discrete). Where there are discrete actions,
`infos["action_mask"]` is each slot's mask for its next decision, (N, sum of branches) bool,
True = allowed (the Gymnasium convention; mlagents-envs' own is the inverse).

One Unity process (a real build or the built-in stand-in) holds N agents; slot i of the vector
env is one agent. With `instances=K`, K Unity processes run at once, each driven from its own
worker process (`envs.workers`), and the slots are their agents concatenated, instance 0's first.
Unity gives an agent a new id each episode; slots stay stable: an agent that finishes frees its
slot and its successor takes it (`envs.instance`). Autoreset is same-step (gymnasium 1.x
`AutoresetMode.SAME_STEP`): a finished slot returns its successor's first observation, with the
finished agent's last observation in `infos["final_obs"]` (mask `infos["_final_obs"]`).
ML-Agents' terminal steps map to `terminated`, interrupted ones (max step) to `truncated`.
Frames: `render_mode="rgb_array"`, see `UnityVectorEnv.render`.
"""

from __future__ import annotations

import operator
import os
from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium
import numpy as np
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from envs import render
from envs.instance import (
    MAX_SEED,
    EnvironmentStartError,
    InstanceConfig,
    InstanceInfo,
    SlotLayout,
    StepBuffers,
    UnityInstance,
    check_seed,
    instance_seed,
)
from envs.standin import poses
from envs.standin.parameters import STAND_INS
from envs.standin.sim import DT
from envs.teams import BUILTIN, builtin_stand_in, resolve_builtin
from envs.workers import InstanceWorkers

__all__ = ["MAX_SEED", "RENDER_FPS", "EnvironmentStartError", "HuggyVectorEnv",
           "UnityVectorEnv", "instance_seed", "spaces_of"]

RENDER_FPS = 1.0 / DT
"""Frames per second of real time: one frame per decision of Huggy (every 4 physics steps of
0.02 s). A Unity build whose scene decides at another rate plays faster or slower."""


def spaces_of(layout: SlotLayout) -> tuple[gymnasium.Space, gymnasium.Space]:
    """The single-slot observation and action spaces of a behavior.

    Args:
        layout: what one slot holds.

    Returns:
        (observation space, action space): one observation is a Box, several a Tuple of Boxes (an
            image (C, H, W) in [0, 1], others unbounded); continuous actions a Box in [-1, 1],
            discrete ones a MultiDiscrete of the branch sizes, both a Tuple (continuous, discrete).
    """
    boxes = [gymnasium.spaces.Box(0.0, 1.0, shape, np.float32) if len(shape) == 3
             else gymnasium.spaces.Box(-np.inf, np.inf, shape, np.float32)
             for shape in layout.observations]
    observation = boxes[0] if len(boxes) == 1 else gymnasium.spaces.Tuple(boxes)
    actions: list[gymnasium.Space] = []
    if layout.continuous_size:
        actions.append(gymnasium.spaces.Box(-1.0, 1.0, (layout.continuous_size,), np.float32))
    if layout.discrete_branches:
        actions.append(gymnasium.spaces.MultiDiscrete(list(layout.discrete_branches)))
    action = actions[0] if len(actions) == 1 else gymnasium.spaces.Tuple(actions)
    return observation, action


class _LocalInstance:
    """One instance in this process: no worker, no copy between processes."""

    def __init__(self, config: InstanceConfig) -> None:
        self.instance = UnityInstance(config)
        info = self.instance.info()
        self.infos = [info]
        self.slices = [slice(0, info.num_agents)]
        self.buffers = StepBuffers.over(info.num_agents, info.layout, pose_size=config.pose_size)
        self.worker_process_ids: list[int] = []

    def reset(self, seeds: Sequence[int | None]) -> None:
        self.instance.reset(seeds[0], self.buffers)

    def step(self) -> None:
        self.instance.step(self.buffers)

    def close(self) -> None:
        self.instance.close()


def scene_parameters(num_agents: int | None = None, max_steps: int | None = None,
                     arena_size: float | None = None,
                     env_parameters: Mapping[str, float] | None = None
                     ) -> tuple[tuple[str, float], ...]:
    """The EnvironmentParameters `UnityVectorEnv` sends its scene.

    Args:
        num_agents: agents per instance, or None.
        max_steps: steps before an episode is interrupted, or None.
        arena_size: the arena's half width, or None.
        env_parameters: more parameters, or None.

    Returns:
        (key, float) pairs: `num_agents`, `max_steps` and `arena_size` where given, then
            `env_parameters`.
    """
    return tuple((key, float(value)) for key, value in (
        ("num_agents", num_agents), ("max_steps", max_steps), ("arena_size", arena_size),
        *(env_parameters or {}).items()) if value is not None)


def check_num_envs(file_name: str | None, behavior_spec: Any, num_envs: int) -> None:
    """Refuse a `num_envs` that cannot size the built-in stand-in of `file_name`: other than 1 it is
    sent as the parameter `num_agents`, which a scene sized otherwise (the stand-in SoccerTwos, by
    `num_arenas`) does not take.

    Args:
        file_name: the env's `file_name` (None or `builtin...` for a stand-in).
        behavior_spec: the env's `behavior_spec`.
        num_envs: the env's `num_envs`.

    Raises:
        ValueError: `num_envs` is not 1 and the stand-in does not take `num_agents` (nothing for a
            Unity build).
    """
    stand_in = builtin_stand_in(file_name, behavior_spec)
    if num_envs == 1 or stand_in is None:
        return
    name, _, taken = STAND_INS[stand_in]
    if "num_agents" not in taken:
        raise ValueError(
            f"num_envs={num_envs} does not apply to {name}: it is sent to the stand-in as "
            "num_agents, which that scene does not take; leave num_envs at 1 (every agent of "
            "the driven behavior) and size the scene with env_parameters={'num_arenas': N} "
            "(2 N slots per team in each instance), or play every team with "
            "envs.teams.TeamsEnv")


class UnityVectorEnv(gymnasium.vector.VectorEnv):
    """All agents of a Unity behavior as one `gymnasium.vector.VectorEnv`.

    Args:
        file_name: Unity executable; None (or "builtin") starts the built-in stand-in: Huggy
            (18 agents per process), or with `behavior_spec` its spec-driven mode for any
            behavior; "builtin:soccertwos" the stand-in SoccerTwos (drive one team with
            `behavior_name`, play the other with `opponents`).
        behavior_spec: for the stand-in, the behavior it plays (`envs.standin.spec_sim`): a
            policy file or results folder (its spec), a `huggy_agent_client.spec.ActorSpec` or its
            `as_dict()`. Ignored with a Unity build, whose scene fixes it.
        worker_id: offset from `base_port` (default 5005); a busy port moves on to the next
            worker id, up to `port_attempts` ports, then raises RuntimeError. Instance i of K
            tries worker ids `worker_id + i`, `worker_id + i + K`, ...
        seed: seed sent in the handshake (instance i: `instance_seed(seed, i)`).
        no_graphics: start the player with `-nographics -batchmode`.
        timeout_wait: seconds to wait for the executable to connect (and for each step).
        time_scale: Unity's time scale (engine configuration channel).
        num_agents: agents of one instance, an environment parameter of every instance (the
            stand-in honours it; a real build only where its scene reads it); None leaves the
            build's default. So are `max_steps` and `arena_size`.
        max_steps: steps before an episode is interrupted (see `num_agents`).
        arena_size: the arena's half width (see `num_agents`).
        base_port: first port; None means ML-Agents' 5005.
        log_folder: where each player writes `Player-<worker_id>.log`.
        behavior_name: which behavior to drive when the build has several.
        num_envs: accepted for `gymnasium.make_vec`: the number of slots in all; 1 means every
            agent, more sets `num_agents` to `num_envs / instances` (refused for the stand-in
            SoccerTwos, which is sized by `num_arenas`).
        env_parameters: more float parameters for the EnvironmentParameters side channel, as
            `mlagents-learn` sends from a config's `environment_parameters` (the stand-in reads
            `episode_length` and `episode_length_step`, see `envs.standin.sim.SimConfig`; with
            several instances a slot's scripted length follows its index within its instance).
        instances: Unity processes to run at once (ML-Agents' `--num-envs`). More than one
            starts one worker process per instance (`envs.workers`); all step together.
        pin_cores: with several instances, pin instance i's worker and Unity process to the
            i-th CPU core this process may use (wrapping around), so the handoffs between the
            two stay on one core (docs/benchmarks.md, "Summary", the row of 2 instances).
            Off by default: for a machine of your own. Several pinned environments at once
            share the same first cores, and a Unity build's own threads want several cores.
        render_mode: None, or "rgb_array" for frames (see `render`): the stand-in playing
            Huggy, or a behavior with a camera observation; anything else raises ValueError
            here. The stand-in then sends its poses after every step (the
            simulation's numbers are unchanged); without it nothing changes on the wire.
        render_label: a name drawn on every frame (the policy's); `render_frame` can override it.
        opponents: the scene's other behaviors, played in the instances' own processes so that
            a learner sees one team as a single-agent vector env: {key: policy source}, a key a
            behavior (`Goalie`), a behavior with its team (`SoccerTwos?team=1`) or `team=N`, a
            source a policy file, results folder, `hf://` source, `heuristic:NAME` or a served
            policy's URL (`envs.agents`). A behavior neither driven nor played gets no actions
            (Unity then repeats zeros).
        opponents_deterministic: the opponents play their most likely actions; by default they
            sample, seeded by the reset's seed and the step.
        port_attempts: how many worker ids (ports) an instance tries before it gives up.

    `num_envs` is the number of agent slots in all; `instance_slices[i]` are instance i's.
    `reset(seed=s)` reseeds instance i with `instance_seed(s, i)` = `(s + i * 10_368_889) mod
    2**24` (instance 0 with s itself); `reset(options={"seeds": [s_0, ..., s_{K-1}]})` reseeds
    each instance with its own seed. If an instance fails, every process is closed and
    `envs.workers.InstanceError` names it.

    Raises:
        ValueError: an argument out of its range, `num_envs` that the instances or the scene
            cannot take, a behavior that is not found or that this env does not drive, an
            opponent that does not fit its behavior, or `render_mode` without frames to draw.
        FileNotFoundError: `file_name` names no Unity executable.
        RuntimeError: every port tried was busy.
        EnvironmentStartError: the Unity executable could not be started, or never connected.
    """

    metadata = {"autoreset_mode": AutoresetMode.SAME_STEP, "render_modes": ["rgb_array"],
                "render_fps": RENDER_FPS}

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
        instances: int = 1,
        behavior_spec: Any = None,
        pin_cores: bool = False,
        render_mode: str | None = None,
        render_label: str | None = None,
        opponents: Mapping[str, str] | None = None,
        opponents_deterministic: bool = False,
    ) -> None:
        from mlagents_envs import env_utils
        from mlagents_envs.environment import UnityEnvironment

        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"render_mode must be None or 'rgb_array', got {render_mode!r}")
        if isinstance(instances, bool) or not isinstance(instances, int) or instances < 1:
            raise ValueError(f"instances must be an integer >= 1, got {instances!r}")
        if isinstance(num_envs, bool) or not hasattr(num_envs, "__index__") or num_envs < 1:
            raise ValueError("num_envs must be an integer >= 1 (1: every agent of the behavior), "
                             f"got {num_envs!r}")
        num_envs = operator.index(num_envs)  # numpy integers too
        if num_envs != 1:
            if num_envs % instances:
                raise ValueError(f"num_envs={num_envs} slots cannot be split evenly over "
                                 f"{instances} instances")
            if num_agents not in (None, num_envs // instances):
                raise ValueError(f"num_envs={num_envs} and num_agents={num_agents} disagree")
            num_agents = num_envs // instances
        for key, value, low in (("num_agents", num_agents, 1), ("max_steps", max_steps, 0),
                                ("arena_size", arena_size, 3.0)):
            if value is not None and not value >= low:
                raise ValueError(f"{key} must be >= {low}, got {value}")
        parameters = scene_parameters(num_agents, max_steps, arena_size, env_parameters)
        additional_args: tuple[str, ...] = ()
        if file_name is None or str(file_name).startswith(BUILTIN):
            check_num_envs(file_name, behavior_spec, num_envs)
            file_name, additional_args = resolve_builtin(file_name, behavior_spec, parameters)
        elif env_utils.validate_environment_path(str(file_name)) is None:
            raise FileNotFoundError(
                f"Unity executable not found: {file_name!r} (expected an executable file, "
                "e.g. path/to/Huggy.x86_64; pass file_name=None for the built-in stand-in)"
            )
        self.file_name = str(file_name)
        self.timeout_wait = timeout_wait
        base = UnityEnvironment.BASE_ENVIRONMENT_PORT if base_port is None else base_port
        cores = sorted(os.sched_getaffinity(0)) if pin_cores and instances > 1 else []
        configs = [
            InstanceConfig(
                file_name=self.file_name,
                worker_ids=tuple(worker_id + i + instances * k
                                 for k in range(max(1, port_attempts))),
                base_port=base, seed=seed if i == 0 else instance_seed(seed, i),
                no_graphics=no_graphics, timeout_wait=timeout_wait, time_scale=time_scale,
                parameters=parameters, log_folder=log_folder, behavior_name=behavior_name,
                num_agents=num_agents, additional_args=additional_args,
                cpu_core=cores[i % len(cores)] if cores else None,
                render=render_mode is not None,
                opponents=tuple((opponents or {}).items()),
                opponents_deterministic=opponents_deterministic)
            for i in range(instances)
        ]
        if instances == 1:
            self._instances: Any = _LocalInstance(configs[0])
        else:
            self._instances = InstanceWorkers(configs)
        infos: list[InstanceInfo] = self._instances.infos
        self.instances = instances
        self.instance_slices: tuple[slice, ...] = tuple(self._instances.slices)
        self.behavior_name = infos[0].behavior_name
        self._buffers: StepBuffers = self._instances.buffers
        self.layout: SlotLayout = infos[0].layout
        self.num_envs = sum(info.num_agents for info in infos)
        self.render_mode = render_mode
        self.render_label = render_label
        try:
            self._check_layout(self.layout)
            self._frames = self._frame_source(infos) if render_mode else None
        except ValueError:
            self._instances.close()
            raise
        self._tracks = render.SlotTracks(self.num_envs) if render_mode else None
        self.single_observation_space, self.single_action_space = spaces_of(self.layout)
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)

    def _check_layout(self, layout: SlotLayout) -> None:
        """Refuse a behavior this environment does not drive (every behavior here)."""

    def _frame_source(self, infos: Sequence[InstanceInfo]) -> str | int:
        """Where frames come from: "poses" (the stand-in's Huggy), else the index of the first
        camera observation (C, H, W) of 1 or 3 channels; ValueError when there is neither."""
        if all(info.sends_poses for info in infos):
            return "poses"
        for index, shape in enumerate(self.layout.observations):
            if len(shape) == 3 and shape[0] in (1, 3):
                return index
        raise ValueError(
            f"render_mode='rgb_array' needs the built-in stand-in playing Huggy (which sends its "
            f"poses) or a camera sensor (a (C, H, W) observation of 1 or 3 channels); behavior "
            f"{self.behavior_name!r} has {self.layout.describe()} and sends no poses")

    # -- where things run -----------------------------------------------------------------------

    @property
    def agent_ids(self) -> np.ndarray:
        """Current Unity agent id of each slot (ids are per instance: two instances may both
        have an agent 0)."""
        return self._buffers.agent_id.copy()

    @property
    def worker_ids(self) -> tuple[int, ...]:
        """Worker id (port offset) of each instance."""
        return tuple(info.worker_id for info in self._instances.infos)

    @property
    def ports(self) -> tuple[int, ...]:
        """gRPC port of each instance."""
        return tuple(info.port for info in self._instances.infos)

    @property
    def worker_id(self) -> int:
        """Worker id of instance 0."""
        return self.worker_ids[0]

    @property
    def port(self) -> int:
        """Port of instance 0."""
        return self.ports[0]

    @property
    def process_ids(self) -> tuple[int | None, ...]:
        """Process id of each instance's Unity executable (None when connected to an editor)."""
        return tuple(info.process_id for info in self._instances.infos)

    @property
    def process_id(self) -> int | None:
        """Process id of instance 0's Unity executable."""
        return self.process_ids[0]

    @property
    def worker_process_ids(self) -> tuple[int, ...]:
        """Process id of each instance's worker (empty with one instance, which runs here)."""
        return tuple(self._instances.worker_process_ids)

    # -- gymnasium API --------------------------------------------------------------------------

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Reset every agent of every instance.

        Args:
            seed: reseed the environment first (stand-in: every observation and reward after this
                depends only on `seed`), instance i with `instance_seed(seed, i)`; in [0, MAX_SEED)
                (seeds travel as float32).
            options: `{"seeds": [...]}` gives each instance its own seed instead (one per instance,
                each in [0, MAX_SEED)).

        Returns:
            (obs, infos): each slot's first observation (one (N, *shape) array, or a tuple of them),
                and infos with `agent_id` and, with discrete actions, `action_mask`.

        Raises:
            ValueError: a seed out of range, both `seed` and `options["seeds"]`, another number of
                seeds than instances, or an unknown option.
        """
        seeds = self._instance_seeds(seed, options or {})
        super().reset(seed=seed)
        self._instances.reset(seeds)
        if self._tracks is not None:
            self._tracks.reset(self._floor_positions(self._buffers.pose))
        return self._observations(), self._infos()

    def _floor_positions(self, pose_rows: np.ndarray) -> np.ndarray | None:
        """(N, 2) floor positions (x, z) of pose rows, or None without poses."""
        if self._frames != "poses":
            return None
        return pose_rows[:, [poses.POSITION.start, poses.POSITION.start + 2]]

    def _observations(self) -> Any:
        """Every slot's observation: one (N, *shape) array, or a tuple of them."""
        arrays = tuple(o.copy() for o in self._buffers.obs)
        return arrays[0] if len(arrays) == 1 else arrays

    def _infos(self) -> dict[str, Any]:
        infos: dict[str, Any] = {"agent_id": self._buffers.agent_id.copy()}
        if self.layout.discrete_branches:
            infos["action_mask"] = self._buffers.mask.copy()
        return infos

    def _instance_seeds(self, seed: int | None, options: dict[str, Any]) -> list[int | None]:
        unknown = set(options) - {"seeds"}
        if unknown:
            raise ValueError(f"unknown reset option(s) {sorted(unknown)}; UnityVectorEnv takes "
                             "options={'seeds': [one seed per instance]}")
        if "seeds" not in options:
            if seed is None:
                return [None] * self.instances
            check_seed(seed)
            return [instance_seed(seed, i) for i in range(self.instances)]
        if seed is not None:
            raise ValueError("pass either seed= or options={'seeds': [...]}, not both")
        seeds = list(options["seeds"])
        if len(seeds) != self.instances:
            raise ValueError(f"options['seeds'] needs one seed per instance: expected "
                             f"{self.instances}, got {len(seeds)}")
        return [check_seed(s) for s in seeds]

    def step(
        self, actions: Any
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Send one action row per slot and step every instance.

        Args:
            actions: (N, continuous) floats, (N, branches) integers, or for both a tuple
                (continuous, discrete) such as `huggy_agent.Actions`.

        Returns:
            obs: each slot's next observation (a successor's first one where an episode ended).
            rewards: (N,) float32.
            terminated: (N,) bool: reached the episode's goal.
            truncated: (N,) bool: interrupted at max step.
            infos: `agent_id`, `action_mask` (discrete actions) and, where an episode ended,
                `final_obs`/`final_info`.

        Raises:
            ValueError: actions of another shape, or discrete actions outside their branches.
        """
        buffers = self._buffers
        continuous, discrete = self._split_actions(actions)
        if continuous is not None:
            buffers.actions[:] = continuous
        if discrete is not None:
            buffers.discrete[:] = discrete
        self._instances.step()
        terminated = buffers.terminated.copy()
        truncated = buffers.truncated.copy()
        ended = terminated | truncated
        infos: dict[str, Any] = {}
        if ended.any():
            final_obs = np.full(self.num_envs, None, dtype=object)
            for slot in np.flatnonzero(ended):
                rows = tuple(o[slot].copy() for o in buffers.final_obs)
                final_obs[slot] = rows[0] if len(rows) == 1 else rows
            infos = {"final_obs": final_obs, "_final_obs": ended,
                     "final_info": {"agent_id": np.where(ended, buffers.final_agent_id, -1),
                                    "_agent_id": ended},
                     "_final_info": ended}
        infos.update(self._infos())
        rewards = buffers.reward.copy()
        if self._tracks is not None:
            self._tracks.step(rewards, terminated, truncated, self._floor_positions(buffers.pose),
                              self._floor_positions(buffers.final_pose))
        return self._observations(), rewards, terminated, truncated, infos

    # -- rendering ------------------------------------------------------------------------------

    def render(self) -> tuple[np.ndarray, ...] | None:
        """One frame per slot, each as `render_frame(slot)`, as Gymnasium's vector envs render.

        The built-in stand-in playing Huggy sends its agents' poses on a side channel of its own
        (`envs.standin.poses`), and frames are drawn from them (`envs.render.huggy_frame`); a behavior
        with a camera observation (C, H, W) of 1 or 3 channels gives that image
        (`envs.render.visual_frame`).

        Returns:
            One (H, W, 3) uint8 frame per slot; None, with a warning, without a render mode.
        """
        if self.render_mode is None:
            gymnasium.logger.warn("render() called on an environment made without render_mode; "
                                  "pass render_mode='rgb_array'")
            return None
        return tuple(self.render_frame(slot) for slot in range(self.num_envs))

    def render_frame(self, slot: int, *, final: bool = False, label: str | None = None
                     ) -> np.ndarray:
        """The frame of one agent slot.

        Args:
            slot: the slot.
            final: the last frame of the episode the slot ended at the last step (valid only right
                after that step) instead of the frame now.
            label: names the policy on a drawn frame (default `render_label`).

        Returns:
            An (H, W, 3) uint8 frame.

        Raises:
            RuntimeError: the env was made without `render_mode="rgb_array"`.
            ValueError: `slot` is out of range.
        """
        if self._tracks is None:
            raise RuntimeError("this environment was made without render_mode='rgb_array'")
        if not 0 <= slot < self.num_envs:
            raise ValueError(f"slot must be in [0, {self.num_envs}), got {slot}")
        buffers, tracks = self._buffers, self._tracks
        if isinstance(self._frames, int):  # a camera observation
            images = buffers.final_obs if final else buffers.obs
            return render.visual_frame(images[self._frames][slot])
        ended = None  # the poses are Huggy's: its episodes terminate at the stick
        if final:
            ended = "reached the stick" if tracks.final_terminated[slot] else "max steps reached"
        overlay = render.Overlay(
            behavior=self.behavior_name.split("?")[0],
            label=self.render_label if label is None else label,
            step=int((tracks.final_lengths if final else tracks.lengths)[slot]),
            episode_return=float((tracks.final_returns if final else tracks.returns)[slot]),
            slot=slot, ended=ended)
        return render.huggy_frame((buffers.final_pose if final else buffers.pose)[slot],
                                  tracks.trail(slot, final), overlay)

    def _split_actions(self, actions: Any) -> tuple[np.ndarray | None, np.ndarray | None]:
        """(continuous, discrete) rows of `actions`, checked against the action space."""
        layout, n = self.layout, self.num_envs
        continuous, discrete = layout.split_actions(actions)
        if continuous is not None:
            continuous = np.asarray(continuous, dtype=np.float32)
            if continuous.shape != (n, layout.continuous_size):
                raise ValueError(f"expected actions of shape {(n, layout.continuous_size)}, got "
                                 f"{continuous.shape}")
        if discrete is not None:
            discrete = np.asarray(discrete)
            branches = np.array(layout.discrete_branches)
            if discrete.shape != (n, len(branches)) or discrete.dtype.kind not in "iu" or \
                    (discrete < 0).any() or (discrete >= branches).any():
                raise ValueError(f"expected discrete actions of shape {(n, len(branches))}, "
                                 f"integers in [0, branch size) for branches "
                                 f"{layout.discrete_branches}, got {discrete.shape} "
                                 f"{discrete.dtype}")
        return continuous, discrete

    def close_extras(self, **kwargs: Any) -> None:
        """Close every connection, worker and Unity process (through `close()`, which is idempotent).

        Args:
            **kwargs: Gymnasium's `close` arguments, unused.
        """
        instances = getattr(self, "_instances", None)
        if instances is not None:
            instances.close()

    def __enter__(self) -> UnityVectorEnv:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.file_name!r}, worker_ids={list(self.worker_ids)}, "
                f"instances={self.instances}, num_envs={self.num_envs})")


class HuggyVectorEnv(UnityVectorEnv):
    """The Huggy preset of `UnityVectorEnv`: `file_name=None` is the built-in Huggy stand-in, and
    the behavior must have one vector observation and continuous actions only, as Huggy's has
    (observations are one (N, obs_size) array, actions one (N, act_size) array).

    Args:
        *args: as `UnityVectorEnv`'s.
        **kwargs: as `UnityVectorEnv`'s, but for `behavior_spec`.

    Raises:
        ValueError: `behavior_spec` is given, or the behavior is not of Huggy's kind; else as
            `UnityVectorEnv` raises.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("behavior_spec") is not None:
            raise ValueError("HuggyVectorEnv plays Huggy; for another behavior use "
                             "UnityVectorEnv(behavior_spec=...) or huggy_agent/Unity-v0")
        super().__init__(*args, **kwargs)

    def _check_layout(self, layout: SlotLayout) -> None:
        if not layout.lean:
            raise ValueError(f"behavior {self.behavior_name!r} has {layout.describe()}; "
                             "HuggyVectorEnv drives one vector observation and continuous "
                             "actions only: use UnityVectorEnv or huggy_agent/Unity-v0")
