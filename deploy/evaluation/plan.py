"""What an evaluation runs: the policies, the environment, the settings and the work items.

Plain data, no I/O: finding policies is `huggy_agent.discovery` and `deploy.evaluation.sources`.

A policy's episodes are cut into work items; item `i` of every policy gets the seed `seed + i`
and is run on one Unity instance reset with that seed, counting a fixed quota of episodes per
agent slot of that instance (`envs.rollout.slot_quotas`). A runner with K instances
(`EnvSpec.instances`) runs K items of one policy at once, one per instance, and calls the
policy once per instance with that instance's rows (`envs.rollout.rollout_per_instance`): the
batch shape and noise seeds of a one-instance runner, so not even a float can change with K.
An item's numbers therefore depend only on (policy, i): never on which runner ran it, how many
runners or instances there were, or which of its episodes ended first.
"""

from __future__ import annotations

import math
import re
from collections import deque
from dataclasses import dataclass, field

from deploy.placement import ACCELERATORS
from envs.teams import check_builtin_parameters
from envs.vector_env import scene_parameters
from huggy_agent.discovery import FoundPolicy
from huggy_agent_client.remote import RemoteAgent

ENV_SEED_LIMIT = 2**24
"""Environment seeds travel as float32 (`envs.vector_env.MAX_SEED`): [0, 2**24)."""


def file_stem(label: str) -> str:
    """A policy label as a file or dataset name.

    Args:
        label: the label.

    Returns:
        Letters, digits, '_' and '-' only (other runs become '-'); "policy" when nothing is left.
    """
    return re.sub(r"[^-\w]+", "-", label).strip("-") or "policy"


@dataclass(frozen=True)
class PolicySpec:
    """One policy to evaluate: a checkpoint or ONNX file, or a Serve deployment's URL.

    `label`, `path`, `run`, `step`, `folder`, `source` and `revision` are what
    `huggy_agent.discovery.FoundPolicy` says of a policy file (`PolicySpec.of`); a served policy
    has `url` and `policy_id` instead of `path`, and its label is its id (or the URL)."""

    label: str
    path: str | None = None
    url: str | None = None
    """The Serve deployment's URL when runners query it instead of a local copy."""
    run: str | None = None
    step: int | None = None
    folder: str | None = None
    source: str | None = None
    revision: str | None = None
    policy_id: str | None = None
    """Which of the policies served at `url` (`GET /v1/models`); None: the server's default."""
    api_key: str | None = field(default=None, repr=False, compare=False)
    """The key `url` asks for (`huggy serve --api-key-file`); None: `$HUGGY_API_KEY` of the
    process that queries it. Travels with the spec to the runners, never into a report."""

    @classmethod
    def of(cls, found: FoundPolicy) -> PolicySpec:
        """The spec of a policy file that `huggy_agent.discovery.find_policies` found.

        Args:
            found: the policy file.

        Returns:
            The spec.
        """
        return cls(label=found.label, path=found.path, run=found.run, step=found.step,
                   folder=found.folder, source=found.source, revision=found.revision)

    def remote_agent(self) -> RemoteAgent:
        """A client of the served policy (`url`, `policy_id`, `api_key`).

        Returns:
            The client, connected.

        Raises:
            ValueError: the policy is a file, not a served one.
            RemoteServerError: the server cannot be reached.
            RemoteRequestError: the server refuses the key, or does not serve `policy_id`.
        """
        if self.url is None:
            raise ValueError(f"policy {self.label!r} is a file, not a served policy")
        return RemoteAgent(self.url, policy=self.policy_id, api_key=self.api_key)


@dataclass(frozen=True)
class EnvSpec:
    """How each runner opens its environment (see `envs.UnityVectorEnv`).

    Raises:
        ValueError: `instances` is not an integer >= 1, or a scene parameter the built-in stand-in
            would ignore.
    """

    file_name: str | None = None
    """A Unity build; None for the built-in stand-in."""
    num_agents: int | None = None
    """Agents per environment (stand-in parameter); None keeps the scene's own (18)."""
    max_steps: int | None = None
    """Decisions per episode before truncation (stand-in parameter); None keeps the scene's."""
    time_scale: float = 20.0
    timeout_wait: int = 60
    parameters: dict[str, float] = field(default_factory=dict)
    """More EnvironmentParameters side-channel values (`HuggyVectorEnv(env_parameters=...)`)."""
    instances: int = 1
    """Unity processes per runner (`--instances-per-runner`): the runner runs that many work
    items of one policy at once, one per instance."""
    behavior_spec: dict | None = None
    """For the built-in stand-in, the behavior it plays (its spec-driven mode, for policies
    other than Huggy: `envs.standin.launcher.standin_behavior`); None plays Huggy."""

    def __post_init__(self) -> None:
        if isinstance(self.instances, bool) or not isinstance(self.instances, int) \
                or self.instances < 1:
            raise ValueError(f"instances must be an integer >= 1, got {self.instances!r}")
        check_builtin_parameters(self.file_name, self.behavior_spec, scene_parameters(
            self.num_agents, self.max_steps, env_parameters=self.parameters))


