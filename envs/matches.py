"""Matches in a scene whose two teams share a behavior (`B?team=0`, `B?team=1`, such as
SoccerTwos): one match is the first episode of one arena, one policy playing team 0 and another
team 1 (`play_matches`). A process of N arenas plays N matches at once.

Arenas: a scene holds one multi-agent group per team per arena, created team 0 then team 1, so
arena a's groups are 2a + 1 (team 0) and 2a + 2 (team 1): the order ML-Agents' SoccerTwos creates
them in, and what the stand-in SoccerTwos gives.

Seeds: match k of a call is played on arena k, whose next episode is seeded with the match's
seed (the environment parameter `arena_seed_K`, which the stand-in SoccerTwos reads; a build
that does not read it plays on), so a match seeded s plays the same wherever it runs. Team t of
a match seeded s draws its noise at its n-th decision with `step_seed(2 s + t, n)` (also in
deterministic play, where a policy without a mode, such as `heuristic:random`, still draws).

The result of a match is the sign of team 0's final group reward (as ML-Agents' ghost trainer
decides it): a win, a draw (0, such as a match cut by the step limit) or a loss.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from envs.behaviors import team_of
from envs.rollout import Agent, step_seed
from envs.teams import BehaviorRows, TeamsEnv

ARENA_SEED = "arena_seed_"
"""The environment parameter `arena_seed_K`: the seed of arena K's next episode."""


@dataclass(frozen=True)
class MatchPlan:
    """Match `index` with `seed`: the policy labelled `team0` plays team 0, `team1` team 1."""

    index: int
    seed: int
    team0: str
    team1: str


@dataclass(frozen=True)
class MatchOutcome:
    """How a match ended: each team's final group reward, the decisions it took, whether the
    step limit ended it, and team 0's score (1 win, 0.5 draw, 0 loss)."""

    index: int
    seed: int
    team0: str
    team1: str
    reward0: float
    reward1: float
    decisions: int
    truncated: bool

    @property
    def score(self) -> float:
        """Team 0's result, from the sign of its final group reward."""
        return 1.0 if self.reward0 > 0 else 0.0 if self.reward0 < 0 else 0.5


def team_behaviors(behaviors: Sequence[str]) -> tuple[str, str]:
    """The behaviors of team 0 and team 1 of a scene whose two teams share a behavior.

    Args:
        behaviors: the scene's behaviors.

    Returns:
        (team 0's behavior, team 1's).

    Raises:
        ValueError: the scene is not of two teams sharing one behavior (naming its behaviors).
    """
    by_team = {team_of(b): b for b in behaviors}
    names = {b.split("?team=")[0] for b in behaviors}
    if len(behaviors) != 2 or set(by_team) != {0, 1} or len(names) != 1:
        raise ValueError(f"matches need a scene whose two teams share one behavior (B?team=0, "
                         f"B?team=1), this one has {list(behaviors)}")
    return by_team[0], by_team[1]


def arena_of(group_id: np.ndarray) -> np.ndarray:
    """The arena of each row's group (groups 2a + 1 and 2a + 2 are arena a's).

    Args:
        group_id: the rows' group ids.

    Returns:
        int64 arena indices.
    """
    return (np.asarray(group_id, np.int64) - 1) // 2


def arenas_in(rows: Mapping[str, BehaviorRows], behaviors: Sequence[str]) -> int:
    """How many arenas have an agent of `behaviors` deciding among `rows` (after a reset: every
    arena of the scene).

    Args:
        rows: each behavior's rows.
        behaviors: the behaviors counted.

    Returns:
        The number of arenas.
    """
    return len(np.unique(np.concatenate([arena_of(rows[b].group_id[:rows[b].deciding])
                                         for b in behaviors])))


def count_arenas(env: TeamsEnv) -> int:
    """The arenas of `env`'s scene, counted from the agents of a reset.

    Args:
        env: an open environment of a scene whose two teams share a behavior.

    Returns:
        How many arenas have agents deciding after the reset (`arenas_in`).

    Raises:
        ValueError: the scene is not one of two teams sharing a behavior (`team_behaviors`).
    """
    return arenas_in(env.reset(), team_behaviors(env.behaviors))


