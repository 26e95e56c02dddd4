"""What a policy server serves: the catalogue of its policies (`PolicyEntry`, read once per
process from the files `huggy_agent.discovery` finds), the default one and the A/B split of
`/v1/act` (`PolicySet`), and the form they travel in to the replicas (`as_config`).

A policy id keys everything a server does per policy (route, loading, batch queue, counters).
Ids are the labels `huggy_agent.discovery.find_policies` gives: `<run>@<step>` for each
checkpoint of a results folder, `<parent>/<file>` for a file.

    entries = catalogue(["results/Huggy", "b/Huggy.onnx"])      # every checkpoint, by step
    served = PolicySet.build(entries, split="Huggy@2000343=0.9,b/Huggy.onnx=0.1")

No Ray and no web framework here, so the rules are testable on their own.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from huggy_agent.agent import weights_fingerprint
from huggy_agent.discovery import find_policies, unique_labels
from huggy_agent.formats import load_policy
from huggy_agent_client.http_api import Split, unknown_policy_message


@dataclass(frozen=True)
class PolicyEntry:
    """One served policy: its `id`, the local file, what the user named, and its interface."""

    id: str
    path: str
    """The policy file (.pt or .onnx), absolute."""
    source: str
    """What the user named: the file, the results folder it came from, or an `hf://` source."""
    interface: str
    """One line: the policy's inputs and actions (`ActorSpec.describe`)."""
    spec: dict[str, Any]
    """`ActorSpec.as_dict()`."""
    fingerprint: str
    """The weights fingerprint (`huggy_agent.agent.weights_fingerprint`)."""
    step: int | None = None

    def as_dict(self) -> dict[str, Any]:
        """The entry as JSON-ready data.

        Returns:
            Every field.
        """
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PolicyEntry:
        """The inverse of `as_dict`.

        Args:
            data: the entry's fields.

        Returns:
            The entry.

        Raises:
            ValueError: not an object, or a missing or unknown field (naming it).
        """
        names = {field.name for field in fields(cls)}
        required = {field.name for field in fields(cls) if field.default is MISSING}
        if not isinstance(data, Mapping):
            raise ValueError(f"a policy entry must be an object, received {type(data).__name__}")
        missing = sorted(required - set(data))
        unknown = sorted(set(data) - names)
        if missing or unknown:
            raise ValueError(f"policy entry {data.get('id', '?')!r}: missing field(s) {missing}, "
                             f"unknown field(s) {unknown}; expected {sorted(names)}")
        return cls(**dict(data))


def catalogue(sources: Sequence[str | Path]) -> list[PolicyEntry]:
    """The policies named by sources, in order: a file is one policy, a results folder every
    checkpoint in it by step, each labelled as `huggy_agent.discovery.find_policies` labels it.
    Each file is loaded once to read its interface and fingerprint.

    Args:
        sources: policy files, results folders and `hf://` sources.

    Returns:
        One entry per policy file, ids made unique.

    Raises:
        FileNotFoundError: a missing path.
        ValueError: an empty list, a folder without policies, or a malformed Hub source.
        PolicyLoadError: a file that cannot be loaded (naming the file).
    """
    if not sources:
        raise ValueError("expected at least one policy (a .pt, an .onnx or a results folder)")
    entries = []
    for source in sources:
        for policy in find_policies([source]):
            path = str(Path(policy.path).resolve())
            loaded = load_policy(path)
            interface = loaded.arch.spec
            entries.append(PolicyEntry(
                id=policy.label, path=path, source=str(source), interface=interface.describe(),
                spec=interface.as_dict(), fingerprint=weights_fingerprint(loaded),
                step=policy.step if policy.step is not None else loaded.step))
    ids = unique_labels([entry.id for entry in entries])  # as evaluation labels repeats
    return [replace(entry, id=entry_id) for entry, entry_id in zip(entries, ids, strict=True)]


