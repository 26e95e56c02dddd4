"""huggy-agent: run a trained Unity ML-Agents policy (Huggy the Dog first) outside Unity.

    from huggy_agent import HuggyAgent
    agent = HuggyAgent.from_checkpoint("results/Huggy", device="auto", precision="fp32")
    actions = agent.compute_action(obs, deterministic=True)
"""

from importlib.metadata import PackageNotFoundError, version

from huggy_agent.agent import (
    ActionResult,
    Actions,
    HuggyAgent,
    PolicyActions,
    PolicyOutputs,
    RowsPart,
    bundled_policy_path,
    split_memory,
)
from huggy_agent.errors import PolicyLoadError

try:
    __version__ = version("huggy-agent")  # the one version, [project] version in pyproject.toml
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = ["ActionResult", "Actions", "HuggyAgent", "PolicyActions", "PolicyLoadError",
           "PolicyOutputs", "RowsPart", "__version__", "bundled_policy_path", "split_memory"]
