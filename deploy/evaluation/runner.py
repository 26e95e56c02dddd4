"""The runner: one environment (of one or more Unity instances) and local policy copies,
running work items: as many at once as the environment has instances, one item per instance.

Used in-process by `evaluate_plain` and as a Ray actor by `evaluate_on_ray`. Fault handling is
Ray's own: a crashed environment raises `EnvironmentCrashed`, which the driver lets Ray retry on
the same runner (`retry_exceptions`), and the runner opens a fresh environment first; a runner
whose process dies is restarted by Ray (`max_restarts`) and its items retried
(`max_task_retries`).
"""

from __future__ import annotations

import importlib
import os
import socket
import sys
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import envs
from deploy import ray_internals
from deploy.evaluation.plan import EnvSpec, PolicySpec, WorkItem
from deploy.evaluation.results import ItemResult, KeptEpisodes, RunnerInfo
from envs.recording.episodes import EpisodeCollector

BASE_PORT = 5005
"""mlagents-envs' base port for an executable: an environment listens on base + worker id."""


class EnvironmentCrashed(RuntimeError):
    """A runner's environment died mid-item; the item runs again on a fresh environment."""


class Runner:
    """Owns one environment and runs work items on it, up to one per Unity instance at a time.
    Policies are loaded on first use (from the path, or from bytes the driver shipped); the two
    most recent are kept.

    Args:
        name: the runner's name in results.
        env: how to open its environment (opened here, while torch is imported).
        device: the device of its policy copies.
        precision: the precision of its policy copies.

    Raises:
        ValueError: the environment's settings are refused.
        RuntimeError: no free port, or the Unity executable could not be started.
    """

    def __init__(self, name: str, env: EnvSpec, device: str = "cpu",
                 precision: str = "fp32") -> None:
        self._name = name
        self._env_spec = env
        self._device = device
        self._precision = precision
        self._agents: OrderedDict[str, Any] = OrderedDict()
        # Import torch (~1 s) while the environment process boots, so a runner reports ready
        # only when it can run items at once.
        importer = threading.Thread(target=importlib.import_module, args=("huggy_agent",))
        importer.start()
        try:
            self._env: Any = open_env(env)
        finally:
            importer.join()

    def info(self) -> RunnerInfo:
        """What the runner reports of itself.

        Returns:
            Its name, node id ("local" outside Ray), process id and environment process ids.
        """
        pids = () if self._env is None else tuple(self._env.process_ids)
        return RunnerInfo(self._name, node_id(), os.getpid(), pids[0] if pids else None, pids)

    def run(self, spec: PolicySpec, payload: list[Any] | bytes | None,
            items: Sequence[WorkItem], stochastic: bool, keep: bool = False
            ) -> list[ItemResult]:
        """Run up to `EnvSpec.instances` items of one policy at once, item j on instance j (reset with
        the item's seed; a spare instance steps uncounted). Each item's `seconds` is its share of the
        wall time, in proportion to its agent-steps.

        Args:
            spec: the policy.
            payload: None (load `spec.path`), the file's bytes, or a one-element list holding an
                ObjectRef of them (resolved only when the policy is not cached).
            items: 1 to `EnvSpec.instances` items of the policy.
            stochastic: sample actions rather than take the mean.
            keep: keep each item's episodes whole (`ItemResult.kept`).

        Returns:
            One result per item.

        Raises:
            ValueError: not 1 to `EnvSpec.instances` items.
            PolicyLoadError: the policy cannot be loaded.
            FileNotFoundError: the policy file does not exist.
            EnvironmentCrashed: the environment died mid-rollout (the next call opens a new one).
        """
        slots = self._env_spec.instances
        if not 1 <= len(items) <= slots:
            raise ValueError(f"expected 1 to {slots} work items (one per instance), got "
                             f"{len(items)}")
        agent = self._agent(spec, payload)
        if self._env is None:
            self._env = open_env(self._env_spec)
        spare = slots - len(items)
        collectors = [EpisodeCollector() for _ in items] if keep else []
        try:
            results = envs.rollout_per_instance(
                agent, self._env, episodes=[item.episodes for item in items] + [0] * spare,
                seeds=[item.seed for item in items] + [items[0].seed] * spare,
                deterministic=not stochastic,
                recorders=[[c] for c in collectors] + [[]] * spare if keep else ())
        except envs.RolloutInterrupted as error:
            self._env.close()
            self._env = None
            which = ", ".join(str(item.index) for item in items)
            raise EnvironmentCrashed(
                f"runner {self._name}: environment died during item{'s' * (len(items) > 1)} "
                f"{which} of {spec.label}: {error}") from None
        node, tries = node_id(), attempt()
        return [ItemResult(
            policy_index=item.policy_index, index=item.index, seed=item.seed,
            returns=tuple(float(e.episode_return) for e in result.episodes),
            lengths=tuple(int(e.length) for e in result.episodes),
            terminated=tuple(bool(e.terminated) for e in result.episodes),
            slots=tuple(e.slot for e in result.episodes),
            episode_indices=tuple(e.index for e in result.episodes),
            agent_steps=int(result.agent_steps), seconds=float(result.seconds),
            node_id=node, runner=self._name, attempts=tries, behavior=self._env.behavior_name,
            kept=KeptEpisodes.of(collectors[j]) if keep else None)
            for j, (item, result) in enumerate(zip(items, results, strict=False))]

    def close(self) -> None:
        """Close the environment (stops its processes)."""
        if self._env is not None:
            self._env.close()

    def _agent(self, spec: PolicySpec, payload: list[Any] | bytes | None) -> Any:
        key = f"{spec.url}#{spec.policy_id}" if spec.url else spec.label
        if key in self._agents:
            self._agents.move_to_end(key)
            return self._agents[key]
        if spec.url is not None:
            agent = spec.remote_agent()
        else:
            agent = load_agent(spec, payload, self._device, self._precision)
        self._agents[key] = agent
        while len(self._agents) > 2:
            self._agents.popitem(last=False)
        return agent


