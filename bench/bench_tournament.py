"""Benchmark of `huggy tournament`'s matches: matches/s and agent-decisions/s of one runner on the
stand-in SoccerTwos, with scripted players and with a network policy (the stand-in-trained
SoccerTwos.onnx fixture), in this process (`tournament.play_plain`).

Rounds of (scripted, network) are interleaved and the fastest of each counts, so load from other
programs hits both alike; the scripted players are the baseline of the ratio.

    .venv/bin/python bench/bench_tournament.py [--matches 24] [--arenas 12] [--rounds 2]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from deploy.evaluation.tournament import TournamentConfig, TournamentEnv, contenders, play_plain
from huggy_agent.tables import format_table

REPO = Path(__file__).resolve().parents[1]
NETWORK = REPO / "tests" / "fixtures" / "mlagents_extra" / "soccertwos_standin" / "SoccerTwos.onnx"
FIELDS = {"scripted": ["heuristic:chaser", "heuristic:random"],
          "network": [str(NETWORK), "heuristic:random"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--matches", type=int, default=24, help="matches per tournament")
    parser.add_argument("--arenas", type=int, default=12, help="matches played at once")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved repetitions")
    args = parser.parse_args()
    config = TournamentConfig(matches=args.matches, progress=False)
    env = TournamentEnv(arenas=args.arenas)
    best: dict[str, tuple[float, float]] = {}
    for _ in range(args.rounds):
        for name, sources in FIELDS.items():
            started = time.perf_counter()
            result = play_plain(contenders(sources), config, env)
            seconds = time.perf_counter() - started
            decisions = 4 * sum(match.steps or 0 for match in result.matches)
            rates = (len(result.matches) / seconds, decisions / seconds)
            if rates[0] > best.get(name, (0.0, 0.0))[0]:
                best[name] = rates
    base = best["scripted"][0]
    print(format_table(["players", "matches/s", "agent-decisions/s (in matches)", "/ scripted"],
                       [(name, round(rate, 2), round(decisions), f"{rate / base:.2f}x")
                        for name, (rate, decisions) in best.items()]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
