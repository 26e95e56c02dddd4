"""The policies one replica holds: its own table, least recently used first, loading on a miss.
No Ray here: the replica (`deploy.serving.replica`) owns one `HeldPolicies`, so which policies it
holds never depends on another library's internals.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from deploy.serving.catalogue import PolicyEntry
from huggy_agent import HuggyAgent


@dataclass(frozen=True)
class ServedPolicy:
    """A policy a replica holds: its catalogue entry, its agent, and a zero observation (the
    health check's probe)."""

    entry: PolicyEntry
    agent: HuggyAgent
    probe: Any

    @property
    def id(self) -> str:
        return self.entry.id


class HeldPolicies:
    """At most `capacity` policies, least recently used first.

    `get(entry)` answers with the held policy of `entry`, or loads it (`load(entry)`), evicting
    the least recently used one when the table is full. Concurrent misses of one entry share one
    load. A held policy whose entry changed (a redeploy with another file under the same id) is
    loaded again. Requests that already hold an evicted or dropped policy finish with it.

    Args:
        load: loads the policy of an entry.
        capacity: the most policies held; None for no limit.

    Raises:
        ValueError: a capacity below 1.
    """

    def __init__(self, load: Callable[[PolicyEntry], Awaitable[ServedPolicy]],
                 capacity: int | None = None) -> None:
        if capacity is not None and capacity < 1:
            raise ValueError(f"capacity must be None or >= 1, received {capacity}")
        self._load = load
        self.capacity = capacity
        self._held: OrderedDict[str, ServedPolicy] = OrderedDict()
        self._loading: dict[tuple[str, str, str], asyncio.Future[ServedPolicy]] = {}
        """Loads in progress, by (id, file, fingerprint): an entry's identity."""

    def held(self, entry: PolicyEntry) -> ServedPolicy | None:
        """The held policy of an entry, now the most recently used.

        Args:
            entry: the catalogue entry.

        Returns:
            The policy; None if it is not held (or held for another entry of that id).
        """
        held = self._held.get(entry.id)
        if held is not None and (held.entry is entry or held.entry == entry):
            self._held.move_to_end(entry.id)
            return held
        return None

    async def get(self, entry: PolicyEntry) -> ServedPolicy:
        """The held policy of an entry, now the most recently used, loaded on a miss.

        Args:
            entry: the catalogue entry.

        Returns:
            The policy.
        """
        held = self.held(entry)
        if held is not None:
            return held
        key = (entry.id, entry.path, entry.fingerprint)
        pending = self._loading.get(key)
        if pending is None:
            pending = asyncio.ensure_future(self._load_and_hold(entry, key))
            self._loading[key] = pending
        return await asyncio.shield(pending)

    async def _load_and_hold(self, entry: PolicyEntry, key: tuple[str, str, str]
                             ) -> ServedPolicy:
        try:
            served = await self._load(entry)
        finally:
            self._loading.pop(key, None)
        self._held.pop(entry.id, None)
        self._held[entry.id] = served
        while self.capacity is not None and len(self._held) > self.capacity:
            self._held.popitem(last=False)
        return served

    def drop(self, ids: Iterable[str]) -> None:
        """Stop holding some policies (those not held are ignored).

        Args:
            ids: their ids.
        """
        for policy_id in ids:
            self._held.pop(policy_id, None)

    def ids(self) -> list[str]:
        """The held policies' ids.

        Returns:
            The ids, least recently used first.
        """
        return list(self._held)

    def __contains__(self, policy_id: object) -> bool:
        return policy_id in self._held

    def __getitem__(self, policy_id: str) -> ServedPolicy:
        return self._held[policy_id]

    def __len__(self) -> int:
        return len(self._held)
