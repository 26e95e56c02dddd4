"""Batch evaluation of policies on many environments, in this process or on Ray runners.

    plan.py        what to run: policies, environment, settings, work items (fixed seeds); data
    sources.py     where the policies come from (files, results folders, hf://, a served URL)
    runner.py      the runner: one environment (K Unity instances), local policy copies, K items
                   at a time, one per instance
    scheduling.py  which items run (the uniform plan or the selection's rounds), the plain loop
    on_ray.py      the items on Ray runners, with Ray's fault tolerance
    results.py     what came back: episodes per item, per policy, per evaluation
    statistics.py  mean, median, IQM with stratified-bootstrap intervals, probability of
                   improvement, performance profiles: pure functions over episodes by item
    selection.py   the adaptive selection rule (`--select-best`), pure as well
    summary.py     the one report: summaries, comparisons and the best policy, computed once
    report.py      the report as a table, JSON, CSV and PNGs; charts.py draws the PNGs
    sinks.py       TensorBoard scalars and Hugging Face model cards from the report

Only `on_ray.py` imports Ray.
"""
