"""The watch itself: follow runs, take each complete checkpoint, run the items the sequential rule
needs next, record each finished item, decide, report, promote.

One pass of the loop (`Watch.run`):

1. poll every followed run for complete checkpoints; each is copied into the output folder (the
   trainer may delete the original past `keep_checkpoints`), fingerprinted and recorded;
2. ask the rule (`deploy.watch.decisions.Decider`) what the recorded items decide and which items
   it needs next, and give idle runners batches of those, most urgent first;
3. record each batch that came back, item by item (`deploy.watch.store`);
4. for each new decision: its progress line, the database, TensorBoard scalars in the run's own
   folder, `watch.json` (rewritten atomically), and with a new best, the promotion.

In a team scene a `TeamRating` (`deploy.watch.teams.PoolRating`) replaces steps 2 to 4: it plays
the next round the pool owes and refits the pool (no rule, no items, no promotion).

The watch ends when every run's trainer has finished and every checkpoint taken is decided (in a
team scene: the pool owes no match), or on Ctrl-C once the batches running then are recorded.
Started again on the same database, it takes the policies recorded there in the same order and
recomputes their decisions from the recorded items, as an uninterrupted watch would decide.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol, TextIO

from deploy.evaluation.plan import EvalConfig, PolicySpec, WorkItem, file_stem
from deploy.evaluation.report import write_report
from deploy.evaluation.sinks import write_model_cards, write_scalars
from deploy.evaluation.summary import build_report
from deploy.watch.decisions import (
    Candidate,
    Decider,
    Decision,
    Progress,
    RuleSettings,
    describe,
)
from deploy.watch.execution import Executor, Finished
from deploy.watch.follow import Checkpoint, RunFollower
from deploy.watch.store import PolicyRecord, WatchStore, evaluation_result
from huggy_agent.agent import weights_fingerprint
from huggy_agent.formats import load_policy

WATCH_FILE = "watch.json"
REPORT_FOLDER = "report"
"""Where, in the output folder, a watch keeps `huggy evaluate`'s report of its database."""
EVENTS_SUFFIX = ".huggy-watch"
"""The file-name suffix of the watch's TensorBoard event files (rewritten at each decision)."""
STATISTIC_TAGS = {"iqm": "IQM", "mean": "Mean", "median": "Median"}
POLL_S = 1.0
"""How long a pass waits for a batch before it polls the runs again, seconds."""



class TeamRating(Protocol):
    """A team scene's rating (`deploy.watch.teams.PoolRating`): the checkpoints play matches
    against a pool, which is refitted as they arrive."""

    def rate(self, policies: Sequence[PolicyRecord], store: WatchStore) -> bool:
        """Play the next round the pool owes (each batch recorded as it comes back) and refit it.

        Args:
            policies: every policy taken so far, in order.
            store: the database.

        Returns:
            True when the pool was refitted; False when it owed nothing and did not grow.
        """
        ...

    def owes(self) -> bool:
        """Whether the pool owes matches.

        Returns:
            True until every member has played its rounds.
        """
        ...

    def summary(self) -> dict[str, Any]:
        """What watch.json holds of the pool.

        Returns:
            "pool": the last refit's record (the ratings), or None before it; "best": the
                top-rated checkpoint, or None.
        """
        ...


def utc_now() -> str:
    """Now, as watch.json and the database give times.

    Returns:
        UTC, ISO 8601, to the millisecond.
    """
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds")


class Promotion:
    """What the watch does with a new best (`deploy.watch.promotion.Promoter` changes a running
    `huggy serve`; without `--serve` a new best is only logged)."""

    def promote(self, record: PolicyRecord, decision: Decision) -> None:
        """Start serving a new best.

        Args:
            record: its policy.
            decision: the decision that made it the best.
        """

    def tick(self) -> None:
        """Take the next step of a promotion under way, when it is due."""

    def done(self) -> bool:
        """Whether no promotion is under way.

        Returns:
            True.
        """
        return True


