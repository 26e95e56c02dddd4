"""A replica's counters (`ReplicaMetrics`: what `/v1/info` shows, handed to Ray's metrics in
bulk), and a distribution on Ray's counters laid out as Prometheus lays out a histogram
(`BucketCounters`).

Ray's `Histogram` costs Ray's metrics agent one call per observation: the agent replays every
observation of every bucket into OpenTelemetry (`record_histogram_aggregated_batch`), a
measurable share of a request's cost (docs/benchmarks.md, "Batch sizes on counters").
`BucketCounters` keeps the same distribution on counters, which cost the agent one call per bucket and export,
whatever was counted: `<name>_bucket`, tagged `le`, counts the observations at most each bound
(`+Inf`: all of them), and `<name>_sum` their sum. PromQL reads them as a histogram:

    histogram_quantile(0.9, sum by (le) (rate(ray_huggy_batch_rows_bucket_total[5m])))
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from ray.serve.metrics import Counter

BATCH_BUCKETS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
"""The bucket bounds of the batch sizes, in requests and in observations."""
REPORT_PASSES = 256
"""Forward passes whose metrics are handed to Ray together (see `ReplicaMetrics.report`)."""


class BucketCounters:
    """The cumulative bucket counts and the sum of a series of observations, on Ray counters named
    `<name>_bucket` (tag `le`) and `<name>_sum`.

    Args:
        name: the series' name.
        description: what is observed.
        boundaries: the buckets' upper bounds, increasing.

    Raises:
        ValueError: boundaries that do not increase.
    """

    def __init__(self, name: str, description: str, boundaries: Sequence[float]) -> None:
        if list(boundaries) != sorted(set(boundaries)):
            raise ValueError(f"boundaries must increase, got {list(boundaries)}")
        self.boundaries = np.asarray(boundaries, dtype=np.float64)
        self.labels = [f"{bound:g}" for bound in boundaries] + ["+Inf"]
        """The `le` tag of each bucket, the last one holding every observation."""
        self._buckets = Counter(f"{name}_bucket", tag_keys=("le",),
                                description=f"{description}: observations at most `le`")
        self._sum = Counter(f"{name}_sum", description=f"{description}: their sum")

    def cumulative_counts(self, values: Sequence[float]) -> list[int]:
        """How many values fall at or under each bound.

        Args:
            values: the observations.

        Returns:
            How many are at most each boundary, then how many there are (`+Inf`).
        """
        buckets = np.searchsorted(self.boundaries, np.asarray(values, np.float64), side="left")
        return np.cumsum(np.bincount(buckets, minlength=len(self.labels))).tolist()

    def add(self, values: Sequence[float]) -> None:
        """Count observations: one call per bucket that holds any of them, and one for the sum.

        Args:
            values: the observations.
        """
        if not len(values):
            return
        for label, count in zip(self.labels, self.cumulative_counts(values), strict=True):
            if count:
                self._buckets.inc(count, tags={"le": label})
        total = float(np.sum(values))
        if total > 0:
            self._sum.inc(total)


class ReplicaMetrics:
    """A replica's counters: requests (answered alone or in batches, refused, abandoned by their
    client), forward passes, rows, the largest batch, policy loads, requests per policy; and the
    same handed to Ray's metrics (`huggy_forward_passes`, `huggy_batch_requests`,
    `huggy_batch_rows`, `huggy_policy_requests`).

    Not on every request: the metric calls are a measurable share of a one-observation answer,
    and Ray exports metrics every few seconds anyway. `report` hands over what was counted since
    the last report; it runs every `REPORT_PASSES` passes, at each health check and with
    `/v1/info`.
    """

    def __init__(self) -> None:
        self.counters = {"requests": 0, "requests_alone": 0, "rejected": 0, "forward_passes": 0,
                         "rows": 0, "largest_batch_requests": 0, "largest_batch_rows": 0,
                         "policy_loads": 0, "disconnected": 0}
        self.policy_requests: dict[str, int] = {}
        self._batch_requests = BucketCounters(
            "huggy_batch_requests", "Requests served per forward pass", BATCH_BUCKETS)
        self._batch_rows = BucketCounters(
            "huggy_batch_rows", "Observations per forward pass", BATCH_BUCKETS)
        self._forward_passes = Counter(
            "huggy_forward_passes", description="Forward passes of the policy network")
        self._requests_by_policy = Counter(
            "huggy_policy_requests", description="Requests answered, by policy",
            tag_keys=("policy",))
        self._unreported: list[tuple[int, int]] = []
        self._unreported_policies: dict[str, int] = {}

    def count_request(self, policy_id: str) -> None:
        """Count a request being answered.

        Args:
            policy_id: the policy answering it.
        """
        self.counters["requests"] += 1
        self.policy_requests[policy_id] = self.policy_requests.get(policy_id, 0) + 1
        self._unreported_policies[policy_id] = self._unreported_policies.get(policy_id, 0) + 1

    def count_batch(self, requests: int, rows: int) -> None:
        """Count a forward pass; every `REPORT_PASSES` passes, report.

        Args:
            requests: the requests it answered.
            rows: its observations.
        """
        counters = self.counters
        counters["forward_passes"] += 1
        counters["rows"] += rows
        counters["largest_batch_requests"] = max(counters["largest_batch_requests"], requests)
        counters["largest_batch_rows"] = max(counters["largest_batch_rows"], rows)
        self._unreported.append((requests, rows))
        if len(self._unreported) >= REPORT_PASSES:
            self.report()

    def summary(self) -> dict[str, float]:
        """The counters, as `/v1/info` shows them.

        Returns:
            Every counter, with the mean batch in requests and in rows.
        """
        counters: dict[str, float] = dict(self.counters)
        passes = counters["forward_passes"]
        counters["mean_batch_requests"] = counters["requests"] / passes if passes else 0.0
        counters["mean_batch_rows"] = counters["rows"] / passes if passes else 0.0
        return counters

    def report(self) -> None:
        """Hand what was counted since the last report to Ray's metrics. The batch sizes go on
        bucket counters, not Ray's `Histogram`, each of whose observations costs Ray's metrics
        agent a call."""
        if self._unreported:
            requests, rows = zip(*self._unreported, strict=True)
            self._batch_requests.add(requests)
            self._batch_rows.add(rows)
            self._forward_passes.inc(len(self._unreported))
        self._unreported.clear()
        for policy_id, count in self._unreported_policies.items():
            self._requests_by_policy.inc(count, tags={"policy": policy_id})
        self._unreported_policies.clear()
