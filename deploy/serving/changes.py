"""Live changes of what `huggy serve` serves, through `PUT /v1/policies` behind the API key: the
policies, the default and the split, applied as the redeploy of the deployment's `user_config`
that `deploy.serving.server.deploy` makes (the running replicas take it on without a restart).

    PUT /v1/policies
    {"policies": [{"id": "Huggy@2000"},
                  {"id": "Huggy@3000", "path": "/abs/results/Huggy/Huggy/Huggy-3000.onnx"}],
     "default": "Huggy@2000", "split": {"Huggy@2000": 0.9, "Huggy@3000": 0.1}}

An entry without a path keeps a served policy; one with a path (a .pt or .onnx file on the
server's machine) is loaded and served under that id. Policies left out are no longer served.
`default` and `split` are as `huggy serve --default` and `--split` take them; without
`default`, the current default stays where it is still served, else the first policy is.

The replica that receives the request checks its form (`parse_change`) and hands it to the
change desk (`ChangeDesk`), a Ray actor of `huggy serve`'s own process, which applies the
changes one at a time (`changed_set`, then the redeploy) and gives each replica its answer:
the served set once every replica runs it. A server without `huggy serve`'s process (an app of
`serve run` or `serve deploy`) has no desk and answers 501. No Ray and no web framework here:
the desk is a plain class that `huggy serve` starts as an actor.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from deploy.serving.catalogue import PolicyEntry, PolicySet
from deploy.serving.responses import ApiError
from huggy_agent_client.http_api import POLICIES_PATH, json_kind, shown

DESK_NAMESPACE = "huggy"
"""The Ray namespace of the change desks."""
ID_CHARS = 200
"""The longest policy id a change may give."""


def desk_name(app: str) -> str:
    """The name of the change desk of a Serve application.

    Args:
        app: the application's name.

    Returns:
        The actor's name, in `DESK_NAMESPACE`.
    """
    return f"policy-changes:{app}"


@dataclass(frozen=True)
class PolicyChange:
    """A change's form, checked (`parse_change`)."""

    policies: tuple[tuple[str, str | None], ...]
    """(id, path) of each policy to serve; path None keeps a served one."""
    default: str | None = None
    split: dict[str, float] | None = None

    def as_dict(self) -> dict[str, Any]:
        """The change as its JSON body gives it.

        Returns:
            {"policies": [...], "default": ..., "split": ...}.
        """
        return {"policies": [{"id": policy_id} if path is None else {"id": policy_id,
                                                                      "path": path}
                             for policy_id, path in self.policies],
                "default": self.default, "split": self.split}


def _refused(message: str) -> ApiError:
    return ApiError(422, "invalid_change", f"PUT {POLICIES_PATH}: {message}")


def parse_change(body: bytes | str) -> PolicyChange:
    """The change a request body asks for, its form checked (not yet against what is served).

    Args:
        body: the JSON body (module docstring).

    Returns:
        The change.

    Raises:
        ApiError: 400 for a body that is not JSON; 422 for one of another form (naming what was
            expected and what came, quoting at most a short escaped prefix of it).
    """
    try:
        document = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise ApiError(400, "bad_json", f"PUT {POLICIES_PATH} expects a JSON object, received "
                       f"{shown(body)}") from None
    if not isinstance(document, dict):
        raise _refused(f"expected a JSON object, received {json_kind(document)}")
    unknown = sorted(set(document) - {"policies", "default", "split"})
    if unknown:
        raise _refused(f"unknown field {shown(unknown[0])}; expected policies, default, split")
    entries = document.get("policies")
    if not isinstance(entries, list) or not entries:
        raise _refused(f"'policies' must be a non-empty array of {{id, path}} objects, "
                       f"received {json_kind(entries)}")
    policies = []
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict) or set(entry) - {"id", "path"} or "id" not in entry:
            raise _refused(f"policies[{index}] must be an object with 'id' and optionally "
                           f"'path', received {shown(json.dumps(entry))}")
        policy_id, path = entry["id"], entry.get("path")
        if not isinstance(policy_id, str) or not 0 < len(policy_id) <= ID_CHARS:
            raise _refused(f"policies[{index}].id must be a string of 1 to {ID_CHARS} "
                           f"characters, received {shown(json.dumps(policy_id))}")
        if path is not None and (not isinstance(path, str) or not Path(path).is_absolute()):
            raise _refused(f"policies[{index}].path must be an absolute path on the server's "
                           f"machine, received {shown(json.dumps(path))}")
        policies.append((policy_id, path))
    default = document.get("default")
    if default is not None and not isinstance(default, str):
        raise _refused(f"'default' must be a policy id, received {json_kind(default)}")
    split = document.get("split")
    if split is not None and (not isinstance(split, dict) or not all(
            isinstance(weight, int | float) and not isinstance(weight, bool)
            for weight in split.values())):
        raise _refused(f"'split' must be an object of id: weight, received "
                       f"{shown(json.dumps(split))}")
    return PolicyChange(tuple(policies), default, split)


