"""huggy-agent: run a trained Unity ML-Agents policy (Huggy the Dog first) outside Unity.

    from huggy_agent import HuggyAgent
    agent = HuggyAgent.from_checkpoint("results/Huggy", device="auto", precision="fp32")
    actions = agent.compute_action(obs, deterministic=True)

The names below are imported when first used (PEP 562), so that importing a module of this
package that needs no torch (`huggy_agent.remote`) does not import torch.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from huggy_agent.agent import (
        HuggyAgent,
        PolicyOutputs,
        RowsPart,
        bundled_policy_path,
    )
    from huggy_agent.errors import PolicyLoadError
    from huggy_agent_client.actions import ActionResult, Actions, PolicyActions, split_memory

    __version__: str

_MODULE_OF = {
    "HuggyAgent": "huggy_agent.agent",
    "PolicyOutputs": "huggy_agent.agent",
    "RowsPart": "huggy_agent.agent",
    "bundled_policy_path": "huggy_agent.agent",
    "PolicyLoadError": "huggy_agent.errors",
    "ActionResult": "huggy_agent_client.actions",
    "Actions": "huggy_agent_client.actions",
    "PolicyActions": "huggy_agent_client.actions",
    "split_memory": "huggy_agent_client.actions",
}
"""Each public name -> the module that defines it."""

__all__ = ["ActionResult", "Actions", "HuggyAgent", "PolicyActions", "PolicyLoadError",
           "PolicyOutputs", "RowsPart", "__version__", "bundled_policy_path", "split_memory"]


def _installed_version() -> str:
    """The distribution's one version ([project] version in pyproject.toml). importlib.metadata
    is imported here, on the first use of `__version__`, because its import costs more than the
    rest of this module's."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("huggy-agent")
    except PackageNotFoundError:  # imported from a source tree that was never installed
        return "0+unknown"


def __getattr__(name: str) -> Any:
    """A public name of the package, imported from its module on first use and kept."""
    if name == "__version__":
        value: Any = _installed_version()
    elif name in _MODULE_OF:
        value = getattr(import_module(_MODULE_OF[name]), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