@dataclass
class WatchOptions:
    """How a watch runs."""

    out: Path
    """The output folder: watch.json, the checkpoints' copies."""
    poll_s: float = POLL_S
    tensorboard: bool = True
    """Write scalars into each run's own folder (beside the trainer's)."""
    stop_when_finished: bool = True
    """End when every run's trainer has finished and every checkpoint is decided."""
    follow: bool = True
    """Wait for the trainers to finish; False: end once the checkpoints there are decided (a
    finished run without `run_logs/timers.json`, one downloaded, say)."""
    stop: Callable[[], bool] | None = None
    """Asked at each pass: True ends the watch as Ctrl-C does (tests, benchmarks)."""
    report: bool = False
    """After each decision, rewrite `huggy evaluate`'s report of the database (its JSON, CSV and
    figures) in `out/report/` and each run's model card."""


class Watch:
    """One watch over some runs (module docstring).

    Args:
        store: the database (a new one, or one of an earlier session of this watch).
        followers: one per followed run.
        executor: where items run.
        config: the items' settings (`episodes_per_item`, `seed`).
        rule: the sequential rule.
        options: the output folder and the loop's settings.
        promotion: what a new best starts (default: nothing beyond the log).
        api_key: the key a served baseline's URL asks for.
        output: where progress lines go.
        rate_teams: a team scene's rating, in place of the rule (None: a single-behavior scene).
    """

    def __init__(self, store: WatchStore, followers: Sequence[RunFollower], executor: Executor,
                 config: EvalConfig, rule: RuleSettings, options: WatchOptions,
                 promotion: Promotion | None = None, api_key: str | None = None,
                 output: TextIO = sys.stdout, rate_teams: TeamRating | None = None) -> None:
        self.store = store
        self.followers = list(followers)
        self.executor = executor
        self.config = config
        self.rule = rule
        self.options = options
        self.promotion = promotion or Promotion()
        self.rate_teams = rate_teams
        self._api_key = api_key
        self._output = output
        self._decider = Decider(rule)
        self._records = store.policies()
        self._returns: dict[str, dict[int, tuple[float, ...]]] = {}
        for record in self._records:
            self._returns.setdefault(record.fingerprint, {
                item.index: item.returns for item in store.items(record.fingerprint)})
        self._running: set[tuple[str, int]] = set()
        self._failed: dict[str, str] = {}
        self._announced = {record["label"] for _, record in store.decisions().values()}
        self._rated: dict[str, tuple[str, dict[str, Any]]] = {}
        """label -> (when, estimate) of a policy's first rating, at its first look."""
        self._progress = Progress()
        for follower in self.followers:  # what an earlier session took is taken
            for record in self._records:
                if record.folder == str(follower.folder.resolve()) and record.step is not None:
                    follower.skip(Path(record.source).parent.name, record.step)

    # --- the loop ------------------------------------------------------------------------------

    def run(self) -> bool:
        """Watch until the runs' trainers have finished and every checkpoint is decided, or until
        Ctrl-C (or `options.stop`): then wait for the running batches and record them.

        Returns:
            True when it ended by itself; False when stopped.
        """
        try:
            while True:
                if self.options.stop is not None and self.options.stop():
                    break
                self.step(self.options.poll_s)
                if self.options.stop_when_finished and self.finished():
                    return True
        except KeyboardInterrupt:
            print("huggy watch: stopping once the running batches are back", file=sys.stderr,
                  flush=True)
        while self.executor.busy():
            self._collect(self.executor.wait(self.options.poll_s))
        if self.rate_teams is None:
            self._decide()
        else:
            self.write_summary()
        return False

    def step(self, timeout_s: float) -> None:
        """One pass: take new checkpoints, schedule, collect what came back, decide.

        Args:
            timeout_s: the longest wait for a batch.
        """
        for follower in self.followers:
            for checkpoint in follower.poll():
                self.take(checkpoint)
        if self.rate_teams is not None:
            if self.rate_teams.rate(self._records, self.store):
                self.write_summary()
            else:  # nothing owed: wait for a new checkpoint
                time.sleep(timeout_s)
            return
        self._decide()
        self._schedule()
        self._collect(self.executor.wait(timeout_s))
        self._decide()
        self.promotion.tick()

    def finished(self) -> bool:
        """Whether the watch is done: every trainer finished and its files taken, every checkpoint
        decided (in a team scene: the pool owes no match), nothing running, no promotion under
        way.

        Returns:
            True when it is.
        """
        return (all((follower.finished() or not self.options.follow) and not follower.settling
                    for follower in self.followers)
                and self._progress.pending is None and not self.executor.busy()
                and self.promotion.done()
                and (self.rate_teams is None or not self.rate_teams.owes()))

    # --- taking policies -----------------------------------------------------------------------

    def take(self, checkpoint: Checkpoint) -> PolicyRecord:
        """Take a complete checkpoint: copy it into the output folder, fingerprint it, record it.

        Args:
            checkpoint: the file.

        Returns:
            Its record.
        """
        seen_at = utc_now()
        copy = self.options.out / "checkpoints" / f"{file_stem(checkpoint.label)}" \
            f"{checkpoint.path.suffix}"
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(checkpoint.path, copy)
        fingerprint = weights_fingerprint(load_policy(copy))
        record = self.store.add_policy(
            checkpoint.label, fingerprint, "checkpoint", str(checkpoint.path), seen_at,
            path=str(copy), run=checkpoint.run, step=checkpoint.step,
            folder=str(checkpoint.folder.resolve()))
        self._add(record)
        print(f"{checkpoint.label}: seen ({checkpoint.path})", file=self._output, flush=True)
        return record

    def take_served(self, label: str, fingerprint: str, url: str, policy_id: str,
                    step: int | None, path: str | None) -> PolicyRecord:
        """Take the policy a `huggy serve` serves as the first baseline (a watch's first policy).

        Args:
            label: its label in the watch (its id).
            fingerprint: its weights fingerprint (`GET /v1/models`).
            url: the server.
            policy_id: its id there.
            step: its training step, if known.
            path: its file where readable here (runners load it), else None (they query `url`).

        Returns:
            Its record.
        """
        record = self.store.add_policy(label, fingerprint, "served", url, utc_now(), path=path,
                                       step=step, url=url, policy_id=policy_id)
        self._add(record)
        print(f"{label}: served at {url}, the baseline", file=self._output, flush=True)
        return record

    def _add(self, record: PolicyRecord) -> None:
        self._records.append(record)
        self._returns.setdefault(record.fingerprint, {})

    # --- items ---------------------------------------------------------------------------------

    def _strata(self, fingerprint: str, count: int) -> list[tuple[float, ...]] | None:
        recorded = self._returns.get(fingerprint, {})
        if any(index not in recorded for index in range(count)):
            return None
        return [recorded[index] for index in range(count)]

    def _candidates(self) -> list[Candidate]:
        return [Candidate(record.label, record.fingerprint, record.kind == "served")
                for record in self._records if record.fingerprint not in self._failed]

    def _wanted(self) -> list[tuple[str, int]]:
        """The items the rule needs and nobody runs: the first look of every policy first (a new
        checkpoint gets its first rating within seconds, even while a close call takes many
        items), then the rest, most urgent first. The order changes no decision."""
        wanted: list[tuple[str, int]] = []
        first = self.rule.looks[0]
        for need in sorted(self._progress.needs, key=lambda need: need.items > first):
            recorded = self._returns.get(need.fingerprint, {})
            for index in range(need.items):
                key = (need.fingerprint, index)
                if index not in recorded and key not in self._running and key not in wanted:
                    wanted.append(key)
        return wanted

    def _schedule(self) -> None:
        """Give idle runners batches of the wanted items: up to `batch_size` items of one policy,
        in index order."""
        wanted = self._wanted()
        specs = {record.fingerprint: self._spec(record) for record in self._records}
        while wanted and self.executor.free() > 0:
            fingerprint = wanted[0][0]
            batch = [key for key in wanted if key[0] == fingerprint][:self.executor.batch_size]
            wanted = [key for key in wanted if key not in batch]
            self._running.update(batch)
            self.executor.submit(fingerprint, specs[fingerprint], [
                WorkItem(0, index, self.config.seed + index, self.config.episodes_per_item)
                for _, index in batch])

    def _spec(self, record: PolicyRecord) -> PolicySpec:
        spec = record.spec()
        return spec if spec.url is None else replace(spec, api_key=self._api_key)

    def _collect(self, finished: list[Finished]) -> None:
        """Record what came back, item by item; a policy whose batch failed is left out of the
        rule from then on (named on stderr)."""
        for batch in finished:
            for item in batch.items:
                self._running.discard((batch.key, item.index))
            if batch.error is not None:
                label = next(r.label for r in self._records if r.fingerprint == batch.key)
                print(f"huggy watch: {label} failed and is left out: {batch.error}",
                      file=sys.stderr, flush=True)
                self._failed[batch.key] = batch.error
                continue
            at = utc_now()
            for result in batch.results:
                self.store.add_item(batch.key, result, at)
                self._returns[batch.key][result.index] = result.returns

    # --- decisions -----------------------------------------------------------------------------

    def _decide(self) -> None:
        """Recompute the decisions; record every one, and report and promote the new ones. A
        policy's first look, before its decision, gives its first rating (TensorBoard and
        watch.json show it until the decision replaces it)."""
        self._progress = self._decider.run(self._candidates(), self._strata)
        new = [d for d in self._progress.decisions if d.label not in self._announced]
        rated = self._rate_first_looks()
        if not new:
            if rated and self.options.tensorboard:
                self._write_tensorboard({record.folder for record in rated})
            if rated:
                self.write_summary()
            return
        by_label = {record.label: record for record in self._records}
        for decision in new:
            record = by_label[decision.label]
            self.store.record_decision(record.seq, utc_now(), decision.record())
            self._announced.add(decision.label)
            print(describe(decision, self.rule), file=self._output, flush=True)
            if decision.promoted:
                previous = decision.against
                self.store.add_promotion(utc_now(), "best", decision.label, previous,
                                         decision.record())
                if record.kind == "checkpoint" and previous is not None:
                    self.promotion.promote(record, decision)
        if self.options.tensorboard:
            self._write_tensorboard({by_label[d.label].folder for d in new}
                                    | {record.folder for record in rated})
        self.write_summary()
        if self.options.report:
            self.write_report()

    def write_report(self) -> list[Path]:
        """Rewrite `huggy evaluate`'s report of every episode recorded so far in
        `out/report/`, and each run's model card (in its results folder where that is writable,
        else in `out/report/model_cards/`).

        Returns:
            The files written.
        """
        report = build_report(evaluation_result(self.store))
        folder = self.options.out / REPORT_FOLDER
        paths = list(write_report(report, folder).values())
        return paths + write_model_cards(report, folder / "model_cards")

    def _rate_first_looks(self) -> list[PolicyRecord]:
        """The policies whose first look is recorded now, their first rating noted."""
        rated = []
        first = self.rule.looks[0]
        for record in self._records:
            strata = self._strata(record.fingerprint, first)
            if record.label in self._rated or strata is None:
                continue
            estimate = self._decider.estimate(record.fingerprint, strata)
            self._rated[record.label] = (utc_now(), {"value": estimate.value,
                                                     "ci": estimate.as_list(), "items": first})
            rated.append(record)
        return rated

    def _write_tensorboard(self, folders: set[str | None]) -> None:
        """Each checkpoint's statistic and its interval at its training step, in its behavior's
        folder of its run (where the trainer writes its own scalars): the decision's, else its
        first rating's (Evaluation/Decided 0 until the decision)."""
        name = STATISTIC_TAGS[self.rule.statistic]
        decided = self.store.decisions()
        points: dict[tuple[str, str], list[tuple[int, dict[str, float | None]]]] = {}
        for record in self._records:
            if record.folder not in folders or record.step is None:
                continue
            if record.seq in decided:
                estimate = decided[record.seq][1]["estimate"]
                episodes = decided[record.seq][1]["episodes"]
            elif record.label in self._rated:
                estimate = self._rated[record.label][1]
                episodes = estimate["items"] * self.config.episodes_per_item
            else:
                continue
            value, (low, high) = estimate["value"], estimate["ci"]
            behavior = Path(record.source).parent.name
            points.setdefault((str(record.folder), behavior), []).append((record.step, {
                f"Evaluation/{name}": value, f"Evaluation/{name} CI Low": low,
                f"Evaluation/{name} CI High": high, "Evaluation/Episodes": float(episodes),
                "Evaluation/Decided": float(record.seq in decided)}))
        for (folder, behavior), values in points.items():
            write_scalars({behavior: values}, folder, EVENTS_SUFFIX)

    def summary(self) -> dict[str, Any]:
        """What watch.json holds.

        Returns:
            The rule's settings; per policy its label, step, seen_at, its first rating at its
                first look (first_rated_at, first_rating), decided_at, estimate, episodes,
                decision (and the comparison behind it); the best; the promotions. In a team
                scene: per checkpoint its `rating` in the pool (Elo, interval, matches), the
                pool (`TeamRating.summary`) and its top-rated checkpoint as the best.
        """
        if self.rate_teams is not None:
            return self._team_summary(self.rate_teams)
        decided = self.store.decisions()
        checkpoints = []
        for record in self._records:
            entry: dict[str, Any] = {"label": record.label, "step": record.step,
                                     "kind": record.kind, "fingerprint": record.fingerprint,
                                     "source": record.source, "seen_at": record.seen_at,
                                     "decided_at": None, "decision": None}
            if record.fingerprint in self._failed:
                entry["decision"] = "failed"
                entry["error"] = self._failed[record.fingerprint]
            if record.label in self._rated:
                entry["first_rated_at"], entry["first_rating"] = self._rated[record.label]
            if record.seq in decided:
                at, found = decided[record.seq]
                entry.update({key: value for key, value in found.items()
                              if key not in ("seq", "label", "fingerprint")})
                entry["decided_at"] = at
            checkpoints.append(entry)
        best = self._progress.best
        return {"rule": self.rule.as_dict(),
                "episodes_per_item": self.config.episodes_per_item, "seed": self.config.seed,
                "checkpoints": checkpoints, "best": None if best is None else best.label,
                "pending": None if self._progress.pending is None
                else self._progress.pending.label,
                "promotions": self.store.promotions()}

    def _team_summary(self, rate_teams: TeamRating) -> dict[str, Any]:
        pool = rate_teams.summary()
        rated = (pool["pool"] or {}).get("ratings", {})
        checkpoints = [{"label": record.label, "step": record.step, "kind": record.kind,
                        "fingerprint": record.fingerprint, "source": record.source,
                        "seen_at": record.seen_at, "rating": rated.get(record.label)}
                       for record in self._records]
        return {"seed": self.config.seed, "checkpoints": checkpoints, **pool,
                "promotions": self.store.promotions()}

    def write_summary(self) -> Path:
        """Rewrite `watch.json` atomically (a temporary file, then `os.replace`).

        Returns:
            Its path.
        """
        path = self.options.out / WATCH_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{WATCH_FILE}.{os.getpid()}.tmp")
        temporary.write_text(json.dumps(self.summary(), indent=2) + "\n")
        os.replace(temporary, path)
        return path

