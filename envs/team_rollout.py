"""`rollout_teams`: every behavior of a scene, each played by its own policy, until each team has
counted its episodes; the summary per team (`huggy rollout --policy KEY=POLICY ...`).

What a team counts are the episodes of its units. A unit is a multi-agent group (SoccerTwos: one
team of one arena, whose episode is one match from that team's side), or, for an agent in no
group, the agent's slot (slot s is the s-th agent to decide after the reset; a finished agent's
successor takes the lowest free slot of its behavior, as `envs.instance` keeps them). Units are
fixed at the reset, and each team's N episodes are spread over its units by per-slot quotas
(`envs.rollout.slot_quotas`): unit u counts its first q_u episodes, so no episode is chosen by
how soon it ended.

An episode's return is its group's rewards plus the mean of its agents' own rewards (an agent
without a group: its own rewards); its result is the sign of its final group reward (without a
group: of its return): a win, a draw (such as a match cut by the step limit) or a loss. In
SoccerTwos a goal ends the match, so a team's goals are its wins.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from envs.behaviors import team_of
from envs.rollout import Agent, slot_quotas, step_seed
from envs.teams import BehaviorRows, TeamsEnv


@dataclass(frozen=True)
class TeamEpisode:
    """One counted episode of one unit."""

    behavior: str
    team: int
    unit: str
    """"group G", or "slot S" for an agent in no group."""
    index: int
    """Its index among the unit's episodes since the reset."""
    episode_return: float
    length: int
    result: float
    """1 win, 0.5 draw, 0 loss (see the module docstring)."""
    truncated: bool


@dataclass(frozen=True)
class TeamSummary:
    """One team's counted episodes, in numbers."""

    team: int
    behaviors: tuple[str, ...]
    episodes: int
    wins: int
    draws: int
    losses: int
    mean_return: float
    mean_length: float


@dataclass
class TeamRolloutResult:
    """Every team's counted episodes in (team, unit, index) order, agent-steps and wall time."""

    episodes: list[TeamEpisode] = field(default_factory=list)
    agent_steps: int = 0
    seconds: float = 0.0

    def by_team(self) -> list[TeamSummary]:
        """Each team's counted episodes, in numbers.

        Returns:
            The summary of each team that counted episodes, by team number.
        """
        found = []
        for team in sorted({e.team for e in self.episodes}):
            mine = [e for e in self.episodes if e.team == team]
            found.append(TeamSummary(
                team, tuple(sorted({e.behavior for e in mine})), len(mine),
                sum(e.result == 1.0 for e in mine), sum(e.result == 0.5 for e in mine),
                sum(e.result == 0.0 for e in mine),
                float(np.mean([e.episode_return for e in mine])),
                float(np.mean([e.length for e in mine]))))
        return found


class _Units:
    """The units of one behavior and their running episodes."""

    def __init__(self, behavior: str, rows: BehaviorRows) -> None:
        self.behavior = behavior
        deciding = rows.deciding
        groups = rows.group_id[:deciding]
        self.slot_of: dict[int, int] = {}  # agent id -> slot, for agents in no group
        names = []
        for agent, group in zip(rows.agent_id[:deciding].tolist(), groups.tolist(), strict=True):
            if group:
                name = f"group {group}"
            else:
                self.slot_of[agent] = len(self.slot_of)
                name = f"slot {self.slot_of[agent]}"
            if name not in names:
                names.append(name)
        self.names = names
        self.group_reward = dict.fromkeys(names, 0.0)
        self.own_reward = dict.fromkeys(names, 0.0)
        self.members: dict[str, set[int]] = {name: set() for name in names}
        self.length = dict.fromkeys(names, 0)
        self.finished = dict.fromkeys(names, 0)

    def unit(self, agent: int, group: int, done: bool) -> str | None:
        """The unit of a row (None for an agent outside the units fixed at the reset)."""
        if group:
            name = f"group {group}"
            return name if name in self.group_reward else None
        slot = self.slot_of.get(agent)
        if slot is None and not done:  # a successor takes the lowest free slot
            taken = set(self.slot_of.values())
            free = [s for s in range(len([n for n in self.names if n.startswith("slot")]))
                    if s not in taken]
            if not free:
                return None
            slot = self.slot_of[agent] = free[0]
        return None if slot is None else f"slot {slot}"


