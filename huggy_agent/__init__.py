"""huggy-agent: run a trained Unity ML-Agents policy (Huggy the Dog first) outside Unity.

    from huggy_agent import HuggyAgent
    agent = HuggyAgent.from_checkpoint("results/Huggy", device="auto", precision="fp32")
    actions = agent.compute_action(obs, deterministic=True)
"""

from huggy_agent.agent import Actions, HuggyAgent, PolicyOutputs, bundled_policy_path
from huggy_agent.errors import PolicyLoadError

__all__ = ["Actions", "HuggyAgent", "PolicyLoadError", "PolicyOutputs", "bundled_policy_path"]
