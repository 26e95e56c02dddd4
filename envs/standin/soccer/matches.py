"""Matches between two players on the stand-in's SoccerTwos simulation, in process (no gRPC):
for quick comparisons of scripted players and policies, in tests and benchmarks."""

from __future__ import annotations

from typing import Any

import numpy as np

from envs.standin.soccer.rays import FORWARD_SIZE
from envs.standin.soccer.sim import AGENT_TEAM, AGENTS_PER_ARENA, SoccerConfig, SoccerSim


def play_matches(blue: Any, purple: Any, matches: int, num_arenas: int = 16, seed: int = 0,
                 max_environment_steps: int | None = None) -> np.ndarray:
    """Matches between two players in one `SoccerSim`, in process.

    Args:
        blue: team 0's player: `compute_action([obs_0, obs_1], deterministic=False)` (a scripted
            player or a policy of the SoccerTwos interface).
        purple: team 1's player, the same way.
        matches: how many matches: the first episodes to end, one arena's episode per match.
        num_arenas: the simulation's arenas.
        seed: the simulation's seed.
        max_environment_steps: the step limit; None: the scene's.

    Returns:
        Blue's results, one per match: 1 win, 0 draw at the step limit, -1 loss.
    """
    config = SoccerConfig(num_arenas=num_arenas)
    if max_environment_steps is not None:
        config.max_environment_steps = max_environment_steps
    sim = SoccerSim(config, seed=seed)
    team = AGENT_TEAM[np.arange(sim.num_agents) % AGENTS_PER_ARENA]
    obs = np.zeros((sim.num_agents, sim.opening.obs.shape[1]), np.float32)
    report = sim.opening
    outcomes: list[int] = []
    while len(outcomes) < matches:
        first_blue = report.done & (report.slot % AGENTS_PER_ARENA == 0)  # one row per arena
        outcomes += np.where(report.interrupted[first_blue], 0,
                             np.sign(report.group_reward[first_blue])).astype(int).tolist()
        obs[report.slot[~report.done]] = report.obs[~report.done]
        actions = np.zeros((sim.num_agents, 3), np.int64)
        if len(sim.awaiting):
            for side, player in enumerate((blue, purple)):
                rows = np.flatnonzero(team == side)
                actions[rows] = player.compute_action(
                    [obs[rows, :FORWARD_SIZE], obs[rows, FORWARD_SIZE:]], deterministic=False)
        report = sim.step(actions)
    return np.array(outcomes[:matches])
