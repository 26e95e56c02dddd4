"""The watch's record: an embedded SQLite database (WAL mode) of every policy taken, every
finished work item with its episodes, every match of a team scene and the pool's ratings,
every decision and every promotion.

A finished item is written in one transaction keyed by (policy fingerprint, item seed, item
index), with its episodes, so a killed watch leaves each item wholly there or not at all, and an
item run again (after a restart, or by Ray after a lost runner) is never counted twice. The
database is the record: decisions are recomputed from its items when a watch starts again, and
`huggy evaluate --db` renders the usual report from it (`evaluation_result`).

    store = WatchStore("out/watch/watch.db")
    store.check_settings({...})               # the first watch writes them, later ones compare
    store.add_policy(...); store.add_item(fingerprint, item)
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from deploy.evaluation.plan import EnvSpec, EvalConfig, PolicySpec
from deploy.evaluation.ratings import Match
from deploy.evaluation.results import EvaluationResult, ItemResult, PolicyResult

SCHEMA_VERSION = 1
SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS policies (
    seq INTEGER PRIMARY KEY, label TEXT NOT NULL UNIQUE, fingerprint TEXT NOT NULL,
    kind TEXT NOT NULL, run TEXT, step INTEGER, path TEXT, source TEXT NOT NULL,
    url TEXT, policy_id TEXT, folder TEXT, seen_at TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS items (
    fingerprint TEXT NOT NULL, seed INTEGER NOT NULL, item_index INTEGER NOT NULL,
    agent_steps INTEGER NOT NULL, seconds REAL NOT NULL, node_id TEXT NOT NULL,
    runner TEXT NOT NULL, attempts INTEGER NOT NULL, behavior TEXT, finished_at TEXT NOT NULL,
    PRIMARY KEY (fingerprint, seed, item_index));
CREATE TABLE IF NOT EXISTS episodes (
    fingerprint TEXT NOT NULL, seed INTEGER NOT NULL, item_index INTEGER NOT NULL,
    position INTEGER NOT NULL, slot INTEGER NOT NULL, episode_index INTEGER NOT NULL,
    episode_return REAL NOT NULL, length INTEGER NOT NULL, terminated INTEGER NOT NULL,
    PRIMARY KEY (fingerprint, seed, item_index, position),
    FOREIGN KEY (fingerprint, seed, item_index) REFERENCES items);
CREATE TABLE IF NOT EXISTS decisions (
    seq INTEGER PRIMARY KEY REFERENCES policies, decided_at TEXT NOT NULL, record TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS promotions (
    id INTEGER PRIMARY KEY AUTOINCREMENT, at TEXT NOT NULL, kind TEXT NOT NULL,
    label TEXT NOT NULL, previous TEXT, evidence TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS matches (
    seed INTEGER NOT NULL, match_index INTEGER NOT NULL, team0 TEXT NOT NULL,
    team1 TEXT NOT NULL, fingerprint0 TEXT NOT NULL, fingerprint1 TEXT NOT NULL,
    score REAL NOT NULL, reward0 REAL, reward1 REAL, steps INTEGER, runner TEXT NOT NULL,
    finished_at TEXT NOT NULL, PRIMARY KEY (seed, match_index));
CREATE TABLE IF NOT EXISTS pool_ratings (
    matches INTEGER PRIMARY KEY, rated_at TEXT NOT NULL, record TEXT NOT NULL);
"""


@dataclass(frozen=True)
class PolicyRecord:
    """A policy the watch took, in the order it was taken (`seq`, from 0)."""

    seq: int
    label: str
    fingerprint: str
    kind: str
    """"checkpoint" (a file of a followed run) or "served" (the policy `--serve` served when the
    watch began: the first baseline)."""
    run: str | None
    step: int | None
    path: str | None
    """The file the runners load: the watch's own copy of a checkpoint, taken when it was seen
    (so the trainer may delete the original), or a served policy's file; None where a served
    policy's file is not readable here (runners then query `url`)."""
    source: str
    """The original file, or the URL of the served policy."""
    seen_at: str
    """When its file was taken (UTC, ISO 8601)."""
    url: str | None = None
    policy_id: str | None = None
    folder: str | None = None
    """The results folder it came from."""

    def spec(self) -> PolicySpec:
        """The policy as the evaluation's runners take it.

        Returns:
            Its spec: the file where there is one, else the served policy's URL and id.
        """
        if self.path is None:
            return PolicySpec(label=self.label, url=self.url, policy_id=self.policy_id,
                              run=self.run, step=self.step)
        return PolicySpec(label=self.label, path=self.path, run=self.run, step=self.step,
                          folder=self.folder)


