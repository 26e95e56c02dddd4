"""A watch's work items on Ray runners (`RayExecutor`): the runners of `huggy evaluate`
(`deploy.evaluation.on_ray.RunnerPool`), started once and kept for the whole watch, across
checkpoints, with Ray's fault tolerance as there (a lost runner restarted, its batch retried; a
crashed environment reopened).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import ray

from deploy.evaluation.on_ray import RunnerPool, runner_placement
from deploy.evaluation.plan import EnvSpec, EvalConfig, PolicySpec, WorkItem
from deploy.evaluation.scheduling import EvaluationError
from deploy.watch.execution import Finished


class RayExecutor:
    """`config.runners` Ray runners on the connected cluster, each taking one batch at a time.

    Args:
        config: the items' settings and the runners' (`runners`, `accelerator`, `runner_cpus`,
            `precision`, `max_attempts`, `pin_nodes`).
        env: the runners' environment.

    Raises:
        EvaluationError: the cluster cannot hold the runners.
    """

    def __init__(self, config: EvalConfig, env: EnvSpec) -> None:
        self.batch_size = env.instances
        self._config = config
        placement = runner_placement(config.accelerator, config.runner_cpus, config.runners)
        self._pool = RunnerPool(config, env, placement, command="huggy watch")
        self._starting: dict[Any, str] = self._pool.start(config.runners)
        self._running: dict[Any, tuple[str, str, list[WorkItem], str]] = {}
        self._payloads: dict[str, list[Any]] = {}

    def free(self) -> int:
        """Runners ready and idle.

        Returns:
            How many.
        """
        return len(self._pool.idle())

    def busy(self) -> int:
        """Batches running.

        Returns:
            How many.
        """
        return len(self._running)

    def submit(self, key: str, spec: PolicySpec, items: list[WorkItem]) -> None:
        """Start a batch on an idle runner; a policy file travels once, through Ray's object store.

        Args:
            key: the policy's fingerprint.
            spec: the policy.
            items: 1 to `batch_size` of its items.
        """
        name = self._pool.idle()[0]
        payload = None
        if spec.path is not None:
            if key not in self._payloads:
                self._payloads[key] = [ray.put(Path(spec.path).read_bytes())]
            payload = self._payloads[key]
        ref = self._pool.submit(name, spec, payload, items, self._config.stochastic)
        self._running[ref] = (name, key, items, spec.label)

    def wait(self, timeout_s: float) -> list[Finished]:
        """The batches that came back (and runners that started meanwhile).

        Args:
            timeout_s: the longest wait for the first.

        Returns:
            What came back.

        Raises:
            EvaluationError: no runner is left (none started, or all were lost).
        """
        refs = [*self._running, *self._starting]
        if not refs:
            if not self._pool.actors:
                raise EvaluationError("no runner could be started")
            time.sleep(timeout_s)
            return []
        ready, _ = ray.wait(refs, num_returns=1, timeout=timeout_s)
        if ready:
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        done = []
        for ref in ready:
            if ref in self._starting:
                self._pool.started(ref, self._starting.pop(ref))
                continue
            name, key, items, label = self._running.pop(ref)
            results, error = self._pool.collect(ref, name, items, label)
            done.append(Finished(key, tuple(items), tuple(results or ()), error))
        return done

    def close(self) -> None:
        """Close the runners' environments and kill the runners."""
        self._pool.shutdown()
