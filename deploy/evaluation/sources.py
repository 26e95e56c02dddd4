"""Where an evaluation's policies come from: files, results folders and `hf://` sources
(`huggy_agent.discovery`), or a `huggy serve` endpoint; and what the built-in stand-in plays
for them."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

from deploy.evaluation.plan import PolicySpec
from envs.standin.launcher import standin_behavior
from huggy_agent import PolicyLoadError
from huggy_agent.discovery import find_policies
from huggy_agent.formats import load_policy
from huggy_agent_client.remote import RemoteAgent
from huggy_agent_client.spec import ActorSpec


def policy_specs(sources: Sequence[str | os.PathLike[str]]) -> list[PolicySpec]:
    """One spec per policy file that sources name (`huggy_agent.discovery.find_policies`: a file is one
    policy, a results folder every checkpoint in it, by step); files are not loaded here.

    Args:
        sources: policy files, results folders and `hf://` sources.

    Returns:
        The specs, labelled uniquely.

    Raises:
        FileNotFoundError: a path or Hub source that does not exist.
        ValueError: an empty list, a folder without policy files, or a malformed Hub source.
    """
    return [PolicySpec.of(found) for found in find_policies(sources)]


def served_policy_specs(url: str, policy_id: str | None = None,
                        api_key: str | None = None) -> list[PolicySpec]:
    """One spec per policy served at a `huggy serve` endpoint: every policy of a live A/B split, each
    evaluated on its own, or only one.

    Args:
        url: the server's base URL.
        policy_id: the one served policy to evaluate; None for all. A server of one policy, asked
            without an id, gives one spec labelled with the URL.
        api_key: sent with every request, by this process and by the runners.

    Returns:
        The specs, labelled with their ids.

    Raises:
        RemoteRequestError: the server does not serve `policy_id` (listing the served ids), or
            refuses the key.
        RemoteServerError: the server cannot be reached.
    """
    with RemoteAgent(url, policy=policy_id, api_key=api_key) as remote:
        served = remote.policies()["models"]
    if len(served) == 1 and policy_id is None:
        return [PolicySpec(label=url, url=url, policy_id=served[0]["id"],
                           step=served[0]["step"], api_key=api_key)]
    return [PolicySpec(label=model["id"], url=url, policy_id=model["id"], step=model["step"],
                       run=model["id"].rsplit("@", 1)[0] if "@" in model["id"] else None,
                       api_key=api_key)
            for model in served if policy_id in (None, model["id"])]


def stand_in_behavior(specs: Sequence[PolicySpec]) -> dict | None:
    """What the built-in stand-in plays for these policies. Policies that cannot be loaded are
    skipped here (the evaluation reports them).

    Args:
        specs: the policies.

    Returns:
        None (Huggy) when they have Huggy's interface, else their common spec (spec-driven mode).

    Raises:
        ValueError: the policies have different interfaces: one environment cannot play them all.
    """
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
