"""Running the work items on Ray runners (`evaluate_on_ray`), with Ray's own fault tolerance.

A runner with K instances (`EnvSpec.instances`) takes up to K items of one policy at a time (a
batch, `plan.next_batch`), one per instance; with K = 1 a batch is one item.

What Ray does: a runner whose process dies is restarted (`max_restarts=-1`) and the batch it
was running is retried (`max_task_retries`); a batch whose environment crashed is retried on the
same runner (`retry_exceptions=[EnvironmentCrashed]`), which opens a fresh environment. Each
batch gets `max_attempts` tries in all, and the report counts the retries of every item in it
(Ray's task attempt number).

What stays here, by hand, and why: handing batches to idle runners (one at a time per runner,
so a policy that fails to load can have its remaining items withdrawn, which `ray.util.ActorPool`
cannot do), reporting a policy as failed when its batch failed every try, dropping a runner
that can no longer start, and Ctrl-C, which keeps what finished.
"""

from __future__ import annotations

import functools
import sys
import time
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import RayActorError, RayError, RayTaskError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from deploy.cluster import init_ray
from deploy.evaluation.plan import EnvSpec, EvalConfig, PolicySpec, WorkItem, next_batch
from deploy.evaluation.results import EvaluationResult, ItemResult, RunnerInfo
from deploy.evaluation.runner import EnvironmentCrashed, Runner
from deploy.evaluation.scheduling import (
    EvaluationError,
    ProgressCallback,
    Schedule,
    load_check,
    policy_results,
    progress_bar,
    refill,
)
from deploy.placement import ReplicaPlacement, plan_placement
from huggy_agent import PolicyLoadError


def runner_placement(accelerator: str, runner_cpus: float, runners: int) -> ReplicaPlacement:
    """Where the runners go on the connected cluster.

    Args:
        accelerator: one of `deploy.placement.ACCELERATORS`.
        runner_cpus: CPUs each runner holds.
        runners: how many.

    Returns:
        Each runner's placement.

    Raises:
        EvaluationError: the cluster cannot hold them (with its numbers).
        ValueError: an unknown accelerator, negative CPUs or no runner.
    """
    nodes = [node["Resources"] for node in ray.nodes() if node["Alive"]]
    try:
        return plan_placement(accelerator, runner_cpus, runners, nodes)
    except RuntimeError as error:  # worded for Serve replicas; a runner is one replica here
        raise EvaluationError(f"cannot start {runners} runners of {runner_cpus:g} CPU each: "
                              f"{error}") from error


