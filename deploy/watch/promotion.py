"""Promotion into a running `huggy serve`, through its live change of the served policies
(`PUT /v1/policies`, behind the server's API key: `deploy.serving.changes`).

A checkpoint the rule finds better than the served policy (`deploy.watch.decisions`) is promoted
in two changes:

1. canary: the server keeps its served policy as the default and adds the checkpoint (loaded from
   the watch's copy of the file: the server must be able to read the watch's output folder); the
   sticky split gives the checkpoint `canary_share` of the sessions;
2. all: after `canary_s` seconds, the checkpoint becomes the default and the split ends; the
   previous policy stays served under its id, so a rollback is one change.

`rollback` returns the server to the policy served before the last promotion. Each change is
logged in the database with the decision behind it (its evidence).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deploy.watch.decisions import Decision
from deploy.watch.loop import Promotion, utc_now
from deploy.watch.store import PolicyRecord, WatchStore
from huggy_agent_client.remote import RemoteAgent, RemoteRequestError, RemoteServerError

CHANGE_TIMEOUT_S = 300.0
"""How long a change may take: the server answers once every replica serves the new set."""


@dataclass(frozen=True)
class Canary:
    """A promotion at its canary step."""

    label: str
    previous: str
    evidence: dict[str, Any]
    due: float
    """When it takes all of the traffic (the clock's seconds)."""


class Promoter(Promotion):
    """Promotes each new best into the `huggy serve` at `url` (module docstring).

    Args:
        url: the server.
        api_key: its API key (a server without one refuses live changes).
        store: the watch's database, where each change is logged.
        canary_share: the canary's share of the sessions, in (0, 1).
        canary_s: how long the canary runs before it takes all of the traffic.
        clock: monotonic seconds.

    Raises:
        ValueError: a share outside (0, 1) or a negative time.
        RemoteServerError: the server cannot be reached.
        RemoteRequestError: it refuses the key.
    """

    def __init__(self, url: str, api_key: str | None, store: WatchStore,
                 canary_share: float = 0.1, canary_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not 0.0 < canary_share < 1.0 or canary_s < 0:
            raise ValueError(f"expected a canary share in (0, 1) and a canary time >= 0, got "
                             f"{canary_share!r} and {canary_s!r}")
        self.remote = RemoteAgent(url, timeout=CHANGE_TIMEOUT_S, api_key=api_key)
        self.store = store
        self.canary_share = canary_share
        self.canary_s = canary_s
        self._clock = clock
        self.canary: Canary | None = None

    def served(self) -> dict[str, Any]:
        """What the server serves.

        Returns:
            Its `GET /v1/models`.
        """
        return self.remote.policies()

    def promote(self, record: PolicyRecord, decision: Decision) -> None:
        """The canary step: the checkpoint added with `canary_share` of the sessions. A change the
        server refuses is logged ("failed") and named on stderr; the watch goes on.

        Args:
            record: the new best (its `path` is the watch's copy).
            decision: the decision behind it.
        """
        if self.canary is not None:  # a better one came during a canary: it replaces it
            self._finish()
        assert record.path is not None
        previous = str(self.served()["default"])
        share = self.canary_share
        evidence = decision.record()
        done = self._change("canary", record.label, previous, evidence, [
            {"id": previous}, {"id": record.label, "path": str(Path(record.path).resolve())}],
            previous, {previous: 1.0 - share, record.label: share})
        if done:
            self.canary = Canary(record.label, previous, evidence, self._clock() + self.canary_s)

    def tick(self) -> None:
        """Give a canary all of the traffic once its time is up."""
        if self.canary is not None and self._clock() >= self.canary.due:
            self._finish()

    def done(self) -> bool:
        """Whether no canary is running.

        Returns:
            True when none is.
        """
        return self.canary is None

    def _finish(self) -> None:
        canary, self.canary = self.canary, None
        assert canary is not None
        self._change("served", canary.label, canary.previous, canary.evidence,
                     [{"id": canary.previous}, {"id": canary.label}], canary.label, None)

    def _change(self, kind: str, label: str, previous: str, evidence: dict[str, Any],
                policies: list[dict[str, str]], default: str, split: dict[str, float] | None
                ) -> bool:
        """Ask the server for a change and log it (as `kind`, or "failed" when refused)."""
        try:
            self.remote.change_policies(policies, default, split)
        except (RemoteRequestError, RemoteServerError) as error:
            print(f"huggy watch: the server refused to serve {label} ({kind}): {error}",
                  file=sys.stderr, flush=True)
            self.store.add_promotion(utc_now(), "failed", label, previous,
                                     {**evidence, "step": kind, "error": str(error)})
            return False
        self.store.add_promotion(utc_now(), kind, label, previous, evidence)
        print(f"huggy watch: {label} " + (f"takes {self.canary_share:.0%} of the sessions "
                                          f"beside {previous}" if kind == "canary" else
                                          f"is served (was {previous})"), flush=True)
        return True

    def close(self) -> None:
        """Close the connection."""
        self.remote.close()


def rollback(url: str, api_key: str | None, store: WatchStore) -> str:
    """Return the server to the policy it served before the watch's last promotion (a canary's
    or a finished one's), and log it.

    Args:
        url: the server.
        api_key: its API key.
        store: the watch's database.

    Returns:
        The line to print.

    Raises:
        ValueError: the database logs no promotion to roll back.
        RemoteRequestError: the server refused the change.
        RemoteServerError: the change failed, or the server could not be reached.
    """
    changes = [p for p in store.promotions() if p["kind"] in ("canary", "served", "rollback")]
    if not changes or changes[-1]["kind"] == "rollback":
        raise ValueError(f"{store.path} logs no promotion into a server to roll back"
                         + (" since the last rollback" if changes else ""))
    last = changes[-1]
    label, previous = last["label"], last["previous"]
    with RemoteAgent(url, timeout=CHANGE_TIMEOUT_S, api_key=api_key) as remote:
        served = {model["id"] for model in remote.policies()["models"]}
        keep = [{"id": previous}] if previous in served else [_with_path(store, previous)]
        remote.change_policies(keep, previous, None)
    store.add_promotion(utc_now(), "rollback", previous, label,
                        {"from": label, "undoes": last["kind"], "at": last["at"]})
    return f"huggy watch: rolled back from {label} to {previous}"


def _with_path(store: WatchStore, label: str) -> dict[str, str]:
    """A policy the server no longer serves, with the file it can load it from."""
    found = [record for record in store.policies() if record.label == label]
    if not found or found[0].path is None:
        raise ValueError(f"the server no longer serves {label!r} and {store.path} has no file of "
                         "it to serve again")
    return {"id": label, "path": str(Path(found[0].path).resolve())}
