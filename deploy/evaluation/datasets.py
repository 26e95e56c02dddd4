"""Minari datasets of an evaluation (`huggy evaluate --dataset NAME`): one dataset per policy,
written once by the driver from the episodes the runners kept (`EvalConfig.keep_episodes`,
`ItemResult.kept`), wherever they ran.

Episodes are stored in the report's order: items by index, then (slot, episode index) within an
item (`envs.rollout.ESTIMATOR`), so dataset episode k is the report's k-th return. Each
episode's Minari metadata names its slot, its index there and its item's environment seed; the
dataset's metadata (under "huggy_agent") names the policy (label, file or URL, fingerprint),
the environment, the seeds and the estimator.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from deploy.evaluation.plan import file_stem
from deploy.evaluation.results import EvaluationResult, PolicyResult
from deploy.evaluation.sinks import seeds_text
from envs.recording.dataset import check_new_dataset, dataset_env_spec, write_minari_dataset
from envs.rollout import ESTIMATOR, ESTIMATOR_DESCRIPTION
from envs.vector_env import spaces_of


def dataset_ids(name: str, labels: Sequence[str]) -> list[str]:
    """The dataset id of each policy.

    Args:
        name: `(namespace/)name-vN`.
        labels: the policies' labels.

    Returns:
        `name` itself for one policy; for several, `<namespace/><name>/<label>-vN`, the label made
            a file name (`plan.file_stem`).

    Raises:
        ValueError: `name` is not of that form, or a dataset of one of the ids exists already.
        ImportError: Minari is not installed.
    """
    check_new_dataset(name)
    if len(labels) == 1:
        return [name]
    stem, version = name.rsplit("-v", 1)
    ids = [f"{stem}/{file_stem(label)}-v{version}" for label in labels]
    for dataset_id in ids:
        check_new_dataset(dataset_id)
    return ids


def write_datasets(result: EvaluationResult, ids: Sequence[str]) -> list[Any]:
    """Write each policy's kept episodes as a Minari dataset (policies without episodes are left out).

    Args:
        result: the evaluation's result.
        ids: one dataset id per policy (`dataset_ids`).

    Returns:
        The written `MinariDataset`s.
    """
    written = []
    for policy, dataset_id in zip(result.policies, ids, strict=True):
        kept = [item.kept for item in policy.ordered_items() if item.kept is not None]
        episodes = [episode for part in kept for episode in part.episodes]
        if not episodes:
            continue
        observation_space, action_space = spaces_of(kept[0].behavior.layout)
        written.append(write_minari_dataset(
            dataset_id, episodes, observation_space, action_space,
            env_spec=dataset_env_spec(result.env.file_name, result.env.behavior_spec,
                                      max_steps=result.env.max_steps,
                                      env_parameters=result.env.parameters),
            metadata=_metadata(result, policy, kept[0].behavior.name),
            algorithm_name=f"huggy evaluate of {policy.spec.label}",
            description=(f"{len(episodes)} episodes of {policy.spec.label} "
                         f"({_mode(result)}) on {_env_name(result)}, environment seeds "
                         f"{seeds_text(result, policy.spec.label)}: {ESTIMATOR_DESCRIPTION}")))
    return written


def _metadata(result: EvaluationResult, policy: PolicyResult, behavior: str) -> dict[str, Any]:
    spec = policy.spec
    return {"policy": spec.label, "path": spec.path, "url": spec.url,
            "policy_id": spec.policy_id, "source": spec.source, "revision": spec.revision,
            "step": spec.step, "fingerprint": policy.fingerprint, "env": _env_name(result),
            "behavior": behavior, "deterministic": not result.config.stochastic,
            "precision": result.config.precision,
            "seeds": [item.seed for item in policy.ordered_items()],
            "episodes": sum(len(item.returns) for item in policy.items),
            "estimator": ESTIMATOR, "estimator_description": ESTIMATOR_DESCRIPTION}


def _mode(result: EvaluationResult) -> str:
    return "stochastic" if result.config.stochastic else "deterministic"


def _env_name(result: EvaluationResult) -> str:
    return result.env.file_name or "builtin"