def play_matches(env: TeamsEnv, plans: Sequence[MatchPlan], agents: Mapping[str, Agent],
                 deterministic: bool = False) -> list[MatchOutcome]:
    """Play matches at once, plan k on arena k, each until its arena's first episode ends.

    Rows of other arenas, and of an arena whose match is over, get zero actions.

    Args:
        env: a scene of two teams sharing one behavior, with at least as many arenas as plans.
        plans: the matches.
        agents: {label: agent} for every label the plans name.
        deterministic: the policies' mean actions, or draws.

    Returns:
        One outcome per plan, in order.

    Raises:
        ValueError: a label `agents` lacks, a scene not of two teams sharing a behavior, or fewer
            arenas than plans.
    """
    if not plans:
        return []
    missing = sorted(({p.team0 for p in plans} | {p.team1 for p in plans}) - set(agents))
    if missing:
        raise ValueError(f"no policy for {missing}")
    behaviors = team_behaviors(env.behaviors)
    env.set_parameters({f"{ARENA_SEED}{k}": plan.seed for k, plan in enumerate(plans)})
    rows = env.reset()
    arenas = arenas_in(rows, behaviors)
    if arenas < len(plans):  # the matches beyond the scene's arenas would never end
        raise ValueError(f"{len(plans)} matches at once need {len(plans)} arenas; the scene has "
                         f"{arenas} (lower --arenas, or give the scene more)")
    rewards = np.full((len(plans), 2), np.nan)
    truncated = np.zeros(len(plans), bool)
    decisions = np.zeros((len(plans), 2), np.int64)
    while np.isnan(rewards).any():
        actions = {}
        for team, behavior in enumerate(behaviors):
            actions[behavior] = _act(rows[behavior], team, plans, agents, decisions, rewards,
                                     env, deterministic)
        rows = env.step(actions)
        for team, behavior in enumerate(behaviors):
            found = rows[behavior]
            for arena, reward, interrupted in zip(arena_of(found.group_id[found.done]),
                                                  found.group_reward[found.done],
                                                  found.interrupted[found.done], strict=True):
                if 0 <= arena < len(plans) and np.isnan(rewards[arena, team]):
                    rewards[arena, team] = reward
                    truncated[arena] |= bool(interrupted)
    return [MatchOutcome(plan.index, plan.seed, plan.team0, plan.team1, float(rewards[k, 0]),
                         float(rewards[k, 1]), int(decisions[k].max()), bool(truncated[k]))
            for k, plan in enumerate(plans)]


def _act(rows: BehaviorRows, team: int, plans: Sequence[MatchPlan], agents: Mapping[str, Agent],
         decisions: np.ndarray, rewards: np.ndarray, env: TeamsEnv, deterministic: bool
         ) -> tuple[np.ndarray | None, np.ndarray | None]:
    """One team's actions: each running match's rows by its own policy, one call per arena."""
    layout = env.layouts[rows.behavior]
    deciding = rows.deciding
    continuous = np.zeros((deciding, layout.continuous_size), np.float32)
    discrete = np.zeros((deciding, len(layout.discrete_branches)), np.int32)
    arenas = arena_of(rows.group_id[:deciding])
    for arena in np.unique(arenas):
        if not 0 <= arena < len(plans) or not np.isnan(rewards[arena, team]):
            continue
        plan = plans[arena]
        picked = np.flatnonzero(arenas == arena)
        obs = [o[picked] for o in rows.obs]
        mask = None if rows.mask is None else rows.mask[picked]
        agent = agents[plan.team0 if team == 0 else plan.team1]
        # a seed in deterministic play too: a policy without a mode (heuristic:random) uses it
        seed = step_seed(2 * plan.seed + team, int(decisions[arena, team]))
        result = agent.compute_action(obs[0] if len(obs) == 1 else obs,
                                      deterministic=deterministic, seed=seed, action_mask=mask)
        decisions[arena, team] += 1
        if layout.continuous_size and layout.discrete_branches:
            continuous[picked], discrete[picked] = result.continuous, result.discrete
        elif layout.discrete_branches:
            discrete[picked] = result
        else:
            continuous[picked] = result
    return continuous, discrete
