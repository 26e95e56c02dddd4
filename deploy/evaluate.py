"""Batch evaluation of Huggy policies: work items with fixed seeds, run by long-lived Ray runners.

A policy's episodes are cut into work items; item `i` of every policy gets the seed
`seed + i` and is run as `rollout(agent, env, episodes, seed)`, which first resets the
environment with that seed, so its numbers depend only on (policy, i), never on which runner ran
it or how many runners there were.

Two executors run the same items with the same `Runner` code:
- `evaluate_plain`: one process, one environment, items in order (the reference and the baseline);
- `evaluate_on_ray`: K Ray actors, each owning one environment (its own worker id, so its own port)
  and a local copy of each policy (or a `RemoteAgent` for a Serve URL). A runner whose environment
  crashes or whose actor dies is replaced by a fresh actor and its unfinished item runs again; a
  policy that fails to load is reported failed; Ctrl-C stops the runners and keeps what finished.

Ray is imported only inside the functions that need it.
"""

from __future__ import annotations

import functools
import importlib
import math
import os
import socket
import sys
import tempfile
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from deploy.placement import ACCELERATORS

ENV_SEED_LIMIT = 2**24
"""Environment seeds travel as float32 (`envs.vector_env.MAX_SEED`): [0, 2**24)."""
BASE_PORT = 5005
"""mlagents-envs' base port for an executable: an environment listens on base + worker id."""


class EvaluationError(RuntimeError):
    """An evaluation could not run at all (as opposed to one policy failing, which is reported)."""


class EnvironmentCrashed(RuntimeError):
    """A runner's environment died mid-item; the item must run again on a fresh runner."""


@dataclass(frozen=True)
class PolicySpec:
    """One policy to evaluate: a checkpoint or ONNX file, or a Serve deployment's URL."""

    label: str
    """Name shown in the report (unique within one evaluation)."""
    path: str | None = None
    """The policy file (.pt or .onnx); None for a remote policy."""
    url: str | None = None
    """The Serve deployment's URL when runners query it instead of a local copy."""
    run: str | None = None
    """The results folder (run id) the checkpoint came from, for the learning curve."""
    step: int | None = None
    """The training step of the checkpoint, when known."""


@dataclass(frozen=True)
class EnvSpec:
    """How each runner opens its environment (see `envs.HuggyVectorEnv`)."""

    file_name: str | None = None
    """A Unity build; None for the built-in stand-in."""
    num_agents: int | None = None
    """Agents per environment (stand-in parameter); None keeps the scene's own (18)."""
    max_steps: int | None = None
    """Decisions per episode before truncation (stand-in parameter); None keeps the scene's."""
    time_scale: float = 20.0
    timeout_wait: int = 60