@dataclass(frozen=True)
class PolicySet:
    """What a server serves: its policies, the default one, and the split of `/v1/act`.

    Raises:
        ValueError: no entries, repeated ids, a default that is not served, or a split that names
            a policy that is not served.
    """

    entries: tuple[PolicyEntry, ...]
    default: str
    split: Split | None = None

    def __post_init__(self) -> None:
        if not self.entries:
            raise ValueError("a server needs at least one policy")
        ids = self.ids
        repeated = sorted({i for i in ids if ids.count(i) > 1})
        if repeated:
            raise ValueError(f"policy ids must be unique, received {repeated} more than once")
        if self.default not in ids:
            raise ValueError(f"default policy {self.default!r} is not served; "
                             f"known policies: {', '.join(ids)}")
        if self.split is not None:
            Split.from_weights(self.split, ids)

    @classmethod
    def build(cls, entries: Sequence[PolicyEntry], default: str | None = None,
              split: str | Mapping[str, float] | Split | None = None) -> PolicySet:
        """The set of some entries.

        Args:
            entries: the served policies.
            default: the id `/v1/act` answers with; None: the first.
            split: the A/B split of `/v1/act`, as `--split` text, a `{id: weight}` mapping or a
                `Split`; None for none.

        Returns:
            The set.

        Raises:
            ValueError: no entries, or a default or split that is wrong (naming what).
        """
        if not entries:
            raise ValueError("a server needs at least one policy")
        ids = [entry.id for entry in entries]
        if isinstance(split, str):
            split = Split.parse(split, ids)
        elif split is not None and not isinstance(split, Split):
            split = Split.from_weights(split, ids)
        return cls(tuple(entries), ids[0] if default is None else default, split)

    @property
    def ids(self) -> list[str]:
        return [entry.id for entry in self.entries]

    def entry(self, policy_id: str) -> PolicyEntry:
        """The entry of a served policy.

        Args:
            policy_id: its id.

        Returns:
            The entry.

        Raises:
            KeyError: with `unknown_policy_message`, when it is not served.
        """
        for entry in self.entries:
            if entry.id == policy_id:
                return entry
        raise KeyError(unknown_policy_message(policy_id, self.ids))

    def choose(self, named: str | None, session: str | None = None,
               rng: random.Random | None = None) -> str:
        """The policy of a request.

        Args:
            named: the id the request named (path or header), or None.
            session: the request's session key, for the split.
            rng: the generator for a split without a session key.

        Returns:
            The named id, else the split's (by `session`, or at random by weight), else the default.

        Raises:
            KeyError: an unknown named id.
        """
        if named is not None:
            return self.entry(named).id
        if self.split is not None:
            return self.split.assign(session, rng)
        return self.default

    def preferred(self) -> list[str]:
        """The ids in the order a replica loads them.

        Returns:
            The default, the split's, then the rest.
        """
        order = [self.default, *(self.split.ids if self.split else ()), *self.ids]
        return list(dict.fromkeys(order))

    def as_config(self) -> dict[str, Any]:
        """The JSON-ready form a Serve `user_config` carries (`from_config` reads it).

        Returns:
            `{"policies": [...], "default": ..., "split": ...}`.
        """
        return {"policies": [entry.as_dict() for entry in self.entries], "default": self.default,
                "split": None if self.split is None else self.split.as_dict()}

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> PolicySet:
        """The inverse of `as_config`.

        Args:
            config: the form `as_config` gives.

        Returns:
            The set.

        Raises:
            ValueError: missing or wrong policies, split or default (naming what).
        """
        if not isinstance(config.get("policies"), list) or not config["policies"]:
            raise ValueError("the server config needs 'policies', a non-empty list of policy "
                             f"entries, received {type(config.get('policies')).__name__}")
        entries = [PolicyEntry.from_dict(item) for item in config["policies"]]
        split = config.get("split")
        if split is not None and not isinstance(split, Mapping):
            raise ValueError(f"'split' must be an object of id: weight, received {split!r}")
        return cls.build(entries, config.get("default"), split)