def load_agent(spec: PolicySpec, payload: list[Any] | bytes | None = None, device: str = "cpu",
               precision: str = "fp32") -> Any:
    """The policy a spec names.

    Args:
        spec: a policy file's spec.
        payload: None (load from the file), the file's bytes, or a one-element list holding an
            ObjectRef of them.
        device: where the policy runs.
        precision: its layers' precision.

    Returns:
        The agent.

    Raises:
        PolicyLoadError: the policy cannot be loaded.
        FileNotFoundError: the file does not exist.
    """
    assert spec.path is not None
    return load_policy_file(spec.path, payload, device, precision)


def load_policy_file(path: str, payload: list[Any] | bytes | None = None, device: str = "cpu",
                     precision: str = "fp32") -> Any:
    """A policy file, loaded from itself or from its bytes, so that runners on other machines need no
    shared file system.

    Args:
        path: the file (its name, suffix included, is kept for bytes).
        payload: None (load from the file), the file's bytes, or a one-element list holding an
            ObjectRef of them.
        device: where the policy runs.
        precision: its layers' precision.

    Returns:
        The agent.

    Raises:
        PolicyLoadError: the policy cannot be loaded.
        FileNotFoundError: the file does not exist.
    """
    # start-up time: torch is imported while the environment boots (`Runner.__init__`)
    from huggy_agent import HuggyAgent

    if payload is None:
        return HuggyAgent.from_checkpoint(path, device=device, precision=precision)
    if isinstance(payload, list):
        import ray

        payload = ray.get(payload[0])
    assert isinstance(payload, bytes)
    # The file travels as bytes so runners on other machines need no shared file system.
    with tempfile.TemporaryDirectory(prefix="huggy-eval-") as folder:
        local = Path(folder) / Path(path).name
        local.write_bytes(payload)
        return HuggyAgent.from_checkpoint(local, device=device, precision=precision)


def open_env(spec: EnvSpec, render_mode: str | None = None) -> Any:
    """Open an environment on a worker id whose port was free a moment ago: several runners (and
    other programs) share a machine, so fixed worker ids would collide. `UnityVectorEnv` itself
    moves on to the next port when this one (or, with several instances, one of the next few)
    was taken meanwhile.

    Args:
        spec: the environment.
        render_mode: see `envs.UnityVectorEnv`.

    Returns:
        The `UnityVectorEnv`.
    """
    return envs.UnityVectorEnv(
        file_name=spec.file_name, worker_id=free_worker_id(), seed=0, no_graphics=True,
        timeout_wait=spec.timeout_wait, time_scale=spec.time_scale,
        num_agents=spec.num_agents, max_steps=spec.max_steps, env_parameters=spec.parameters,
        instances=spec.instances, behavior_spec=spec.behavior_spec, render_mode=render_mode)


def free_worker_id() -> int:
    """A worker id whose port (mlagents-envs' base port + id) was free a moment ago.

    Returns:
        The id.

    Raises:
        RuntimeError: the OS gave a port at or below the base port.
    """
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    if port <= BASE_PORT:
        raise RuntimeError(f"the OS gave port {port}, below the base port {BASE_PORT}")
    return port - BASE_PORT


def _ray() -> Any:
    """The ray module when this process is connected to Ray, else None (never imports it)."""
    ray = sys.modules.get("ray")
    return ray if ray is not None and ray.is_initialized() else None


def node_id() -> str:
    """The Ray node this runs on.

    Returns:
        Its id; "local" outside Ray.
    """
    ray = _ray()
    return "local" if ray is None else ray.get_runtime_context().get_node_id()


def attempt() -> int:
    """Which try of the current task this is.

    Returns:
        1, or 1 + the retries Ray made of it (after an environment crash or after the runner's
            process died and Ray restarted it).
    """
    ray = _ray()
    if ray is None or ray.get_runtime_context().get_actor_id() is None:
        return 1
    return ray_internals.task_attempt_number() + 1