@dataclass(frozen=True)
class EvalConfig:
    """What to run and how."""

    episodes: int = 36
    """Episodes per policy."""
    episodes_per_item: int = 18
    """Episodes per work item (the stand-in runs 18 agents at once, so 18 fills one reset)."""
    seed: int = 0
    """Item i of every policy is run with seed `seed + i`."""
    stochastic: bool = False
    """Sample actions (noise seeded per step from the item seed) instead of the mean action."""
    runners: int = 1
    """Ray actors running items in parallel (ignored by `evaluate_plain`)."""
    accelerator: str = "auto"
    """Ray resource each runner holds: auto (what the cluster has: npu, then gpu, else cpu),
    cpu, gpu (`num_gpus=1`) or npu (`{"NPU": 1}`)."""
    precision: str = "fp32"
    """Precision of each runner's policy copy (fp32, fp16, bf16)."""
    runner_cpus: float = 1.0
    """CPUs each runner reserves (its environment process runs beside it)."""
    max_attempts: int = 3
    """Tries per item before its policy is reported failed."""
    pin_nodes: tuple[str, ...] = ()
    """Node ids to pin runners to, round robin (runner k on `pin_nodes[k % len]`); empty lets Ray
    spread them."""
    progress: bool = True
    """Show a tqdm progress bar on stderr."""

    def __post_init__(self) -> None:
        for name in ("episodes", "episodes_per_item", "runners", "max_attempts"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.accelerator not in ACCELERATORS:
            raise ValueError(
                f"accelerator must be one of {', '.join(ACCELERATORS)}, got {self.accelerator!r}"
            )
        last_seed = self.seed + math.ceil(self.episodes / self.episodes_per_item) - 1
        if self.seed < 0 or last_seed >= ENV_SEED_LIMIT:
            raise ValueError(f"seed must be >= 0 and seed + items - 1 < 2**24 (the environment's "
                             f"seed range), got seed {self.seed} (last item's seed {last_seed})")
        if self.runner_cpus < 0:
            raise ValueError(f"runner_cpus must be >= 0, got {self.runner_cpus!r}")


@dataclass(frozen=True)
class WorkItem:
    """Item `index` of policy `policy_index`: `episodes` episodes from `env.reset(seed)`."""

    policy_index: int
    index: int
    seed: int
    episodes: int


@dataclass(frozen=True)
class ItemResult:
    """The episodes of one work item, in the order they finished, and where they ran."""

    policy_index: int
    index: int
    seed: int
    returns: tuple[float, ...]
    lengths: tuple[int, ...]
    reached_stick: tuple[bool, ...]
    agent_steps: int
    seconds: float
    node_id: str
    runner: str
    attempts: int = 1


@dataclass(frozen=True)
class RunnerInfo:
    """A started runner: its name, node, process id and its environment process id."""

    name: str
    node_id: str
    pid: int
    env_pid: int | None


@dataclass
class PolicyResult:
    """Everything evaluated for one policy; `error` is set when it failed (load or items)."""

    spec: PolicySpec
    items: list[ItemResult] = field(default_factory=list)
    error: str | None = None
    fingerprint: str | None = None

    @property
    def failed(self) -> bool:
        return self.error is not None

    def ordered_items(self) -> list[ItemResult]:
        """Items by index, so statistics never depend on completion order."""
        return sorted(self.items, key=lambda item: item.index)


@dataclass
class EvaluationResult:
    """The outcome of one evaluation."""

    policies: list[PolicyResult]
    config: EvalConfig
    env: EnvSpec
    runners: list[RunnerInfo] = field(default_factory=list)
    interrupted: bool = False
    seconds: float = 0.0
    """Wall time of the whole evaluation."""
    startup_seconds: float | None = None
    """Wall time until the first runner was ready for items (None if none ever was)."""

    @property
    def retries(self) -> int:
        """Item runs beyond the first: one per crashed environment or lost runner."""
        return sum(item.attempts - 1 for policy in self.policies for item in policy.items)

    def node_episodes(self) -> dict[str, int]:
        """Episodes run on each node id."""
        counts: dict[str, int] = {}
        for policy in self.policies:
            for item in policy.items:
                counts[item.node_id] = counts.get(item.node_id, 0) + len(item.returns)
        return counts


# --- What to evaluate ---------------------------------------------------------------------------


def expand_policies(sources: Sequence[str | os.PathLike[str]]) -> list[PolicySpec]:
    """One spec per policy: a file stays one policy; a results folder gives every checkpoint
    in it that is on disk, by step (`huggy_agent.formats.results.list_checkpoints`).

    Raises FileNotFoundError for a path that does not exist and ValueError for an empty list or a
    folder without checkpoint files. Files that exist but cannot be loaded are not checked here.
    """
    from huggy_agent.formats.loaded import step_from_filename
    from huggy_agent.formats.results import list_checkpoints

    if not sources:
        raise ValueError("expected at least one policy (a .pt, an .onnx or a results folder)")
    specs: list[PolicySpec] = []
    for source in sources:
        path = Path(source)
        if path.is_dir():
            run = path.resolve().name
            entries = [entry for entry in list_checkpoints(path) if entry.path is not None]
            if not entries:
                raise ValueError(f"no checkpoint files found in results folder {path}")
            behaviors = {entry.behavior for entry in entries}
            for entry in entries:
                name = run if len(behaviors) == 1 else f"{run}/{entry.behavior}"
                specs.append(PolicySpec(label=f"{name}@{entry.step}", path=str(entry.path),
                                        run=name, step=entry.step))
        elif path.is_file():
            specs.append(PolicySpec(label=str(source), path=str(path),
                                    step=step_from_filename(path)))
        else:
            raise FileNotFoundError(f"policy not found: {path} (expected a .pt, an .onnx or a "
                                    "results folder)")
    return _unique_labels(specs)


def _unique_labels(specs: list[PolicySpec]) -> list[PolicySpec]:
    seen: dict[str, int] = {}
    unique = []
    for spec in specs:
        count = seen.get(spec.label, 0)
        seen[spec.label] = count + 1
        unique.append(spec if count == 0 else replace(spec, label=f"{spec.label}#{count + 1}"))
    return unique


def plan_items(num_policies: int, config: EvalConfig) -> list[WorkItem]:
    """The work items, policy by policy: `ceil(episodes / episodes_per_item)` each, the last one
    shorter when the split is uneven; item i of every policy has seed `config.seed + i`."""
    items = []
    for policy_index in range(num_policies):
        left, index = config.episodes, 0
        while left > 0:
            count = min(config.episodes_per_item, left)
            items.append(WorkItem(policy_index, index, config.seed + index, count))
            left -= count
            index += 1
    return items


# --- The runner: one environment, local policy copies, one item at a time ------------------------


class Runner:
    """Owns one environment and runs work items on it, one at a time.

    Used in-process by `evaluate_plain` and as a Ray actor by `evaluate_on_ray`. Policies are
    loaded on first use (from the path, or from bytes the driver shipped) and the two most recent
    are kept.
    """

    def __init__(self, name: str, env: EnvSpec, device: str = "cpu",
                 precision: str = "fp32") -> None:
        import envs

        self._name = name
        self._device = device
        self._precision = precision
        self._agents: OrderedDict[str, Any] = OrderedDict()
        # Import torch (~1 s) while the environment process boots, so a runner reports ready
        # only when it can run items at once.
        importer = threading.Thread(target=importlib.import_module, args=("huggy_agent",))
        importer.start()
        try:
            self._env = _open_env(envs, env)
        finally:
            importer.join()

    def info(self) -> RunnerInfo:
        """Name, node id ("local" outside Ray), process id and environment process id."""
        return RunnerInfo(self._name, _node_id(), os.getpid(), _env_pid(self._env))

    def run(self, spec: PolicySpec, payload: list[Any] | bytes | None, item: WorkItem,
            stochastic: bool) -> ItemResult:
        """Run one item. `payload` is None (load `spec.path`), the file's bytes, or a one-element
        list holding an ObjectRef of them (resolved only when the policy is not cached).

        Raises PolicyLoadError or FileNotFoundError when the policy cannot be loaded, and
        EnvironmentCrashed when the environment dies mid-rollout.
        """
        import envs

        agent = self._agent(spec, payload)
        try:  # rollout resets the environment with the item's seed first
            result = envs.rollout(agent, self._env, episodes=item.episodes,
                                  deterministic=not stochastic, seed=item.seed)
        except envs.RolloutInterrupted as error:
            raise EnvironmentCrashed(
                f"runner {self._name}: environment died during item {item.index} of "
                f"{spec.label}: {error}") from None
        episodes = result.episodes[:item.episodes]
        return ItemResult(
            policy_index=item.policy_index, index=item.index, seed=item.seed,
            returns=tuple(float(e.episode_return) for e in episodes),
            lengths=tuple(int(e.length) for e in episodes),
            reached_stick=tuple(bool(e.reached_stick) for e in episodes),
            agent_steps=int(result.agent_steps), seconds=float(result.seconds),
            node_id=_node_id(), runner=self._name)

    def close(self) -> None:
        """Close the environment (stops its process)."""
        self._env.close()

    def _agent(self, spec: PolicySpec, payload: list[Any] | bytes | None) -> Any:
        key = spec.url or spec.label
        if key in self._agents:
            self._agents.move_to_end(key)
            return self._agents[key]
        if spec.url is not None:
            from deploy.client import RemoteAgent

            agent = RemoteAgent(spec.url)
        else:
            agent = _load_agent(spec, payload, self._device, self._precision)
        self._agents[key] = agent
        while len(self._agents) > 2:
            self._agents.popitem(last=False)
        return agent


def _load_agent(spec: PolicySpec, payload: list[Any] | bytes | None, device: str,
                precision: str) -> Any:
    from huggy_agent import HuggyAgent

    assert spec.path is not None
    if payload is None:
        return HuggyAgent.from_checkpoint(spec.path, device=device, precision=precision)
    if isinstance(payload, list):
        import ray

        payload = ray.get(payload[0])
    # The file travels as bytes so runners on other machines need no shared file system.
    with tempfile.TemporaryDirectory(prefix="huggy-eval-") as folder:
        local = Path(folder) / Path(spec.path).name
        local.write_bytes(payload)
        return HuggyAgent.from_checkpoint(local, device=device, precision=precision)


def _open_env(envs: Any, spec: EnvSpec) -> Any:
    """Open the environment on a worker id whose port was free a moment ago: several runners
    (and other programs) share a machine, so fixed worker ids would collide. `HuggyVectorEnv`
    itself moves on to the next port when this one was taken meanwhile."""
    return envs.HuggyVectorEnv(
        file_name=spec.file_name, worker_id=_free_port() - BASE_PORT, seed=0, no_graphics=True,
        timeout_wait=spec.timeout_wait, time_scale=spec.time_scale,
        num_agents=spec.num_agents, max_steps=spec.max_steps)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    if port <= BASE_PORT:
        raise EvaluationError(f"the OS gave port {port}, below the base port {BASE_PORT}")
    return port


def _env_pid(env: Any) -> int | None:
    """The environment's process id (None when connected to an editor)."""
    return env.process_id


def _node_id() -> str:
    ray = sys.modules.get("ray")  # never import Ray just to learn that it is not running
    if ray is None or not ray.is_initialized():
        return "local"
    return ray.get_runtime_context().get_node_id()


# --- Executors ------------------------------------------------------------------------------------

ProgressCallback = Callable[[ItemResult, "RunnerPool | None"], None]
"""Called in the driver after each finished item (with the pool on Ray, None in the plain loop)."""


def _policy_results(specs: Sequence[PolicySpec]) -> list[PolicyResult]:
    """Empty results, one per spec, after checking the specs (cheap: nothing is loaded)."""
    if not specs:
        raise ValueError("expected at least one policy to evaluate")
    labels = [spec.label for spec in specs]
    if len(set(labels)) != len(labels):
        raise ValueError(f"policy labels must be unique, got {labels}")
    return [PolicyResult(spec) for spec in specs]


def _load_check(policies: list[PolicyResult]) -> None:
    """Load every local policy once in the driver (on the CPU), or ask a served one for its
    description: its fingerprint for the report, or its error, so a broken file or an
    unreachable server is reported without occupying a runner."""
    from huggy_agent import HuggyAgent, PolicyLoadError

    for policy in policies:
        try:
            if policy.spec.url is not None:
                from deploy.client import RemoteAgent, RemoteRequestError, RemoteServerError

                try:
                    with RemoteAgent(policy.spec.url) as remote:
                        policy.fingerprint = remote.fingerprint
                except (RemoteServerError, RemoteRequestError) as error:
                    raise PolicyLoadError(str(error)) from error
            elif policy.spec.path is not None:
                policy.fingerprint = HuggyAgent.from_checkpoint(policy.spec.path,
                                                                device="cpu").fingerprint
        except (PolicyLoadError, FileNotFoundError) as error:
            policy.error = f"{type(error).__name__}: {error}"


def _progress_bar(config: EvalConfig, total_episodes: int) -> Any:
    from tqdm import tqdm

    return tqdm(total=total_episodes, unit="ep", desc="evaluate", disable=not config.progress,
                file=sys.stderr, dynamic_ncols=True)


def evaluate_plain(specs: Sequence[PolicySpec], config: EvalConfig, env: EnvSpec,
                   on_result: ProgressCallback | None = None) -> EvaluationResult:
    """Run every item in this process on one environment, in order: no Ray.

    The reference for `evaluate_on_ray` (same items, same seeds, same numbers) and the baseline of
    the benchmark. Policies always run on the CPU here (`config.accelerator` is ignored), with
    one torch thread while it runs, as in a one-CPU Ray runner: an 18-row forward pass gains
    nothing from more, and extra threads spin against the environment process (2.5x slower on
    2 cores).
    """
    import torch

    from huggy_agent import PolicyLoadError

    started = time.perf_counter()
    outcome = EvaluationResult(_policy_results(specs), config, env)
    _load_check(outcome.policies)
    items = [item for item in plan_items(len(specs), config)
             if not outcome.policies[item.policy_index].failed]
    bar = _progress_bar(config, sum(item.episodes for item in items))
    runner = Runner("plain", env, device="cpu", precision=config.precision)
    outcome.startup_seconds = time.perf_counter() - started
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        outcome.runners.append(runner.info())
        for item in items:
            policy = outcome.policies[item.policy_index]
            if policy.failed:
                continue
            try:
                result = runner.run(policy.spec, None, item, config.stochastic)
            except (PolicyLoadError, FileNotFoundError) as error:
                policy.error = f"{type(error).__name__}: {error}"
                continue
            policy.items.append(result)
            bar.update(len(result.returns))
            if on_result is not None:
                on_result(result, None)
    except KeyboardInterrupt:
        outcome.interrupted = True
    finally:
        torch.set_num_threads(threads)
        bar.close()
        runner.close()
    outcome.seconds = time.perf_counter() - started
    return outcome


@contextmanager
def ray_session(address: str | None = None) -> Iterator[None]:
    """Connect to Ray for the duration of the block.

    Already connected (a test, a notebook): use that connection and leave it open. `address`
    given ("auto", "HOST:PORT" or "ray://HOST:PORT"): connect to that cluster and disconnect at
    the end. None: Ray's own default (`$RAY_ADDRESS`, else the latest cluster started with
    `ray start` on this machine, else a new local Ray, which is stopped at the end); token auth
    and usage stats are off unless the environment says otherwise.
    """
    import ray

    if ray.is_initialized():
        yield
        return
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if address is None:
        ray.init(include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    else:
        ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


def runner_options(placement: Any, node_id: str | None = None,
                   soft: bool = False) -> dict[str, Any]:
    """Ray actor options for one runner: the accelerator as a Ray resource, exactly as for Serve
    replicas (`deploy.placement`: npu -> {"NPU": 1}, gpu -> num_gpus=1, cpu -> CPUs only),
    pinned to `node_id` when given (`soft`: elsewhere if that node cannot), else spread."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    options: dict[str, Any] = {**placement.ray_actor_options(), "max_restarts": 0,
                               "max_task_retries": 0}
    options["scheduling_strategy"] = (
        NodeAffinitySchedulingStrategy(node_id, soft=soft) if node_id else "SPREAD")
    return options


@functools.cache
def _remote_runner() -> Any:
    """`Runner` as a Ray actor class (made once, so its definition is exported once)."""
    import ray

    return ray.remote(Runner)


class RunnerPool:
    """The driver's view of the runners: actor handles, their info, and what each is running."""

    def __init__(self, config: EvalConfig, env: EnvSpec, placement: Any) -> None:
        self.actors: dict[str, Any] = {}
        self.infos: dict[str, RunnerInfo] = {}
        self.busy: dict[str, WorkItem] = {}
        self.started: list[RunnerInfo] = []
        self._config = config
        self._env = env
        self._placement = placement
        self._slots: dict[str, int] = {}
        self._count = 0

    def start(self, slot: int, replacement: bool = False) -> tuple[str, Any]:
        """Start a runner for `slot`; returns its name and the ObjectRef of its `info()`."""
        name = f"runner-{self._count}"
        self._count += 1
        pins = self._config.pin_nodes
        options = runner_options(self._placement, pins[slot % len(pins)] if pins else None,
                                 soft=replacement)
        actor = _remote_runner().options(**options).remote(
            name, self._env, self._placement.device, self._config.precision)
        self.actors[name] = actor
        self._slots[name] = slot
        return name, actor.info.remote()

    def slot(self, name: str) -> int:
        return self._slots[name]

    def idle(self) -> list[str]:
        """Ready runners with nothing to do, oldest first."""
        return [name for name in self.infos if name not in self.busy]

    def drop(self, name: str) -> None:
        """Forget a runner and kill its actor (its environment goes with the process)."""
        import ray

        actor = self.actors.pop(name, None)
        self.infos.pop(name, None)
        self.busy.pop(name, None)
        if actor is not None:
            ray.kill(actor, no_restart=True)

    def shutdown(self, timeout: float = 15.0) -> None:
        """Close idle runners' environments cleanly, then kill every actor."""
        import ray

        closing = [self.actors[name].close.remote() for name in self.idle()]
        if closing:
            ray.wait(closing, num_returns=len(closing), timeout=timeout)
        for name in list(self.actors):
            self.drop(name)


def evaluate_on_ray(specs: Sequence[PolicySpec], config: EvalConfig, env: EnvSpec,
                    address: str | None = None,
                    on_result: ProgressCallback | None = None) -> EvaluationResult:
    """Run the items on `config.runners` Ray actors (see the module docstring for faults).

    Connects through `ray_session(address)`. Returns when every item finished or its policy
    failed, or on Ctrl-C with what finished (`interrupted=True`).
    """
    import ray

    from deploy.placement import plan_placement

    started = time.perf_counter()
    outcome = EvaluationResult(_policy_results(specs), config, env)
    with ray_session(address):
        nodes = [node["Resources"] for node in ray.nodes() if node["Alive"]]
        try:
            placement = plan_placement(config.accelerator, config.runner_cpus, config.runners,
                                       nodes)
        except RuntimeError as error:  # worded for Serve replicas; a runner is one replica here
            raise EvaluationError(f"cannot start {config.runners} runners of "
                                  f"{config.runner_cpus:g} CPU each: {error}") from error
        pool = RunnerPool(config, env, placement)
        try:
            _drive(pool, outcome, on_result, started)
        except KeyboardInterrupt:
            outcome.interrupted = True
        finally:
            outcome.runners = list(pool.started)
            pool.shutdown()
    outcome.seconds = time.perf_counter() - started
    return outcome


def _drive(pool: RunnerPool, outcome: EvaluationResult, on_result: ProgressCallback | None,
           started: float) -> None:
    """The scheduling loop: start the runners, check the policies while they boot, then hand
    items to idle runners, collect results and replace lost runners."""
    import ray
    from ray.exceptions import RayError, RayTaskError

    from huggy_agent import PolicyLoadError

    config, policies = outcome.config, outcome.policies
    specs = [policy.spec for policy in policies]
    starting: dict[Any, str] = {}
    for slot in range(min(config.runners, len(plan_items(len(policies), config)))):
        name, ref = pool.start(slot)
        starting[ref] = name
    _load_check(policies)
    payloads = {i: [ray.put(Path(spec.path).read_bytes())] for i, spec in enumerate(specs)
                if spec.path is not None and not policies[i].failed}
    pending: deque[tuple[WorkItem, int]] = deque(
        (item, 1) for item in plan_items(len(policies), config)
        if not policies[item.policy_index].failed)
    bar = _progress_bar(config, sum(item.episodes for item, _ in pending))
    running: dict[Any, tuple[str, WorkItem, int]] = {}
    restarts_left = config.max_attempts * config.runners

    def fail_policy(index: int, message: str) -> None:
        policies[index].error = message
        skipped = [entry for entry in pending if entry[0].policy_index == index]
        for entry in skipped:
            pending.remove(entry)
        bar.total -= sum(entry[0].episodes for entry in skipped)
        bar.refresh()

    def replace_runner(name: str) -> None:
        nonlocal restarts_left
        slot = pool.slot(name)
        pool.drop(name)
        if restarts_left <= 0:
            raise EvaluationError("runners kept failing; giving up after "
                                  f"{config.max_attempts * config.runners} replacements")
        restarts_left -= 1
        new_name, ref = pool.start(slot, replacement=True)
        starting[ref] = new_name

    def retry(item: WorkItem, attempt: int, why: str) -> None:
        if attempt >= config.max_attempts:
            fail_policy(item.policy_index, f"item {item.index} failed {attempt} times: {why}")
        else:
            pending.appendleft((item, attempt + 1))

    try:
        while pending or running:
            for name in pool.idle():
                if not pending:
                    break
                item, attempt = pending.popleft()
                spec = specs[item.policy_index]
                ref = pool.actors[name].run.remote(
                    spec, payloads.get(item.policy_index), item, config.stochastic)
                pool.busy[name] = item
                running[ref] = (name, item, attempt)
            if not running and not starting:
                raise EvaluationError("no runner could be started")
            ready, _ = ray.wait([*running, *starting], num_returns=1)
            ref = ready[0]
            if ref in starting:
                name = starting.pop(ref)
                try:
                    info = ray.get(ref)
                except RayError as error:
                    if name in pool.actors:
                        _warn(f"runner {name} did not start: {_short(error)}")
                        replace_runner(name)
                    continue
                pool.infos[name] = info
                pool.started.append(info)
                if outcome.startup_seconds is None:
                    outcome.startup_seconds = time.perf_counter() - started
                continue
            name, item, attempt = running.pop(ref)
            pool.busy.pop(name, None)
            try:
                result = ray.get(ref)
            except RayTaskError as error:
                cause = error.cause
                if isinstance(cause, (PolicyLoadError, FileNotFoundError)):
                    fail_policy(item.policy_index, f"{type(cause).__name__}: {cause}")
                    continue
                _warn(f"{name} lost item {item.index} of {specs[item.policy_index].label}"
                      f": {_short(error)}; running it again on a fresh runner")
                retry(item, attempt, _short(error))
                replace_runner(name)
                continue
            except RayError as error:
                _warn(f"{name} died during item {item.index} of "
                      f"{specs[item.policy_index].label}; running it again on a fresh "
                      "runner")
                retry(item, attempt, _short(error))
                if name in pool.actors:
                    replace_runner(name)
                continue
            if policies[item.policy_index].failed:
                continue
            result = replace(result, attempts=attempt)
            policies[item.policy_index].items.append(result)
            bar.update(len(result.returns))
            if on_result is not None:
                on_result(result, pool)
    finally:
        bar.close()


def _short(error: BaseException) -> str:
    cause = getattr(error, "cause", None) or error
    text = str(cause).strip().splitlines()
    return f"{type(cause).__name__}: {text[-1].rstrip('.') if text else ''}"


def _warn(message: str) -> None:
    print(f"huggy evaluate: {message}", file=sys.stderr)
