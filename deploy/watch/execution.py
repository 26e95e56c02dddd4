"""Where a watch's work items run: the contract the watch loop drives (`Executor`), and the plain
one, in this process on one environment (`PlainExecutor`, `--no-ray`); the Ray runners are
`deploy.watch.on_ray`.

Items are those of `huggy evaluate` (`deploy.evaluation.plan.WorkItem`: item i of a policy seeded
`seed + i`) run by its runner (`deploy.evaluation.runner.Runner`), so a watch's episodes are the
ones an evaluation of the same policy with the same seed would count.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

import torch

from deploy.evaluation.plan import EnvSpec, EvalConfig, PolicySpec, WorkItem
from deploy.evaluation.results import ItemResult
from deploy.evaluation.runner import EnvironmentCrashed, Runner
from huggy_agent import PolicyLoadError


@dataclass(frozen=True)
class Finished:
    """A batch of items that came back: its results, or why its policy failed."""

    key: str
    """The policy's fingerprint, as the batch was submitted."""
    items: tuple[WorkItem, ...]
    results: tuple[ItemResult, ...] = ()
    error: str | None = None


class Executor(Protocol):
    """What the watch loop needs of a place that runs items."""

    batch_size: int
    """Items of one policy a runner takes at once (its Unity instances)."""

    def free(self) -> int:
        """How many batches may be submitted now.

        Returns:
            The count, >= 0.
        """
        ...

    def submit(self, key: str, spec: PolicySpec, items: list[WorkItem]) -> None:
        """Start a batch of one policy's items.

        Args:
            key: the policy's key, given back with the batch's results.
            spec: the policy.
            items: 1 to `batch_size` of its work items.
        """
        ...

    def wait(self, timeout_s: float) -> list[Finished]:
        """The batches that came back.

        Args:
            timeout_s: the longest wait for the first one, seconds.

        Returns:
            Every batch finished by then (none after the timeout).
        """
        ...

    def busy(self) -> int:
        """How many batches are running.

        Returns:
            The count, >= 0.
        """
        ...

    def close(self) -> None:
        """Stop the runners and their environments."""
        ...


class NoItems:
    """The executor of a team scene's watch, whose matches run elsewhere
    (`deploy.watch.teams.PoolRating`): it runs no item."""

    batch_size = 1

    def free(self) -> int:
        """No batch may be submitted.

        Returns:
            0.
        """
        return 0

    def submit(self, key: str, spec: PolicySpec, items: list[WorkItem]) -> None:
        """Refuse a batch.

        Args:
            key: the policy's fingerprint.
            spec: the policy.
            items: its items.

        Raises:
            RuntimeError: always; a team scene runs matches, not items.
        """
        raise RuntimeError(f"a team scene's watch runs no work items, got {len(items)} of "
                           f"{spec.label!r}")

    def wait(self, timeout_s: float) -> list[Finished]:
        """A pause: nothing comes back.

        Args:
            timeout_s: how long to pause.

        Returns:
            [].
        """
        time.sleep(timeout_s)
        return []

    def busy(self) -> int:
        """Nothing runs.

        Returns:
            0.
        """
        return 0

    def close(self) -> None:
        """Nothing to stop."""


class PlainExecutor:
    """Items in this process, one batch at a time on one environment, with one torch thread while
    it runs (as `deploy.evaluation.scheduling.evaluate_plain`). A batch runs when submitted; its
    results wait for the next `wait`. An environment that dies is opened again and the batch run
    again, `config.max_attempts` tries in all.

    Args:
        config: the items' settings (`stochastic`, `precision`, `max_attempts`).
        env: the environment (opened here).
    """

    def __init__(self, config: EvalConfig, env: EnvSpec) -> None:
        self.batch_size = env.instances
        self._config = config
        self._runner = Runner("plain", env, device="cpu", precision=config.precision)
        self._done: list[Finished] = []

    def free(self) -> int:
        """One batch may be submitted once the last one was collected.

        Returns:
            1 or 0.
        """
        return 0 if self._done else 1

    def busy(self) -> int:
        """Nothing runs between calls.

        Returns:
            0.
        """
        return 0

    def submit(self, key: str, spec: PolicySpec, items: list[WorkItem]) -> None:
        """Run a batch now.

        Args:
            key: the policy's fingerprint.
            spec: the policy.
            items: 1 to `batch_size` of its items.
        """
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            for attempt in range(1, self._config.max_attempts + 1):
                try:
                    results = self._runner.run(spec, None, items, self._config.stochastic)
                except (PolicyLoadError, FileNotFoundError) as error:
                    self._done.append(Finished(key, tuple(items),
                                               error=f"{type(error).__name__}: {error}"))
                    return
                except EnvironmentCrashed as error:
                    if attempt == self._config.max_attempts:
                        self._done.append(Finished(key, tuple(items), error=str(error)))
                        return
                    continue
                self._done.append(Finished(key, tuple(items), tuple(results)))
                return
        finally:
            torch.set_num_threads(threads)

    def wait(self, timeout_s: float) -> list[Finished]:
        """The batch run last, else a pause.

        Args:
            timeout_s: how long to pause when there is none.

        Returns:
            What came back.
        """
        if not self._done:
            time.sleep(timeout_s)
        done, self._done = self._done, []
        return done

    def close(self) -> None:
        """Close the environment."""
        self._runner.close()