class WatchStore:
    """One watch's database; created with its tables where missing.

    Args:
        path: the SQLite file (its folder is created).

    Raises:
        ValueError: the file is a database of another schema version, or not one at all.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, isolation_level=None)
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            # a committed item survives the process being killed (not a power cut)
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute("PRAGMA foreign_keys=ON")
            with self._transaction():
                for statement in SCHEMA.split(";"):
                    if statement.strip():
                        self._db.execute(statement)
                found = self._meta("schema_version")
                if found is None:
                    self._set_meta("schema_version", str(SCHEMA_VERSION))
                elif found != str(SCHEMA_VERSION):
                    raise ValueError(f"{self.path}: a watch database of schema version {found}; "
                                     f"this huggy reads version {SCHEMA_VERSION}")
        except sqlite3.DatabaseError as error:
            self._db.close()
            raise ValueError(f"{self.path} is not a watch database: {error}") from None

    def close(self) -> None:
        """Close the database."""
        self._db.close()

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def _meta(self, key: str) -> str | None:
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def _set_meta(self, key: str, value: str) -> None:
        self._db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))

    def check_settings(self, settings: Mapping[str, Any]) -> None:
        """Record the watch's settings, or check them against those recorded: the episodes of a
        database were run with its settings, so a watch with others cannot use them.

        Args:
            settings: JSON-ready settings (what decides which episodes run and how they count).

        Raises:
            ValueError: the database holds other settings (naming each that differs).
        """
        wanted = json.loads(json.dumps(settings))
        with self._transaction():
            found = self._meta("settings")
            if found is None:
                self._set_meta("settings", json.dumps(wanted, sort_keys=True))
                return
        recorded, wanted = _flat(json.loads(found)), _flat(wanted)
        differ = sorted(key for key in set(recorded) | set(wanted)
                        if recorded.get(key) != wanted.get(key))
        if differ:
            shown = "; ".join(f"{key}: {recorded.get(key)!r} recorded, {wanted.get(key)!r} now"
                              for key in differ)
            raise ValueError(f"{self.path} holds a watch with other settings ({shown}); start "
                             "it with the same settings, or use another --db")

    def settings(self) -> dict[str, Any]:
        """The recorded settings.

        Returns:
            Them; {} before `check_settings`.
        """
        found = self._meta("settings")
        return {} if found is None else dict(json.loads(found))

    def add_policy(self, label: str, fingerprint: str, kind: str, source: str, seen_at: str,
                   path: str | None = None, run: str | None = None, step: int | None = None,
                   url: str | None = None, policy_id: str | None = None,
                   folder: str | None = None) -> PolicyRecord:
        """Record a policy the watch took, after the others.

        Args:
            label: its label (unique in the watch).
            fingerprint: its weights fingerprint.
            kind: "checkpoint" or "served".
            source: the original file, or the served policy's URL.
            seen_at: when its file was taken (UTC ISO).
            path: the file runners load (see `PolicyRecord.path`).
            run: its run, as labels carry it.
            step: its training step.
            url: the served policy's URL.
            policy_id: the served policy's id.
            folder: the results folder it came from.

        Returns:
            The record, with its `seq`.

        Raises:
            ValueError: the label was taken before.
        """
        with self._transaction():
            if self._db.execute("SELECT 1 FROM policies WHERE label = ?", (label,)).fetchone():
                raise ValueError(f"policy {label!r} is in {self.path} already")
            seq = self._db.execute("SELECT COUNT(*) FROM policies").fetchone()[0]
            self._db.execute(
                "INSERT INTO policies (seq, label, fingerprint, kind, run, step, path, source, "
                "url, policy_id, folder, seen_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (seq, label, fingerprint, kind, run, step, path, source, url, policy_id, folder,
                 seen_at))
        return PolicyRecord(seq, label, fingerprint, kind, run, step, path, source, seen_at, url,
                            policy_id, folder)

    def policies(self) -> list[PolicyRecord]:
        """Every policy taken.

        Returns:
            The records, in the order they were taken.
        """
        rows = self._db.execute(
            "SELECT seq, label, fingerprint, kind, run, step, path, source, seen_at, url, "
            "policy_id, folder FROM policies ORDER BY seq").fetchall()
        return [PolicyRecord(*row) for row in rows]

    def add_item(self, fingerprint: str, item: ItemResult, finished_at: str) -> bool:
        """Record a finished work item and its episodes, in one transaction.

        Args:
            fingerprint: its policy's fingerprint.
            item: the item's result.
            finished_at: when it came back (UTC ISO).

        Returns:
            True; False when the item was recorded before (nothing is written then).
        """
        with self._transaction():
            key = (fingerprint, item.seed, item.index)
            inserted = self._db.execute(
                "INSERT OR IGNORE INTO items (fingerprint, seed, item_index, agent_steps, "
                "seconds, node_id, runner, attempts, behavior, finished_at) VALUES "
                "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (*key, item.agent_steps, item.seconds, item.node_id, item.runner,
                 item.attempts, item.behavior, finished_at)).rowcount
            if not inserted:
                return False
            self._db.executemany(
                "INSERT INTO episodes (fingerprint, seed, item_index, position, slot, "
                "episode_index, episode_return, length, terminated) VALUES "
                "(?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [(*key, position, slot, index, value, length, int(ended))
                 for position, (slot, index, value, length, ended) in enumerate(zip(
                     item.slots, item.episode_indices, item.returns, item.lengths,
                     item.terminated, strict=True))])
        return True

    def items(self, fingerprint: str, policy_index: int = 0) -> list[ItemResult]:
        """A policy's recorded items.

        Args:
            fingerprint: its fingerprint.
            policy_index: the `policy_index` the results carry.

        Returns:
            The items, by index, each with its episodes in their recorded order.
        """
        episodes: dict[tuple[int, int], list[tuple[Any, ...]]] = {}
        for row in self._db.execute(
                "SELECT seed, item_index, slot, episode_index, episode_return, length, "
                "terminated FROM episodes WHERE fingerprint = ? ORDER BY item_index, position",
                (fingerprint,)):
            episodes.setdefault((row[0], row[1]), []).append(row[2:])
        found = []
        for seed, index, steps, seconds, node, runner, attempts, behavior in self._db.execute(
                "SELECT seed, item_index, agent_steps, seconds, node_id, runner, attempts, "
                "behavior FROM items WHERE fingerprint = ? ORDER BY item_index, seed",
                (fingerprint,)):
            rows = episodes.get((seed, index), [])
            found.append(ItemResult(
                policy_index=policy_index, index=index, seed=seed,
                returns=tuple(float(row[2]) for row in rows),
                lengths=tuple(int(row[3]) for row in rows),
                terminated=tuple(bool(row[4]) for row in rows),
                slots=tuple(int(row[0]) for row in rows),
                episode_indices=tuple(int(row[1]) for row in rows),
                agent_steps=steps, seconds=seconds, node_id=node, runner=runner,
                attempts=attempts, behavior=behavior))
        return found

    def counts(self) -> tuple[int, int]:
        """How much is recorded.

        Returns:
            (items, episodes).
        """
        items = self._db.execute("SELECT COUNT(*) FROM items").fetchone()[0]
        episodes = self._db.execute("SELECT COUNT(*) FROM episodes").fetchone()[0]
        return int(items), int(episodes)

    def record_decision(self, seq: int, decided_at: str, record: Mapping[str, Any]) -> str:
        """Keep a policy's decision (once: a decision recomputed after a restart keeps the time
        it was first made).

        Args:
            seq: the policy's `seq`.
            decided_at: now (UTC ISO).
            record: the decision, JSON-ready.

        Returns:
            When it was first decided.
        """
        with self._transaction():
            row = self._db.execute("SELECT decided_at FROM decisions WHERE seq = ?",
                                   (seq,)).fetchone()
            if row is not None:
                decided_at = row[0]
            self._db.execute("INSERT OR REPLACE INTO decisions (seq, decided_at, record) "
                             "VALUES (?, ?, ?)", (seq, decided_at, json.dumps(record)))
        return str(decided_at)

    def decisions(self) -> dict[int, tuple[str, dict[str, Any]]]:
        """The decisions kept.

        Returns:
            {seq: (decided_at, record)}.
        """
        return {seq: (at, json.loads(record)) for seq, at, record in
                self._db.execute("SELECT seq, decided_at, record FROM decisions ORDER BY seq")}

    def add_promotion(self, at: str, kind: str, label: str, previous: str | None,
                      evidence: Mapping[str, Any]) -> None:
        """Log a promotion.

        Args:
            at: when (UTC ISO).
            kind: "best" (the watch's best changed), "canary" (the endpoint gave it a share),
                "served" (the endpoint serves it), "rollback" (back to the previous one) or
                "failed" (the endpoint refused the change).
            label: the policy promoted.
            previous: the one before it.
            evidence: the decision behind it, JSON-ready.
        """
        with self._transaction():
            self._db.execute("INSERT INTO promotions (at, kind, label, previous, evidence) "
                             "VALUES (?, ?, ?, ?, ?)",
                             (at, kind, label, previous, json.dumps(evidence)))

    def promotions(self) -> list[dict[str, Any]]:
        """Every promotion logged.

        Returns:
            In order: each with `at`, `kind`, `label`, `previous` and `evidence`.
        """
        return [{"at": at, "kind": kind, "label": label, "previous": previous,
                 "evidence": json.loads(evidence)}
                for at, kind, label, previous, evidence in self._db.execute(
                    "SELECT at, kind, label, previous, evidence FROM promotions ORDER BY id")]

    def add_matches(self, played: Sequence[Match], fingerprints: Mapping[str, str], runner: str,
                    finished_at: str) -> int:
        """Record a batch of a team scene's matches, in one transaction, each keyed by (its seed,
        its index), so a match played again is never counted twice.

        Args:
            played: the matches.
            fingerprints: each label's policy fingerprint.
            runner: the runner that played them.
            finished_at: when they came back (UTC ISO).

        Returns:
            How many were new (a match recorded before is left as it was).

        Raises:
            KeyError: a label without a fingerprint.
        """
        rows = [(m.seed, m.index, m.team0, m.team1, fingerprints[m.team0],
                 fingerprints[m.team1], m.score, m.reward0, m.reward1, m.steps, runner,
                 finished_at) for m in played]
        with self._transaction():
            before = self._db.total_changes
            self._db.executemany(
                "INSERT OR IGNORE INTO matches (seed, match_index, team0, team1, fingerprint0, "
                "fingerprint1, score, reward0, reward1, steps, runner, finished_at) VALUES "
                "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
            return self._db.total_changes - before

    def matches(self) -> list[Match]:
        """Every recorded match of a team scene.

        Returns:
            The matches, by index.
        """
        return [Match(index, seed, team0, team1, score, reward0, reward1, steps)
                for index, seed, team0, team1, score, reward0, reward1, steps in self._db.execute(
                    "SELECT match_index, seed, team0, team1, score, reward0, reward1, steps "
                    "FROM matches ORDER BY match_index, seed")]

    def record_pool_ratings(self, matches: int, rated_at: str, record: Mapping[str, Any]) -> str:
        """Keep the pool's ratings after its first `matches` matches (once: ratings recomputed
        after a restart keep the time they were first made).

        Args:
            matches: how many matches, in index order, the ratings are of.
            rated_at: now (UTC ISO).
            record: the ratings, JSON-ready.

        Returns:
            When they were first rated.
        """
        with self._transaction():
            self._db.execute("INSERT OR IGNORE INTO pool_ratings (matches, rated_at, record) "
                             "VALUES (?, ?, ?)", (matches, rated_at, json.dumps(record)))
            row = self._db.execute("SELECT rated_at FROM pool_ratings WHERE matches = ?",
                                   (matches,)).fetchone()
        return str(row[0])

    def pool_ratings(self) -> list[tuple[int, str, dict[str, Any]]]:
        """The pool's ratings kept so far.

        Returns:
            [(matches, rated_at, record)], by matches.
        """
        return [(count, at, json.loads(record)) for count, at, record in self._db.execute(
            "SELECT matches, rated_at, record FROM pool_ratings ORDER BY matches")]


def _flat(settings: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested settings as {"config.seed": 0, ...}."""
    flat: dict[str, Any] = {}
    for key, value in settings.items():
        if isinstance(value, Mapping) and value:
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def evaluation_result(store: WatchStore) -> EvaluationResult:
    """A database as the result of an evaluation, for `huggy evaluate --db`: every policy the watch
    took, in order, with every recorded item; each policy's planned episodes are those it has.

    Args:
        store: the database.

    Returns:
        The result, as `deploy.evaluation.summary.build_report` takes it.

    Raises:
        ValueError: the database holds no watch yet.
    """
    settings = store.settings()
    if not settings:
        raise ValueError(f"{store.path} holds no watch: no settings recorded")
    records = store.policies()
    policies = []
    for index, record in enumerate(records):
        policy = PolicyResult(record.spec(), store.items(record.fingerprint, index),
                              fingerprint=record.fingerprint)
        policies.append(policy)
    config = settings["config"]
    result = EvaluationResult(policies, EvalConfig(**config), EnvSpec(**settings["env"]))
    result.planned_episodes = [sum(len(item.returns) for item in policy.items)
                               for policy in policies]
    return result


def settings_of(config: EvalConfig, env: EnvSpec, rule: Mapping[str, Any]) -> dict[str, Any]:
    """The settings a watch records (`WatchStore.check_settings`): what decides which episodes
    run and how they are counted and judged.

    Args:
        config: the evaluation settings of the work items.
        env: the environment.
        rule: the decision rule's settings.

    Returns:
        JSON-ready settings.
    """
    kept = {key: value for key, value in asdict(config).items()
            if key in ("episodes_per_item", "seed", "stochastic", "precision")}
    return {"config": kept, "env": asdict(env), "rule": dict(rule)}
