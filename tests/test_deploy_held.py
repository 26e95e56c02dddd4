"""The table of policies a replica holds (`deploy.serving.held`), without Ray: least recently
used first, one load per entry however many requests miss it at once, a changed entry loaded
again. Loads are gated by asyncio events, never timed."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from deploy.serving.catalogue import PolicyEntry
from deploy.serving.held import HeldPolicies, ServedPolicy


def entry(policy_id: str, path: str = "") -> PolicyEntry:
    return PolicyEntry(id=policy_id, path=path or f"/p/{policy_id}.onnx", source="s",
                       interface="(59,) -> 21 continuous", spec={}, fingerprint=f"f-{path}")


class Loader:
    """Counts loads; each load of an id waits for its gate when one is set."""

    def __init__(self) -> None:
        self.loads: list[str] = []
        self.gates: dict[str, asyncio.Event] = {}

    async def __call__(self, policy: PolicyEntry) -> ServedPolicy:
        self.loads.append(policy.id)
        if policy.id in self.gates:
            await self.gates[policy.id].wait()
        return ServedPolicy(policy, agent=None, probe=None)  # type: ignore[arg-type]


def test_least_recently_used_is_evicted_and_loaded_again_on_a_miss() -> None:
    async def run() -> tuple[list[str], list[str]]:
        loader = Loader()
        held = HeldPolicies(loader, capacity=2)
        for policy_id in ("a", "b", "a", "c", "b"):
            served = await held.get(entry(policy_id))
            assert served.id == policy_id
        return loader.loads, held.ids()

    loads, ids = asyncio.run(run())
    assert loads == ["a", "b", "c", "b"]  # "a" was used again before "c" came: "b" went
    assert ids == ["c", "b"]


def test_concurrent_misses_share_one_load() -> None:
    async def run() -> tuple[list[str], list[ServedPolicy]]:
        loader = Loader()
        loader.gates["a"] = asyncio.Event()
        held = HeldPolicies(loader)
        waiting = [asyncio.ensure_future(held.get(entry("a"))) for _ in range(5)]
        await asyncio.sleep(0)  # every request reaches the miss before the load finishes
        loader.gates["a"].set()
        return loader.loads, await asyncio.gather(*waiting)

    loads, answers = asyncio.run(run())
    assert loads == ["a"]
    assert all(answer is answers[0] for answer in answers)


def test_a_changed_entry_is_loaded_again_and_drop_forgets() -> None:
    async def run() -> tuple[list[str], ServedPolicy, list[str]]:
        loader = Loader()
        held = HeldPolicies(loader)
        await held.get(entry("a", "/old.onnx"))
        newer = await held.get(entry("a", "/new.onnx"))
        held.drop(["a", "never-held"])
        return loader.loads, newer, held.ids()

    loads, newer, ids = asyncio.run(run())
    assert loads == ["a", "a"] and newer.entry.path == "/new.onnx" and ids == []


def test_a_failed_load_is_not_held_and_is_tried_again() -> None:
    async def run() -> tuple[list[str], list[str]]:
        attempts: list[str] = []

        async def flaky(policy: PolicyEntry) -> ServedPolicy:
            attempts.append(policy.id)
            if len(attempts) == 1:
                raise OSError("disk hiccup")
            return ServedPolicy(policy, agent=None, probe=None)  # type: ignore[arg-type]

        held = HeldPolicies(flaky)
        with pytest.raises(OSError, match="disk hiccup"):
            await held.get(entry("a"))
        await held.get(replace(entry("a")))
        return attempts, held.ids()

    assert asyncio.run(run()) == (["a", "a"], ["a"])


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError, match="capacity must be None or >= 1, received 0"):
        HeldPolicies(Loader(), capacity=0)
