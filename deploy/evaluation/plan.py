"""What an evaluation runs: the policies, the environment, the settings and the work items.

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

import json
import math
import os
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from deploy.client import RemoteAgent
    from huggy_agent.spec import ActorSpec

ENV_SEED_LIMIT = 2**24
"""Environment seeds travel as float32 (`envs.vector_env.MAX_SEED`): [0, 2**24)."""


@dataclass(frozen=True)
class PolicySpec:
    """One policy to evaluate: a checkpoint or ONNX file, or a Serve deployment's URL."""

    label: str
    """Name shown in the report (unique within one evaluation), short: `run@step` for a
    checkpoint of a results folder, `parent/file` for a file, the URL for a served policy."""
    path: str | None = None
    """The policy file (.pt or .onnx); None for a remote policy."""
    url: str | None = None
    """The Serve deployment's URL when runners query it instead of a local copy."""
    run: str | None = None
    """The results folder (run id) the checkpoint came from, for the learning curve."""
    step: int | None = None
    """The training step of the checkpoint, when known."""
    folder: str | None = None
    """The results folder it was found in, when named as one (where a model card goes)."""
    source: str | None = None
    """What the user named when it was not a local path (`hf://owner/repo@rev/path`)."""
    revision: str | None = None
    """The resolved revision (commit) of a policy from the Hugging Face Hub."""
    policy_id: str | None = None
    """Which of the policies served at `url` (`GET /v1/models`); None: the server's default."""
    api_key: str | None = field(default=None, repr=False, compare=False)
    """The key `url` asks for (`huggy serve --api-key-file`); None: `$HUGGY_API_KEY` of the
    process that queries it. Travels with the spec to the runners, never into a report."""

    def remote_agent(self) -> RemoteAgent:
        """A client of the served policy (`url`, `policy_id`, `api_key`)."""
        from deploy.client import RemoteAgent

        if self.url is None:
            raise ValueError(f"policy {self.label!r} is a file, not a served policy")
        return RemoteAgent(self.url, policy=self.policy_id, api_key=self.api_key)


@dataclass(frozen=True)
class EnvSpec:
    """How each runner opens its environment (see `envs.UnityVectorEnv`)."""

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


SELECT_BY = ("mean", "median", "iqm")
"""Statistics `--select-by` may rank policies by."""


@dataclass(frozen=True)
class SelectionConfig:
    """Adaptive selection of the best policy (`huggy evaluate --select-best`): rounds of work
    items, each remaining policy getting `round_items` more items per round, and after each
    round the policies worse than the leader with confidence `confidence` (corrected for the
    number of policies and rounds: `deploy.evaluation.selection`) get no more."""

    statistic: str = "mean"
    """What ranks the policies: mean, median or iqm of the return."""
    confidence: float = 0.95
    """Probability that the best policy is never dropped."""
    round_items: int = 1
    """Work items per remaining policy per round."""

    def __post_init__(self) -> None:
        if self.statistic not in SELECT_BY:
            raise ValueError(f"statistic must be one of {', '.join(SELECT_BY)}, got "
                             f"{self.statistic!r}")
        if not 0.0 < self.confidence < 1.0:
            raise ValueError(f"confidence must be in (0, 1), got {self.confidence!r}")
        if isinstance(self.round_items, bool) or not isinstance(self.round_items, int) \
                or self.round_items < 1:
            raise ValueError(f"round_items must be an integer >= 1, got {self.round_items!r}")


@dataclass(frozen=True)
class EvalConfig:
    """What to run and how."""

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

    def __post_init__(self) -> None:
        from deploy.placement import ACCELERATORS

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


def stand_in_behavior(specs: Sequence[PolicySpec]) -> dict | None:
    """What the built-in stand-in plays for these policies: None (Huggy) when they have Huggy's
    interface, else their common spec (spec-driven mode). Policies that cannot be loaded are
    skipped here (the evaluation reports them). Raises ValueError when the policies have
    different interfaces: one environment cannot play them all."""
    from envs.standin.launcher import standin_behavior
    from huggy_agent import PolicyLoadError
    from huggy_agent.formats import load_policy

    found: dict[str, tuple[str, ActorSpec]] = {}
    for spec in specs:
        try:
            if spec.url is not None:
                with spec.remote_agent() as remote:
                    interface = remote.spec
            else:
                interface = load_policy(spec.path).spec  # type: ignore[arg-type]
        except (PolicyLoadError, FileNotFoundError, RuntimeError, ValueError):
            continue
        found.setdefault(json.dumps(interface.as_dict(), sort_keys=True),
                         (spec.label, interface))
    if len(found) > 1:
        kinds = "; ".join(f"{label}: {interface.describe()}"
                          for label, interface in found.values())
        raise ValueError(f"the policies have different interfaces, which one environment cannot "
                         f"play: {kinds}; evaluate them separately")
    if not found:
        return None
    label, interface = next(iter(found.values()))
    return standin_behavior(interface.as_dict(), label.split("/")[0].split("@")[0])


