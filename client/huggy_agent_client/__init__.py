"""huggy-agent-client: call a policy that `huggy serve` serves, with numpy and requests only.

    from huggy_agent_client import RemoteAgent
    with RemoteAgent("http://127.0.0.1:8000") as agent:
        actions = agent.compute_action(obs, deterministic=True)  # as HuggyAgent.compute_action

`GrpcRemoteAgent` takes its actions over gRPC (`huggy serve --grpc-port`; needs grpcio, the
`grpc` extra). The package also holds what a policy and its clients share, which the
huggy-agent distribution builds on: a policy's spec (`spec`), the validation of its inputs
(`inputs`, `observations`), its answers' types (`actions`) and the wire contract of a served
policy (`http_api`).

The names below are imported when first used (PEP 562), so that the policy package, which
imports the shared modules, does not import requests.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from huggy_agent_client.actions import ActionResult, Actions, PolicyActions, split_memory
    from huggy_agent_client.grpc_remote import GrpcRemoteAgent
    from huggy_agent_client.remote import RemoteAgent, RemoteRequestError, RemoteServerError
    from huggy_agent_client.spec import ActorSpec, ObservationInput

_MODULE_OF = {
    "ActionResult": "huggy_agent_client.actions",
    "Actions": "huggy_agent_client.actions",
    "PolicyActions": "huggy_agent_client.actions",
    "split_memory": "huggy_agent_client.actions",
    "GrpcRemoteAgent": "huggy_agent_client.grpc_remote",
    "RemoteAgent": "huggy_agent_client.remote",
    "RemoteRequestError": "huggy_agent_client.remote",
    "RemoteServerError": "huggy_agent_client.remote",
    "ActorSpec": "huggy_agent_client.spec",
    "ObservationInput": "huggy_agent_client.spec",
}
"""Each public name -> the module that defines it."""

__all__ = ["ActionResult", "Actions", "ActorSpec", "GrpcRemoteAgent", "ObservationInput",
           "PolicyActions", "RemoteAgent", "RemoteRequestError", "RemoteServerError",
           "split_memory"]


def __getattr__(name: str) -> Any:
    """A public name of the package, imported from its module on first use and kept."""
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(_MODULE_OF[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
