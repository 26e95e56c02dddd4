"""`huggy watch`: follow training runs, rate each checkpoint as it lands against the best so far
with a stated error, keep every episode in an embedded database, and promote a proven better
policy to a running `huggy serve`.

    follow.py      which checkpoints of `results/<run>/` folders are complete, and whether each
                   run's trainer has finished
    store.py       the SQLite record: policies, items with their episodes, a team scene's
                   matches and its pool's ratings, decisions, promotions
    decisions.py   the sequential rule, as pure functions over episodes by work item
    promotion.py   changing a running `huggy serve`: canary share, then all of it; rollback
    execution.py   running work items in this process; on_ray.py on Ray runners
    teams.py       team scenes: each checkpoint's matches against a pool, and the pool's
                   Bradley-Terry refit; teams_ray.py plays them on the tournament's Ray runners
    loop.py        the watch itself: follow, schedule, record, decide, report, promote
    command.py     the work behind the `huggy watch` command (its parser is in deploy/cli.py)

Only `on_ray.py` and `teams_ray.py` import Ray; nothing imports this package but the CLI.
"""