def served_policy_specs(url: str, policy_id: str | None = None,
                        api_key: str | None = None) -> list[PolicySpec]:
    """One spec per policy served at `url` (`huggy serve`), labelled with its id, or only the
    one `policy_id`: every policy of a live A/B split, evaluated as deployed. A server of one
    policy, asked without an id, gives one spec labelled with the URL. `api_key` is sent with
    every request, by this process and by the runners. Raises ValueError (listing the served
    ids) for an id the server does not serve."""
    with PolicySpec(label=url, url=url, policy_id=policy_id, api_key=api_key).remote_agent() as remote:
        served = remote.policies()["models"]
    if len(served) == 1 and policy_id is None:
        return [PolicySpec(label=url, url=url, policy_id=served[0]["id"],
                           step=served[0]["step"], api_key=api_key)]
    return [PolicySpec(label=model["id"], url=url, policy_id=model["id"], step=model["step"],
                       run=model["id"].rsplit("@", 1)[0] if "@" in model["id"] else None,
                       api_key=api_key)
            for model in served if policy_id in (None, model["id"])]


def short_label(path: Path) -> str:
    """`parent/file`, such as `ppo_gamma_0.8/Huggy.onnx`: enough to tell files apart in a
    table or a chart, never a whole absolute path."""
    path = Path(path)
    parent = path.resolve().parent.name
    return f"{parent}/{path.name}" if parent else path.name


def expand_policies(sources: Sequence[str | os.PathLike[str]]) -> list[PolicySpec]:
    """One spec per policy: a file stays one policy; a results folder gives every checkpoint
    in it that is on disk, by step (`huggy_agent.formats.results.list_checkpoints`). Sources on
    the Hugging Face Hub (`hf://owner/repo[@revision][/path]`) are fetched through its cache
    first; their specs keep the source and the commit it resolved to.

    Raises FileNotFoundError for a path that does not exist and ValueError for an empty list or a
    folder without checkpoint files. Files that exist but cannot be loaded are not checked here.
    """
    from huggy_agent.formats.loaded import step_from_filename
    from huggy_agent.formats.results import list_checkpoints
    from huggy_agent.formats.sources import resolve_policy_source

    if not sources:
        raise ValueError("expected at least one policy (a .pt, an .onnx or a results folder)")
    specs: list[PolicySpec] = []
    for source in sources:
        resolved = resolve_policy_source(source)
        path = resolved.path
        start = len(specs)
        if path.is_dir():
            run = (resolved.repo_id.split("/")[1] if resolved.from_hub and not resolved.repo_path
                   else path.resolve().name)
            entries = [entry for entry in list_checkpoints(path) if entry.path is not None]
            if not entries:  # a folder with only its final export (such as a shared policy)
                finals = sorted(path.glob("*.onnx"))
                if not finals:
                    raise ValueError(f"no checkpoint or export files found in results folder "
                                     f"{path}")
                specs += [PolicySpec(label=f"{run}/{final.name}", path=str(final),
                                     folder=str(path)) for final in finals]
            behaviors = {entry.behavior for entry in entries}
            for entry in entries:
                name = run if len(behaviors) == 1 else f"{run}/{entry.behavior}"
                specs.append(PolicySpec(label=f"{name}@{entry.step}", path=str(entry.path),
                                        run=name, step=entry.step, folder=str(path)))
        elif path.is_file():
            label = short_label(path)
            if resolved.from_hub:  # the repository's name, not the commit, as the parent
                label = "/".join(f"{resolved.repo_id}/{resolved.repo_path}".split("/")[-2:])
            specs.append(PolicySpec(label=label, path=str(path), step=step_from_filename(path)))
        else:
            raise FileNotFoundError(f"policy not found: {path} (expected a .pt, an .onnx or a "
                                    "results folder)")
        if resolved.from_hub:
            specs[start:] = [replace(spec, source=resolved.describe(), revision=resolved.revision)
                             for spec in specs[start:]]
    labels = unique_labels([spec.label for spec in specs])
    return [replace(spec, label=label) for spec, label in zip(specs, labels, strict=True)]


def unique_labels(labels: Sequence[str]) -> list[str]:
    """`labels` in order, each repeat made unique by `#2`, `#3`, ..."""
    seen: dict[str, int] = {}
    unique = []
    for label in labels:
        count = seen.get(label, 0)
        seen[label] = count + 1
        unique.append(label if count == 0 else f"{label}#{count + 1}")
    return unique


def next_batch(pending: deque[WorkItem], size: int) -> list[WorkItem]:
    """Take up to `size` items of one policy from the front of `pending` (in order): what a
    runner with `size` instances runs at once."""
    batch = [pending.popleft()]
    while pending and len(batch) < size and pending[0].policy_index == batch[0].policy_index:
        batch.append(pending.popleft())
    return batch


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