@contextmanager
def ray_session(address: str | None = None) -> Iterator[None]:
    """Connect to Ray for the duration of the block, with token authentication unless
    `$RAY_AUTH_MODE` says otherwise (`deploy.cluster.init_ray`).

    Args:
        address: "auto", "HOST:PORT" or "ray://HOST:PORT": connect to that cluster and disconnect
            at the end. None: Ray's own default (`$RAY_ADDRESS`, else the latest cluster started
            with `ray start` on this machine, else a new local Ray for this machine alone, which is
            stopped at the end). Already connected (a test, a notebook): that connection is used
            and left open.

    Yields:
        None, once connected.

    Raises:
        RayTokenError: token auth is on and this process has no token, or the cluster refused it.
    """
    if ray.is_initialized():
        yield
        return
    if address is None:
        init_ray(None, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    else:
        init_ray(address, logging_level="ERROR", log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


def runner_options(placement: Any, max_attempts: int, node_id: str | None = None
                   ) -> dict[str, Any]:
    """Ray actor options for one runner: the accelerator as a Ray resource, exactly as for Serve
    replicas (`deploy.placement`: npu -> {"NPU": 1}, gpu -> num_gpus=1, cpu -> CPUs only),
    restarted whenever its process dies.

    Args:
        placement: what each runner holds.
        max_attempts: tries of each task in all.
        node_id: the node to pin it to (elsewhere if that node is gone); None spreads the runners.

    Returns:
        The options.
    """
    options: dict[str, Any] = {**placement.ray_actor_options(), "max_restarts": -1,
                               "max_task_retries": max_attempts - 1}
    options["scheduling_strategy"] = (
        NodeAffinitySchedulingStrategy(node_id, soft=True) if node_id else "SPREAD")
    return options


@functools.cache
def _remote_runner() -> Any:
    """`Runner` as a Ray actor class (made once, so its definition is exported once)."""
    return ray.remote(Runner)


class RunnerPool:
    """The driver's view of the runners: actor handles, their info, and the batch each runs.

    Args:
        config: the evaluation's settings.
        env: the runners' environment.
        placement: what each runner holds.
        command: the command that runs them, named in the messages printed about them.
    """

    def __init__(self, config: EvalConfig, env: EnvSpec, placement: Any,
                 command: str = "huggy evaluate") -> None:
        self.actors: dict[str, Any] = {}
        self.infos: dict[str, RunnerInfo] = {}
        self.busy: dict[str, list[WorkItem]] = {}
        self._config = config
        self._env = env
        self._placement = placement
        self._command = command

    def start(self, count: int) -> dict[Any, str]:
        """Start runners.

        Args:
            count: how many.

        Returns:
            {ObjectRef of each one's `info()`: its name}.
        """
        pins = self._config.pin_nodes
        starting = {}
        for slot in range(count):
            name = f"runner-{slot}"
            options = runner_options(self._placement, self._config.max_attempts,
                                     pins[slot % len(pins)] if pins else None)
            actor = _remote_runner().options(**options).remote(
                name, self._env, self._placement.device, self._config.precision)
            self.actors[name] = actor
            starting[actor.info.remote()] = name
        return starting

    def submit(self, name: str, spec: PolicySpec, payload: Any, batch: list[WorkItem],
               stochastic: bool) -> Any:
        """Run a batch on a runner; an environment crash is retried by Ray.

        Args:
            name: the runner.
            spec: the batch's policy.
            payload: the policy file's bytes as `Runner.run` takes them, or None.
            batch: items of one policy, one per instance.
            stochastic: sample actions rather than take the mean.

        Returns:
            The ObjectRef of the batch's results.
        """
        self.busy[name] = batch
        method = self.actors[name].run.options(retry_exceptions=[EnvironmentCrashed])
        return method.remote(spec, payload, batch, stochastic, self._config.keep_episodes)

    def idle(self) -> list[str]:
        """The ready runners with nothing to do, oldest first.

        Returns:
            Their names.
        """
        return [name for name in self.infos if name not in self.busy]

    def alive(self, name: str) -> bool:
        """Whether a runner still answers (Ray may have restarted it meanwhile).

        Args:
            name: the runner.

        Returns:
            False when it is dead or does not answer within two minutes.
        """
        try:
            ray.get(self.actors[name].info.remote(), timeout=120)
        except (RayActorError, ray.exceptions.GetTimeoutError):
            return False
        return True

    def started(self, ref: Any, name: str) -> RunnerInfo | None:
        """A runner's start, once its `info()` came back.

        Args:
            ref: the ObjectRef `start` gave for it.
            name: the runner.

        Returns:
            Its info, now among `infos`; None when it did not start (warned, and dropped).
        """
        try:
            info = ray.get(ref)
        except RayError as error:
            self.warn(f"runner {name} did not start: {_short(error)}")
            self.drop(name)
            return None
        self.infos[name] = info
        return info

    def collect(self, ref: Any, name: str, batch: list[WorkItem], label: str
                ) -> tuple[list[ItemResult] | None, str | None]:
        """A finished batch's results, or why its policy failed; the runner is free again.

        Args:
            ref: the batch's ObjectRef (`submit`).
            name: the runner that ran it.
            batch: its items.
            label: its policy's label, for warnings.

        Returns:
            (results, None); or (None, the error) when its policy could not be loaded, or the
                batch failed or lost its runner `max_attempts` times (a runner that is gone for
                good is then dropped).
        """
        self.busy.pop(name, None)
        tries = self._config.max_attempts
        which = _items_text(batch)
        try:
            results: list[ItemResult] = ray.get(ref)
        except RayTaskError as error:
            cause = error.cause
            if isinstance(cause, (PolicyLoadError, FileNotFoundError)):
                return None, f"{type(cause).__name__}: {cause}"
            return None, f"{which} failed {tries} times: {_short(error)}"
        except RayActorError as error:
            if not self.alive(name):
                self.warn(f"runner {name} is gone and could not be restarted")
                self.drop(name)
            return None, f"{which} lost its runner {tries} times: {_short(error)}"
        if results[0].attempts > 1:
            self.warn(f"{name} finished {which} of {label} at try {results[0].attempts}")
        return results, None

    def warn(self, message: str) -> None:
        """Print a warning on stderr, naming the command.

        Args:
            message: the warning.
        """
        print(f"{self._command}: {message}", file=sys.stderr)

    def drop(self, name: str) -> None:
        """Forget a runner and kill its actor (its environment goes with the process).

        Args:
            name: the runner.
        """
        actor = self.actors.pop(name, None)
        self.infos.pop(name, None)
        self.busy.pop(name, None)
        if actor is not None:
            ray.kill(actor, no_restart=True)

    def shutdown(self, timeout: float = 15.0) -> None:
        """Close idle runners' environments cleanly, then kill every actor.

        Args:
            timeout: seconds to wait for the environments to close.
        """
        closing = [self.actors[name].close.remote() for name in self.idle()]
        if closing:
            ray.wait(closing, num_returns=len(closing), timeout=timeout)
        for name in list(self.actors):
            self.drop(name)


def evaluate_on_ray(specs: Sequence[PolicySpec], config: EvalConfig, env: EnvSpec,
                    address: str | None = None,
                    on_result: ProgressCallback | None = None) -> EvaluationResult:
    """Run the items on `config.runners` Ray actors (faults: the module docstring).

    Args:
        specs: the policies.
        config: the evaluation's settings.
        env: the environment.
        address: the cluster, as `ray_session` takes it.
        on_result: called after each finished item, with the runner pool.

    Returns:
        The result, when every item finished or its policy failed; on Ctrl-C what finished
            (`interrupted=True`).

    Raises:
        ValueError: no policy, or labels that repeat.
        EvaluationError: the cluster cannot hold the runners, or none could be started.
        RayTokenError: token auth is on and this process has no token, or the cluster refused it.
    """
    started = time.perf_counter()
    outcome = EvaluationResult(policy_results(specs), config, env)
    with ray_session(address):
        placement = runner_placement(config.accelerator, config.runner_cpus, config.runners)
        pool = RunnerPool(config, env, placement)
        schedule = Schedule(outcome)
        try:
            _drive(pool, outcome, schedule, on_result, started)
        except KeyboardInterrupt:
            outcome.interrupted = True
        finally:
            pool.shutdown()
    schedule.finish()
    outcome.seconds = time.perf_counter() - started
    return outcome


def _drive(pool: RunnerPool, outcome: EvaluationResult, schedule: Schedule,
           on_result: ProgressCallback | None, started: float) -> None:
    """The scheduling loop: start the runners, check the policies while they boot, then hand
    items to idle runners and collect results; when every item is done, ask `schedule` for
    more (the selection's next round)."""
    config, policies = outcome.config, outcome.policies
    specs = [policy.spec for policy in policies]
    batches, planned = 0, deque(schedule.planned_first())
    while planned:
        next_batch(planned, outcome.env.instances)
        batches += 1
    starting = pool.start(min(config.runners, batches))
    load_check(policies)
    payloads = {i: [ray.put(Path(spec.path).read_bytes())] for i, spec in enumerate(specs)
                if spec.path is not None and not policies[i].failed}
    pending: deque[WorkItem] = deque(schedule.first())
    bar = progress_bar(config, sum(item.episodes for item in pending)
                        if schedule.selection is None else schedule.budget_episodes())
    running: dict[Any, tuple[str, list[WorkItem]]] = {}

    def fail_policy(index: int, message: str) -> None:
        policies[index].error = message
        skipped = [item for item in pending if item.policy_index == index]
        for item in skipped:
            pending.remove(item)
        bar.total -= sum(item.episodes for item in skipped)
        bar.refresh()

    try:
        while pending or running or refill(pending, schedule):
            for name in pool.idle():
                if not pending:
                    break
                batch = next_batch(pending, outcome.env.instances)
                index = batch[0].policy_index
                ref = pool.submit(name, specs[index], payloads.get(index), batch,
                                  config.stochastic)
                running[ref] = (name, batch)
            if not running and not starting:
                raise EvaluationError("no runner could be started")
            ready, _ = ray.wait([*running, *starting], num_returns=1)
            ref = ready[0]
            if ref in starting:
                info = pool.started(ref, starting.pop(ref))
                if info is not None:
                    outcome.runners.append(info)
                    if outcome.startup_seconds is None:
                        outcome.startup_seconds = time.perf_counter() - started
                continue
            name, batch = running.pop(ref)
            index = batch[0].policy_index
            results, error = pool.collect(ref, name, batch, specs[index].label)
            if error is not None:
                fail_policy(index, error)
                continue
            assert results is not None
            if policies[index].failed:
                continue
            for result in results:
                policies[index].items.append(result)
                bar.update(len(result.returns))
                if on_result is not None:
                    on_result(result, pool)
    finally:
        bar.close()


def _items_text(batch: list[WorkItem]) -> str:
    """"item 3", or "items 3, 4" for a batch of several."""
    if len(batch) == 1:
        return f"item {batch[0].index}"
    return "items " + ", ".join(str(item.index) for item in batch)


def _short(error: BaseException) -> str:
    cause = getattr(error, "cause", None) or error
    text = str(cause).strip().splitlines()
    return f"{type(cause).__name__}: {text[-1].rstrip('.') if text else ''}"

