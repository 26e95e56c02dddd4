"""Policies from what a user names, for the environments' own loops (team rollouts, opponents,
matches): a scripted player (`heuristic:NAME`, `envs.heuristics`), a policy served by
`huggy serve` (`http://HOST:PORT[#POLICY_ID]`), or a policy file, results folder or `hf://`
source (`huggy_agent.HuggyAgent`). Each has `compute_action` and `spec`."""

from __future__ import annotations

from typing import Any

from envs.heuristics import is_heuristic, load_heuristic
from huggy_agent import HuggyAgent
from huggy_agent_client.http_api import load_api_key

SERVED = ("http://", "https://")


def agent_from_source(source: str, device: str = "cpu", precision: str = "fp32",
                      seed: int | None = None) -> Any:
    """The policy a source names.

    Args:
        source: `heuristic:NAME` (a scripted player, `envs.heuristics`),
            `http://HOST:PORT[#POLICY_ID]` (a policy served by `huggy serve`, whose API key is read
            from `$HUGGY_API_KEY`), or a policy file, results folder or `hf://` source.
        device: the device of a policy file.
        precision: the precision of a policy file.
        seed: seeds the fresh noise streams of calls without one (scripted players and policy
            files).

    Returns:
        An object with `compute_action` and `spec`: a scripted player, a `RemoteAgent` or a
            `HuggyAgent`.
    """
    if is_heuristic(source):
        return load_heuristic(source, seed=seed)
    if source.startswith(SERVED):
        # the HTTP client (requests) is imported only for served policies
        from huggy_agent_client.remote import RemoteAgent

        url, _, policy = source.partition("#")
        return RemoteAgent(url, policy=policy or None, api_key=load_api_key())
    return HuggyAgent(source, device=device, precision=precision, seed=seed)
