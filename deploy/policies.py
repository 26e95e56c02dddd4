"""Many policies behind one endpoint: the catalogue of served policies and A/B splits.

A policy id keys everything a server does per policy (route, loader, batch queue, counters). Ids
are the labels `huggy evaluate` gives: `<run>@<step>` for each checkpoint of a results folder,
`<parent>/<file>` for a file (`deploy.evaluation.plan.expand_policies`).

    entries = catalogue(["results/Huggy", "b/Huggy.onnx"])      # every checkpoint, by step
    split = Split.parse("Huggy@2000343=0.9,b/Huggy.onnx=0.1", [e.id for e in entries])
    split.assign("user-17")      # the same id for this session key on every machine, always
    split.assign(None, rng)      # at random by weight

No Ray and no web framework here, so the rules are testable on their own.
"""

from __future__ import annotations

import bisect
import hashlib
import math
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import MISSING, asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

POLICY_ID_HEADER = "serve_multiplexed_model_id"
"""The request header Ray Serve reads a multiplexed model id from; here a policy id."""
SESSION_KEY_LIMIT = 256
"""Longest accepted `"session"` key, in characters."""
_HASH_PERSON = b"huggy-split"


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
        """JSON-ready."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PolicyEntry:
        """The inverse of `as_dict`; ValueError naming a missing or unknown field."""
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
    """The policies named by `sources`, in order: a file is one policy, a results folder every
    checkpoint in it by step, each labelled as `huggy evaluate` labels it.

    Each file is loaded once to read its interface and fingerprint. Raises FileNotFoundError
    for a missing path, ValueError for an empty list or a folder without policies, and
    `huggy_agent.PolicyLoadError` for a file that cannot be loaded (naming the file).
    """
    from deploy.evaluation.plan import expand_policies, unique_labels
    from huggy_agent.agent import weights_fingerprint
    from huggy_agent.formats import load_policy

    if not sources:
        raise ValueError("expected at least one policy (a .pt, an .onnx or a results folder)")
    entries = []
    for source in sources:
        for spec in expand_policies([source]):
            path = str(Path(spec.path).resolve())  # type: ignore[arg-type]
            loaded = load_policy(path)
            interface = loaded.arch.spec
            entries.append(PolicyEntry(
                id=spec.label, path=path, source=str(source), interface=interface.describe(),
                spec=interface.as_dict(), fingerprint=weights_fingerprint(loaded),
                step=spec.step if spec.step is not None else loaded.step))
    ids = unique_labels([entry.id for entry in entries])  # as evaluation labels repeats
    return [replace(entry, id=entry_id) for entry, entry_id in zip(entries, ids, strict=True)]


def unknown_policy_message(policy_id: str, known: Iterable[str]) -> str:
    """What a request for a policy that is not served is told: the id and the known ones."""
    return f"no policy {policy_id!r} is served here; known policies: {', '.join(known)}"


def session_point(key: str) -> float:
    """Where the session `key` falls in [0, 1): the first 8 bytes of its BLAKE2b hash (UTF-8),
    as a fraction of 2**64. The same on every machine, process and Python version."""
    digest = hashlib.blake2b(key.encode("utf-8"), digest_size=8, person=_HASH_PERSON).digest()
    return int.from_bytes(digest, "big") / 2.0**64


@dataclass(frozen=True)
class Split:
    """Traffic split over policies: `ids` with relative `weights` (any positive total)."""

    ids: tuple[str, ...]
    weights: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.ids:
            raise ValueError("a split needs at least one policy")
        if len(self.ids) != len(self.weights):
            raise ValueError(f"a split needs one weight per policy, received {len(self.ids)} "
                             f"ids and {len(self.weights)} weights")
        repeated = sorted({i for i in self.ids if self.ids.count(i) > 1})
        if repeated:
            raise ValueError(f"each policy may appear once in a split, received {repeated} "
                             "more than once")
        for policy_id, weight in zip(self.ids, self.weights, strict=True):
            if isinstance(weight, bool) or not isinstance(weight, int | float) \
                    or not math.isfinite(weight) or weight < 0:
                raise ValueError(f"split weight of {policy_id!r} must be a finite number >= 0, "
                                 f"received {weight!r}")
        if not sum(self.weights) > 0:
            raise ValueError(f"split weights must not all be zero, received {self.as_dict()}")

    @classmethod
    def parse(cls, text: str, known: Sequence[str] | None = None) -> Split:
        """A split from `ID=WEIGHT,ID=WEIGHT,...` (such as `a@100=0.9,b@200=0.1`; an id may
        itself hold '=': the last one separates the weight). With `known`, every id must be one
        of them. ValueError naming what was expected and what came."""
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"--split expects ID=WEIGHT,ID=WEIGHT,..., received {text!r}")
        ids, weights = [], []
        for part in text.split(","):
            policy_id, equals, weight_text = part.strip().rpartition("=")
            if not equals or not policy_id:
                raise ValueError(f"--split expects ID=WEIGHT,ID=WEIGHT,..., received {part!r} "
                                 f"in {text!r}")
            try:
                weight = float(weight_text)
            except ValueError:
                raise ValueError(f"--split: the weight of {policy_id!r} must be a number, "
                                 f"received {weight_text!r}") from None
            ids.append(policy_id)
            weights.append(weight)
        return cls.from_weights(cls(tuple(ids), tuple(weights)), known)

    @classmethod
    def from_weights(cls, weights: Mapping[str, float] | Split,
                     known: Sequence[str] | None = None) -> Split:
        """A split from `{id: weight}` (a server config's form); with `known`, every id must be
        one of them (ValueError listing the known ids)."""
        split = weights if isinstance(weights, Split) else cls(tuple(weights),
                                                              tuple(weights.values()))
        if known is not None:
            unknown = [policy_id for policy_id in split.ids if policy_id not in known]
            if unknown:
                raise ValueError(f"split names policies that are not served: {unknown}; known "
                                 f"policies: {', '.join(known)}")
        return split

    def as_dict(self) -> dict[str, float]:
        """`{id: weight}`, as given."""
        return dict(zip(self.ids, self.weights, strict=True))

    def shares(self) -> dict[str, float]:
        """`{id: weight / total}`."""
        total = sum(self.weights)
        return {policy_id: weight / total
                for policy_id, weight in zip(self.ids, self.weights, strict=True)}

    def _bounds(self) -> list[float]:
        total, running, bounds = sum(self.weights), 0.0, []
        for weight in self.weights:
            running += weight
            bounds.append(running / total)
        return bounds

    def pick(self, point: float) -> str:
        """The policy whose share of [0, 1) holds `point` (shares in the order of `ids`)."""
        bounds = self._bounds()
        index = min(bisect.bisect_right(bounds, point), len(self.ids) - 1)
        while self.weights[index] == 0:  # a zero-weight policy owns no point
            index -= 1
        return self.ids[index]

    def assign(self, session: str | None, rng: random.Random | None = None) -> str:
        """The policy for a request: by the stable hash of `session` (`session_point`), or at
        random by weight without one (`rng`, default the module's generator)."""
        point = session_point(session) if session is not None else (rng or random).random()
        return self.pick(point)


def check_session_key(session: Any) -> str | None:
    """A request's `"session"` value: None or a string of 1 to `SESSION_KEY_LIMIT` characters;
    ValueError naming what came otherwise."""
    if session is None:
        return None
    if not isinstance(session, str) or not 1 <= len(session) <= SESSION_KEY_LIMIT:
        shown = (f"a string of {len(session)} characters" if isinstance(session, str)
                 else f"a {type(session).__name__}")
        raise ValueError(f"'session' must be a string of 1 to {SESSION_KEY_LIMIT} characters "
                         f"(the key that keeps a user on one policy of the split), received "
                         f"{shown}")
    return session


@dataclass(frozen=True)
class PolicySet:
    """What a server serves: its policies, the default one, and the split of `/v1/act`."""

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
        """The set of `entries`; `default` None is the first; `split` as `--split` text, a
        `{id: weight}` mapping or a `Split` (ValueError naming what is wrong)."""
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
        """The entry of `policy_id`; KeyError with `unknown_policy_message` if not served."""
        for entry in self.entries:
            if entry.id == policy_id:
                return entry
        raise KeyError(unknown_policy_message(policy_id, self.ids))

    def choose(self, named: str | None, session: str | None = None,
               rng: random.Random | None = None) -> str:
        """The policy of a request: the one it `named` (path or header), else the split's
        (by `session`, or at random by weight), else the default. KeyError for an unknown
        named id."""
        if named is not None:
            return self.entry(named).id
        if self.split is not None:
            return self.split.assign(session, rng)
        return self.default

    def preferred(self) -> list[str]:
        """Ids in the order a replica loads them: the default, the split's, then the rest."""
        order = [self.default, *(self.split.ids if self.split else ()), *self.ids]
        return list(dict.fromkeys(order))

    def as_config(self) -> dict[str, Any]:
        """The JSON-ready form a Serve `user_config` carries (`from_config` reads it)."""
        return {"policies": [entry.as_dict() for entry in self.entries], "default": self.default,
                "split": None if self.split is None else self.split.as_dict()}

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> PolicySet:
        """The inverse of `as_config`; ValueError naming what is missing or wrong."""
        if not isinstance(config.get("policies"), list) or not config["policies"]:
            raise ValueError("the server config needs 'policies', a non-empty list of policy "
                             f"entries, received {type(config.get('policies')).__name__}")
        entries = [PolicyEntry.from_dict(item) for item in config["policies"]]
        split = config.get("split")
        if split is not None and not isinstance(split, Mapping):
            raise ValueError(f"'split' must be an object of id: weight, received {split!r}")
        return cls.build(entries, config.get("default"), split)
