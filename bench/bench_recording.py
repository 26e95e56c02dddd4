"""What recording costs, measured in one run: frames drawn per second, the stand-in's
agent-decisions per second with and without its render side channel, and a 20-episode Huggy
rollout (bundled policy, 18 slots) as `huggy rollout` runs it, without and with `--video`
(slot 0's first episode, and both of its counted episodes), as ratios to the plain rollout.

    python bench/bench_recording.py [--repeats 3] [--steps 300]

Each rollout configuration runs `--repeats` times, interleaved with the others so that load
from other processes falls on all of them alike; the medians are compared. The machine is
shared: read the ratios, not the absolute times.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

import envs
from envs.recording.video import VideoRecorder
from envs.render import Overlay, huggy_frame
from envs.standin.sim import HuggySim, SimConfig
from huggy_agent import HuggyAgent
from huggy_agent.tables import format_table


def frames_per_second(seconds: float = 2.0) -> float:
    """`huggy_frame` calls per second on poses of a running simulation."""
    sim = HuggySim(SimConfig(num_agents=1, render=1), seed=0)
    rng = np.random.default_rng(0)
    states = []
    for _ in range(100):
        sim.step(rng.uniform(-1, 1, (1, 21)))
        states.append(sim.poses()[0])
    trail = np.cumsum(rng.normal(0, 0.05, (200, 2)), axis=0)
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        huggy_frame(states[count % 100], trail, Overlay(label="bundled", step=count,
                                                        episode_return=0.01 * count, slot=0))
        count += 1
    return count / (time.perf_counter() - start)


def decisions_per_second(steps: int, blocks: int = 10) -> tuple[float, float]:
    """Agent-decisions per second of the 18-agent stand-in stepped with zero actions, without
    and with its render side channel: two environments, stepped in alternating blocks."""
    with envs.HuggyVectorEnv(worker_id=40) as plain, \
            envs.HuggyVectorEnv(worker_id=41, render_mode="rgb_array") as rendered:
        seconds = {plain: [], rendered: []}
        for env in seconds:
            env.reset(seed=0)
        actions = np.zeros((plain.num_envs, 21), np.float32)
        for _ in range(blocks):
            for env, times in seconds.items():
                start = time.perf_counter()
                for _ in range(steps // blocks):
                    env.step(actions)
                times.append((time.perf_counter() - start) / (steps // blocks))
        return tuple(plain.num_envs / statistics.median(seconds[env])  # type: ignore[return-value]
                     for env in (plain, rendered))


def rollout_seconds(agent: HuggyAgent, video_episodes: int, folder: Path) -> float:
    """Wall time of `huggy rollout --episodes 20 [--video DIR --video-episodes N]`'s work: the
    environment's start, the rollout, the videos, the close."""
    start = time.perf_counter()
    render = video_episodes > 0
    with envs.UnityVectorEnv(render_mode="rgb_array" if render else None, worker_id=50) as env:
        recorders = [VideoRecorder(folder, episodes=video_episodes, label="bundled")] \
            if render else []
        envs.rollout(agent, env, episodes=20, seed=0, recorders=recorders)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=500)
    args = parser.parse_args()
    agent = HuggyAgent(device="cpu", seed=0)
    fps = frames_per_second()
    plain, rendered = decisions_per_second(args.steps)
    times: dict[int, list[float]] = {0: [], 1: [], 2: []}
    with tempfile.TemporaryDirectory() as folder:
        for _ in range(args.repeats):
            for episodes in times:
                times[episodes].append(rollout_seconds(agent, episodes, Path(folder)))
    base = statistics.median(times[0])
    rows = [
        ("frames drawn per second (huggy_frame, 640x480)", f"{fps:,.0f}"),
        ("stand-in agent-decisions/s, render off", f"{plain:,.0f}"),
        ("stand-in agent-decisions/s, render on", f"{rendered:,.0f} "
                                                  f"({rendered / plain:.2f}x)"),
        ("20-episode rollout, s (median)", f"{base:.2f}"),
        ("... with --video (slot 0's first episode)",
         f"{statistics.median(times[1]):.2f} ({statistics.median(times[1]) / base:.2f}x)"),
        ("... with --video --video-episodes 2 (all of slot 0's)",
         f"{statistics.median(times[2]):.2f} ({statistics.median(times[2]) / base:.2f}x)"),
    ]
    print(format_table(["measure", "value"], rows))


if __name__ == "__main__":
    main()
