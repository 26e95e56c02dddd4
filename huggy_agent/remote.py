"""The client of a served policy, `huggy_agent_client.remote` (the huggy-agent-client
distribution, which huggy-agent depends on), under the name it has in this package:

    from huggy_agent.remote import RemoteAgent    # the same class as
    from huggy_agent_client import RemoteAgent    # which needs neither torch nor this package

Importing it imports no torch: this package's `__init__` imports its names when first used.
"""

from huggy_agent_client.remote import RemoteAgent, RemoteRequestError, RemoteServerError

__all__ = ["RemoteAgent", "RemoteRequestError", "RemoteServerError"]
