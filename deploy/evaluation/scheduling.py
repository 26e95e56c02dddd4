"""Running the work items: which items run (`Schedule`: the uniform plan, or the adaptive
selection's rounds) and the plain loop in this process (`evaluate_plain`); the Ray runners are
`deploy.evaluation.on_ray`.

The plain loop is the reference for the Ray runners: the same items, the same seeds, the same
numbers; with K instances (`EnvSpec.instances`) it runs up to K items of one policy at once (a
batch, `plan.next_batch`), one per instance.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import torch
from tqdm import tqdm

from deploy.evaluation.plan import EnvSpec, EvalConfig, PolicySpec, WorkItem, next_batch, plan_items
from deploy.evaluation.results import EvaluationResult, ItemResult, PolicyResult
from deploy.evaluation.runner import Runner
from deploy.evaluation.selection import Selection
from huggy_agent import HuggyAgent, PolicyLoadError
from huggy_agent_client.remote import RemoteRequestError, RemoteServerError


class EvaluationError(RuntimeError):
    """An evaluation could not run at all (as opposed to one policy failing, which is reported)."""


ProgressCallback = Callable[[ItemResult, Any], None]
"""Called in the driver after each finished item (with the runner pool on Ray, None in the
plain loop)."""


def policy_results(specs: Sequence[PolicySpec]) -> list[PolicyResult]:
    """Empty results, one per spec, after checking the specs (cheap: nothing is loaded).

    Args:
        specs: the policies.

    Returns:
        One empty result per spec, in order.

    Raises:
        ValueError: no spec, or labels that repeat.
    """
    if not specs:
        raise ValueError("expected at least one policy to evaluate")
    labels = [spec.label for spec in specs]
    if len(set(labels)) != len(labels):
        raise ValueError(f"policy labels must be unique, got {labels}")
    return [PolicyResult(spec) for spec in specs]


def load_check(policies: list[PolicyResult]) -> None:
    """Load every local policy once in the driver (on the CPU), or ask a served one for its
    description: its fingerprint for the report, or its error, so a broken file or an unreachable
    server is reported without occupying a runner.

    Args:
        policies: the results to fill in (`fingerprint`, or `error`).
    """
    for policy in policies:
        try:
            if policy.spec.url is not None:
                try:
                    with policy.spec.remote_agent() as remote:
                        policy.fingerprint = remote.fingerprint
                except (RemoteServerError, RemoteRequestError) as error:
                    raise PolicyLoadError(str(error)) from error
            elif policy.spec.path is not None:
                policy.fingerprint = HuggyAgent.from_checkpoint(policy.spec.path,
                                                                device="cpu").fingerprint
        except (PolicyLoadError, FileNotFoundError) as error:
            policy.error = f"{type(error).__name__}: {error}"


class Schedule:
    """Which items run: the uniform plan (every item up front), or rounds of the adaptive selection
    (`config.selection`), the next round asked for when the last one is done.

    Args:
        outcome: the evaluation's result, filled in as items finish.

    Raises:
        ValueError: the selection's budget does not fit one round.
    """

    def __init__(self, outcome: EvaluationResult) -> None:
        self._outcome = outcome
        count = len(outcome.policies)
        self.selection = (None if outcome.config.selection is None
                          else Selection(count, outcome.config))

    def planned_first(self) -> list[WorkItem]:
        """The items to start with were every policy loadable (to size the runners while the policies
        are checked).

        Returns:
            The uniform plan, or every policy's share of the first round.
        """
        config = self._outcome.config
        if self.selection is None:
            return plan_items(len(self._outcome.policies), config)
        assert config.selection is not None
        return [WorkItem(index, number, config.seed + number, config.episodes_per_item)
                for index in range(len(self._outcome.policies))
                for number in range(config.selection.round_items)]

    def first(self) -> list[WorkItem]:
        """The items to start with.

        Returns:
            The uniform plan or the first round, the items of policies that failed their load check
                left out.
        """
        policies = self._outcome.policies
        if self.selection is None:
            items = plan_items(len(policies), self._outcome.config)
        else:
            items = self.selection.next_round({}, self._failed())
        return [item for item in items if not policies[item.policy_index].failed]

    def next(self) -> list[WorkItem]:
        """The items to run once every started item is done.

        Returns:
            The selection's next round, or [].
        """
        if self.selection is None:
            return []
        return self.selection.next_round(self._strata(), self._failed())

    def budget_episodes(self) -> int:
        """The episodes the progress bar counts toward.

        Returns:
            Every policy's episodes, or the selection's budget.
        """
        config = self._outcome.config
        if self.selection is None:
            return config.episodes * len(self._outcome.policies)
        return self.selection.budget_items * config.episodes_per_item

    def finish(self) -> None:
        """Record the planned episodes per policy and the selection's outcome."""
        outcome = self._outcome
        if self.selection is None:
            outcome.planned_episodes = [outcome.config.episodes] * len(outcome.policies)
            return
        outcome.planned_episodes = self.selection.scheduled_episodes()
        outcome.selection = self.selection.outcome(
            [policy.spec.label for policy in outcome.policies], self._strata())

    def _failed(self) -> list[int]:
        return [index for index, policy in enumerate(self._outcome.policies) if policy.failed]

    def _strata(self) -> dict[int, list[tuple[float, ...]]]:
        return {index: [item.returns for item in policy.ordered_items()]
                for index, policy in enumerate(self._outcome.policies)}


