"""Batch evaluation of policies on many environments, in this process or on Ray runners.

    plan.py        what to run: policies, environment, settings, work items (fixed seeds)
    runner.py      the runner: one environment (K Unity instances), local policy copies, K items
                   at a time, one per instance
    scheduling.py  running the items: the plain loop, and Ray runners with Ray's fault tolerance
    results.py     what came back: episodes per item, per policy, per evaluation
    statistics.py  mean, median, IQM with stratified-bootstrap intervals, probability of
                   improvement, performance profiles: pure functions over episodes by item
    selection.py   the adaptive selection rule (`--select-best`), pure as well
    sinks.py       TensorBoard scalars and Hugging Face model cards from a finished evaluation

The report (table, CSV, JSON, chart) is `deploy.report`. Ray is imported only inside the
functions that need it.
"""

from deploy.evaluation.plan import (
    EnvSpec,
    EvalConfig,
    PolicySpec,
    SelectionConfig,
    WorkItem,
    expand_policies,
    plan_items,
    short_label,
    stand_in_behavior,
)
from deploy.evaluation.results import EvaluationResult, ItemResult, PolicyResult, RunnerInfo
from deploy.evaluation.runner import EnvironmentCrashed, Runner
from deploy.evaluation.scheduling import (
    EvaluationError,
    RunnerPool,
    evaluate_on_ray,
    evaluate_plain,
    ray_session,
)
from deploy.evaluation.selection import Selection

__all__ = [
    "EnvSpec", "EnvironmentCrashed", "EvalConfig", "EvaluationError", "EvaluationResult",
    "ItemResult", "PolicyResult", "PolicySpec", "Runner", "RunnerInfo", "RunnerPool", "Selection",
    "SelectionConfig", "WorkItem",
    "evaluate_on_ray", "evaluate_plain", "expand_policies", "plan_items", "ray_session",
    "short_label", "stand_in_behavior",
]