def rollout_teams(env: TeamsEnv, agents: Mapping[str, Agent], episodes: int = 20,
                  seed: int | None = None, deterministic: bool = True,
                  progress: Callable[[TeamEpisode], None] | None = None) -> TeamRolloutResult:
    """Drive every behavior of a scene with its policy until every team has counted its episodes
    (units and quotas: the module docstring).

    Behavior b (in the scene's order) draws its noise at decision t with
    `step_seed(B * seed + b, t)`, B the number of behaviors (also in deterministic play, for a
    policy without a mode).

    Args:
        env: the scene.
        agents: {behavior: agent}, one for every behavior.
        episodes: the episodes each team counts, >= 1.
        seed: resets the scene with it and seeds the noise; None: the policies draw fresh noise.
        deterministic: the policies' mean actions, or draws.
        progress: called with each counted episode as it ends.

    Returns:
        Every team's counted episodes in (team, unit, index) order, agent-steps and wall time.

    Raises:
        ValueError: a behavior without an agent, or `episodes` < 1.
    """
    if episodes < 1:
        raise ValueError(f"episodes must be >= 1, got {episodes}")
    missing = [b for b in env.behaviors if b not in agents]
    if missing:
        raise ValueError(f"no policy plays {missing}; give one for every behavior of the scene "
                         f"{list(env.behaviors)}")
    start = time.perf_counter()
    rows = env.reset(seed)
    units = {b: _Units(b, rows[b]) for b in env.behaviors}
    quotas: dict[str, dict[str, int]] = {}
    for team in sorted({team_of(b) for b in env.behaviors}):
        names = [(b, n) for b in env.behaviors if team_of(b) == team for n in units[b].names]
        for (behavior, name), quota in zip(names, slot_quotas(episodes, len(names)),
                                           strict=True):
            quotas.setdefault(behavior, {})[name] = int(quota)
    result = TeamRolloutResult()
    step = 0
    while any(units[b].finished[n] < q for b in env.behaviors for n, q in quotas[b].items()):
        actions = {}
        for index, behavior in enumerate(env.behaviors):
            found = rows[behavior]
            if not found.deciding:
                continue
            obs = [o[:found.deciding] for o in found.obs]
            seed_t = None if seed is None else step_seed(len(env.behaviors) * seed + index, step)
            action = agents[behavior].compute_action(
                obs[0] if len(obs) == 1 else obs, deterministic=deterministic, seed=seed_t,
                action_mask=found.mask)
            layout = env.layouts[behavior]
            if layout.continuous_size and layout.discrete_branches:
                actions[behavior] = (action.continuous, action.discrete)
            elif layout.discrete_branches:
                actions[behavior] = (None, action)
            else:
                actions[behavior] = (action, None)
            result.agent_steps += found.deciding
        rows = env.step(actions)
        step += 1
        for behavior in env.behaviors:
            _record(units[behavior], rows[behavior], quotas[behavior], result, progress)
    result.episodes.sort(key=lambda e: (e.team, e.behavior, e.unit, e.index))
    result.seconds = time.perf_counter() - start
    return result


def _record(units: _Units, rows: BehaviorRows, quotas: dict[str, int],
            result: TeamRolloutResult, progress: Callable[[TeamEpisode], None] | None) -> None:
    """Add one exchange's rewards to each unit's running episode; count the episodes that
    ended within their unit's quota."""
    seen: set[str] = set()
    ending: dict[str, tuple[float, bool]] = {}
    for agent, group, reward, group_reward, done, cut in zip(
            rows.agent_id.tolist(), rows.group_id.tolist(), rows.reward.tolist(),
            rows.group_reward.tolist(), rows.done.tolist(), rows.interrupted.tolist(),
            strict=True):
        name = units.unit(agent, group, done)
        if name is None:
            continue
        units.own_reward[name] += reward
        units.members[name].add(agent)
        if name not in seen:  # a group's reward counts once per exchange
            seen.add(name)
            units.group_reward[name] += group_reward
            units.length[name] += 1
        if done:
            ending[name] = (group_reward if group else reward, cut)
            if not group:
                units.slot_of.pop(agent, None)
    for name, (final, cut) in ending.items():
        episode_return = (units.group_reward[name]
                          + units.own_reward[name] / max(1, len(units.members[name])))
        if name.startswith("slot"):
            final = episode_return
        if units.finished[name] < quotas[name]:
            episode = TeamEpisode(units.behavior, team_of(units.behavior), name,
                                  units.finished[name], episode_return, units.length[name],
                                  1.0 if final > 0 else 0.0 if final < 0 else 0.5, cut)
            result.episodes.append(episode)
            if progress is not None:
                progress(episode)
        units.finished[name] += 1
        units.group_reward[name], units.own_reward[name], units.length[name] = 0.0, 0.0, 0
        units.members[name] = set()