def changed_set(current: PolicySet, change: PolicyChange,
                load: Callable[[Sequence[str]], list[PolicyEntry]]) -> PolicySet:
    """What the server serves after a change.

    Args:
        current: what it serves now.
        change: the change.
        load: the catalogue of policy files (`deploy.serving.catalogue.catalogue`).

    Returns:
        The new set.

    Raises:
        ValueError: an entry without a path that is not served, a path that is not one policy
            file, a default or split naming a policy the change leaves out, or ids that repeat.
        FileNotFoundError: a path that does not exist.
        PolicyLoadError: a file that cannot be loaded.
    """
    entries = []
    for policy_id, path in change.policies:
        if path is None:
            try:
                entries.append(current.entry(policy_id))
            except KeyError as error:
                raise ValueError(f"{error.args[0]}; give its 'path' to serve a new "
                                 "policy") from None
            continue
        found = load([path])
        if len(found) != 1 or not Path(path).is_file():
            raise ValueError(f"path {shown(path)} of {shown(policy_id)} must be one policy file "
                             f"(.pt or .onnx), not a folder of {len(found)}")
        entries.append(replace(found[0], id=policy_id))
    ids = [entry.id for entry in entries]
    default = change.default
    if default is None:
        default = current.default if current.default in ids else ids[0]
    return PolicySet.build(entries, default, change.split)


def served_summary(served: PolicySet) -> dict[str, Any]:
    """What a change is answered with: the served set, as `GET /v1/models` names it.

    Args:
        served: the set.

    Returns:
        {"policies": [ids], "default": id, "split": {id: share} or None}.
    """
    return {"policies": served.ids, "default": served.default,
            "split": None if served.split is None else served.split.shares()}


SHUTTING_DOWN = {"status": 503, "error": "huggy serve is shutting down; the change may not have "
                 "reached every replica, and is gone with the server"}
"""The outcome of a change that `huggy serve`'s shutdown cut short (`ChangeDesk.close`)."""


class ChangeDesk:
    """Where replicas hand in changes and `huggy serve`'s process takes them, one at a time (run
    as a named Ray actor: `desk_name`).

    Each `submit` waits for its outcome: {"served": ...} once applied, or {"status": HTTP
    status, "error": message}.
    """

    def __init__(self) -> None:
        self._queue: asyncio.Queue[tuple[int, dict[str, Any]]] = asyncio.Queue()
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._tickets = 0
        self._closed = False

    async def submit(self, change: dict[str, Any]) -> dict[str, Any]:
        """Hand in a change and wait until it is applied or refused.

        Args:
            change: `PolicyChange.as_dict()`.

        Returns:
            The outcome; `SHUTTING_DOWN` once the desk is closed.
        """
        if self._closed:
            return SHUTTING_DOWN
        ticket = self._tickets
        self._tickets += 1
        outcome = asyncio.get_running_loop().create_future()
        self._waiting[ticket] = outcome
        await self._queue.put((ticket, change))
        return await outcome

    async def take(self, timeout_s: float) -> tuple[int, dict[str, Any]] | None:
        """The next change, in the order handed in.

        Args:
            timeout_s: how long to wait for one.

        Returns:
            (ticket, change); None when none came in time.
        """
        try:
            return await asyncio.wait_for(self._queue.get(), timeout_s)
        except asyncio.TimeoutError:
            return None

    def finish(self, ticket: int, outcome: dict[str, Any]) -> None:
        """Answer a change.

        Args:
            ticket: its ticket, from `take`.
            outcome: {"served": ...} or {"status": ..., "error": ...}.
        """
        waiting = self._waiting.pop(ticket, None)
        if waiting is not None and not waiting.done():
            waiting.set_result(outcome)

    def close(self) -> None:
        """Answer every change not answered yet, and each one handed in from now on, with
        `SHUTTING_DOWN`: `huggy serve` calls this as it stops, so that no replica waits on a desk
        that ends with its process (it would answer 500, the desk's actor died)."""
        self._closed = True
        for ticket in list(self._waiting):
            self.finish(ticket, SHUTTING_DOWN)