def progress_bar(config: EvalConfig, total_episodes: int) -> Any:
    """The evaluation's progress bar on stderr, in episodes.

    Args:
        config: the evaluation's settings (`progress` off hides it).
        total_episodes: the bar's total.

    Returns:
        The tqdm bar.
    """
    return tqdm(total=total_episodes, unit="ep", desc="evaluate", disable=not config.progress,
                file=sys.stderr, dynamic_ncols=True)


def evaluate_plain(specs: Sequence[PolicySpec], config: EvalConfig, env: EnvSpec,
                   on_result: ProgressCallback | None = None) -> EvaluationResult:
    """Run every item in this process on one environment, in order (`env.instances` items at a time):
    no Ray, no retries.

    The reference for `evaluate_on_ray` (same items, same seeds, same numbers) and the baseline of
    the benchmark. Policies always run on the CPU here (`config.accelerator` is ignored), with one
    torch thread while it runs, as in a one-CPU Ray runner: an 18-row forward pass gains nothing
    from more, and extra threads spin against the environment process, slowing both.

    Args:
        specs: the policies.
        config: the evaluation's settings.
        env: the environment.
        on_result: called after each finished item (with None for the runner pool).

    Returns:
        The result; `interrupted` when Ctrl-C stopped it (what finished is kept).

    Raises:
        ValueError: no policy, or labels that repeat.
        EnvironmentCrashed: the environment died mid-item (the plain loop does not retry).
    """
    started = time.perf_counter()
    outcome = EvaluationResult(policy_results(specs), config, env)
    schedule = Schedule(outcome)
    load_check(outcome.policies)
    items = deque(schedule.first())
    bar = progress_bar(config, sum(item.episodes for item in items) if schedule.selection is None
                        else schedule.budget_episodes())
    runner = Runner("plain", env, device="cpu", precision=config.precision)
    outcome.startup_seconds = time.perf_counter() - started
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        outcome.runners.append(runner.info())
        while items or refill(items, schedule):
            batch = next_batch(items, env.instances)
            policy = outcome.policies[batch[0].policy_index]
            if policy.failed:
                continue
            try:
                results = runner.run(policy.spec, None, batch, config.stochastic,
                                     config.keep_episodes)
            except (PolicyLoadError, FileNotFoundError) as error:
                policy.error = f"{type(error).__name__}: {error}"
                continue
            for result in results:
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
    schedule.finish()
    outcome.seconds = time.perf_counter() - started
    return outcome


def refill(pending: deque[WorkItem], schedule: Schedule) -> bool:
    """Queue the schedule's next items (called when every started item is done).

    Args:
        pending: the queue.
        schedule: the schedule.

    Returns:
        Whether there are any.
    """
    pending.extend(schedule.next())
    return bool(pending)