SELECT_BY = ("mean", "median", "iqm")
"""Statistics `--select-by` may rank policies by."""


def check_ranking(statistic: str, confidence: float) -> None:
    """Refuse what no rule that ranks policies by a statistic at a confidence can use.

    Args:
        statistic: the statistic, one of SELECT_BY.
        confidence: the confidence, in (0, 1).

    Raises:
        ValueError: an unknown statistic, or a confidence outside (0, 1).
    """
    if statistic not in SELECT_BY:
        raise ValueError(f"statistic must be one of {', '.join(SELECT_BY)}, got {statistic!r}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")


@dataclass(frozen=True)
class SelectionConfig:
    """Adaptive selection of the best policy (`huggy evaluate --select-best`): rounds of work
    items, each remaining policy getting `round_items` more items per round, and after each
    round the policies worse than the leader with confidence `confidence` (corrected for the
    number of policies and rounds: `deploy.evaluation.selection`) get no more.

    Raises:
        ValueError: an unknown statistic, a confidence outside (0, 1), or `round_items` not an
            integer >= 1.
    """

    statistic: str = "mean"
    """What ranks the policies: mean, median or iqm of the return."""
    confidence: float = 0.95
    """Probability that the best policy is never dropped."""
    round_items: int = 1
    """Work items per remaining policy per round."""

    def __post_init__(self) -> None:
        check_ranking(self.statistic, self.confidence)
        if isinstance(self.round_items, bool) or not isinstance(self.round_items, int) \
                or self.round_items < 1:
            raise ValueError(f"round_items must be an integer >= 1, got {self.round_items!r}")


@dataclass(frozen=True)
class EvalConfig:
    """What to run and how.

    Raises:
        ValueError: a count that is not an integer >= 1, an unknown accelerator, seeds outside the
            environment's range [0, 2**24), or negative `runner_cpus`.
    """

    episodes: int = 36
    """Episodes per policy; with `selection`, the budget of all policies together."""
    episodes_per_item: int = 18
    """Episodes per work item: one reset, spread over the agent slots by per-slot quotas (the
    stand-in runs 18 agents at once, so 18 gives each slot one episode)."""
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
    """Tries per item (Ray retries a lost runner's item and a crashed environment's item up
    to this many times in all) before its policy is reported failed."""
    pin_nodes: tuple[str, ...] = ()
    """Node ids to pin runners to, round robin (runner k on `pin_nodes[k % len]`); empty lets Ray
    spread them."""
    progress: bool = True
    """Show a tqdm progress bar on stderr."""
    selection: SelectionConfig | None = None
    """Select the best policy adaptively instead of giving every policy `episodes` episodes."""
    keep_episodes: bool = False
    """Runners send every counted episode whole (`ItemResult.kept`: observations, actions,
    rewards), for a dataset written once by the driver."""

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


def next_batch(pending: deque[WorkItem], size: int) -> list[WorkItem]:
    """Take the items a runner with `size` instances runs at once.

    Args:
        pending: the items left; the batch is taken from its front, in order.
        size: the runner's instances.

    Returns:
        Up to `size` consecutive items, all of one policy.
    """
    batch = [pending.popleft()]
    while pending and len(batch) < size and pending[0].policy_index == batch[0].policy_index:
        batch.append(pending.popleft())
    return batch


def plan_items(num_policies: int, config: EvalConfig) -> list[WorkItem]:
    """The work items, policy by policy.

    Args:
        num_policies: how many policies.
        config: the evaluation's settings.

    Returns:
        `ceil(episodes / episodes_per_item)` items per policy, the last one shorter when the split
            is uneven; item i of every policy has seed `config.seed + i`.
    """
    items = []
    for policy_index in range(num_policies):
        left, index = config.episodes, 0
        while left > 0:
            count = min(config.episodes_per_item, left)
            items.append(WorkItem(policy_index, index, config.seed + index, count))
            left -= count
            index += 1
    return items
