"""A distribution on Ray's counters, laid out as Prometheus lays out a histogram.

Ray's `Histogram` costs Ray's metrics agent one call per observation: the agent replays every
observation of every bucket into OpenTelemetry (`record_histogram_aggregated_batch`, Ray
2.60), 15-35 us apiece on a 2-core host. Two histograms observed per forward pass made the
agent spend about 30 us more per request at 1 client (docs/benchmarks.md). `BucketCounters`
keeps the same distribution on counters, which cost the agent one call per bucket and export,
whatever was counted: `<name>_bucket`, tagged `le`, counts the observations at most each bound
(`+Inf`: all of them), and `<name>_sum` their sum. PromQL reads them as a histogram:

    histogram_quantile(0.9, sum by (le) (rate(ray_huggy_batch_rows_bucket_total[5m])))
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from ray.serve.metrics import Counter


class BucketCounters:
    """The cumulative bucket counts and the sum of a series of observations, on Ray counters
    named `<name>_bucket` (tag `le`) and `<name>_sum`."""

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
        """How many of `values` are at most each boundary, then how many there are (`+Inf`)."""
        buckets = np.searchsorted(self.boundaries, np.asarray(values, np.float64), side="left")
        return np.cumsum(np.bincount(buckets, minlength=len(self.labels))).tolist()

    def add(self, values: Sequence[float]) -> None:
        """Count `values`, one observation each: one call per bucket that holds any of them,
        and one for the sum."""
        if not len(values):
            return
        for label, count in zip(self.labels, self.cumulative_counts(values), strict=True):
            if count:
                self._buckets.inc(count, tags={"le": label})
        total = float(np.sum(values))
        if total > 0:
            self._sum.inc(total)
