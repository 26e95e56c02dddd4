"""Benchmark of the stand-in SoccerTwos through real mlagents-envs: agent-decisions/s and
matches/s of one stand-in process, against the Huggy stand-in's rate through the same loop.

Every phase drives a real `UnityEnvironment` over gRPC with the plain mlagents-envs loop: for
each behavior `get_steps`, the players' actions, `set_actions`; then `step`. Phases:
- "huggy": the Huggy stand-in (one behavior, 18 agents), zero actions: the baseline;
- "soccer, heuristics": SoccerTwos, `heuristic:chaser` for blue and `heuristic:random` for
  purple (both teams' behaviors every step);
- "soccer, networks": SoccerTwos, a network of the course's SoccerTwos size (two 512-unit
  layers, untrained, exported to ML-Agents' ONNX by the project) for both teams, on the CPU,
  sampling actions as Unity's inference does.
Rounds interleave the phases and each phase's fastest round is reported (other processes on the
machine only ever slow a round down). Also printed: the stand-in's own work per decision step
(in process, no gRPC), matches/s (an arena's episode is a match), and the CPU time both
processes spend per decision, which bounds the rate the loop reaches on an idle machine (the
two processes take turns, so a loaded machine's wall-clock rate understates it).

With `--win-rates N`, it plays instead N matches (episodes) per pairing of the scripted players
in process (`envs.standin.soccer.matches.play_matches`: one arena's episode per match, the
first N to end), each player on each side, and prints wins, draws (the step limit) and losses
of the one playing blue.

    .venv/bin/python bench/bench_soccer.py [--num-arenas 16] [--seconds 10] [--rounds 3]
    .venv/bin/python bench/bench_soccer.py --win-rates 300
"""

from __future__ import annotations

import argparse
import io
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from proc_cpu import cpu_seconds

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from envs.heuristics import load_heuristic  # noqa: E402
from envs.standin.launcher import builtin_huggy_path, builtin_soccertwos_path  # noqa: E402
from envs.standin.soccer.matches import play_matches  # noqa: E402

TARGET = 10_000.0
"""Agent-decisions/s one stand-in SoccerTwos process must reach with scripted players."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _environment(file_name: str, parameters: dict[str, float]) -> Any:
    from mlagents_envs.environment import UnityEnvironment
    from mlagents_envs.side_channel.environment_parameters_channel import (
        EnvironmentParametersChannel,
    )

    channel = EnvironmentParametersChannel()
    for key, value in parameters.items():
        channel.set_float_parameter(key, value)
    return UnityEnvironment(file_name=file_name, base_port=_free_port(), seed=0,
                            no_graphics=True, timeout_wait=60, side_channels=[channel])


def _waiting(env: Any, totals: dict[str, float]) -> None:
    """Count the time `env` waits for the stand-in's answers in `totals["wait"]`."""
    connection = env._communicator.unity_to_external.parent_conn
    for name in ("poll", "recv"):
        original = getattr(connection, name)

        def timed(*args: Any, _original: Any = original, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return _original(*args, **kwargs)
            finally:
                totals["wait"] += time.perf_counter() - start

        setattr(connection, name, timed)


def run_loop(env: Any, players: dict[str, Any], seconds: float) -> dict[str, float]:
    """Drive `env` for `seconds` (after a warm-up) with `players` {behavior: player}, each
    given its deciding agents' observations: decisions, finished agents, seconds, and the
    seconds spent waiting for the stand-in and in the players."""
    from mlagents_envs.base_env import ActionTuple

    env.reset()
    totals = {"wait": 0.0, "players": 0.0}
    _waiting(env, totals)
    rows = {b: 0 for b in players}
    decisions = finished = 0
    start = deadline = 0.0
    for step in range(1_000_000):
        if step == 20:  # warm-up done
            decisions = finished = 0
            totals.update(wait=0.0, players=0.0)
            cpu_here, cpu_there = time.process_time(), cpu_seconds(env._process.pid)
            start = time.perf_counter()
            deadline = start + seconds
        elif step > 20 and time.perf_counter() >= deadline:
            break
        for behavior, player in players.items():
            decision, terminal = env.get_steps(behavior)
            decisions += len(decision)
            finished += len(terminal)
            spec = env.behavior_specs[behavior].action_spec
            obs = decision.obs if len(decision.obs) > 1 else decision.obs[0]
            if not len(decision):  # an exchange with finished agents only: nothing to decide
                continue
            if spec.continuous_size:
                actions = ActionTuple(continuous=np.zeros((len(decision), spec.continuous_size),
                                                          np.float32))
            else:
                before = time.perf_counter()
                chosen = player.compute_action(obs, deterministic=False, row_offset=rows[behavior])
                totals["players"] += time.perf_counter() - before
                actions = ActionTuple(discrete=np.asarray(chosen, np.int32))
            rows[behavior] += len(decision)
            env.set_actions(behavior, actions)
        env.step()
    return {"decisions": decisions, "finished": finished,
            "seconds": time.perf_counter() - start, **totals,
            "cpu_python": time.process_time() - cpu_here,
            "cpu_standin": cpu_seconds(env._process.pid) - cpu_there}


def network_policy(folder: Path) -> Any:
    """A HuggyAgent of the course's SoccerTwos network size and interface (untrained)."""
    import torch

    from huggy_agent import HuggyAgent
    from huggy_agent.actor.networks import Actor, ActorArchitecture, InputArchitecture
    from huggy_agent.formats.export_onnx import export_onnx
    from huggy_agent_client.spec import ObservationInput

    torch.set_num_threads(1)
    architecture = ActorArchitecture(
        inputs=(InputArchitecture(ObservationInput("obs_0", (264,), "vector")),
                InputArchitecture(ObservationInput("obs_1", (72,), "vector"))),
        hidden_units=512, num_layers=2, discrete_branches=(3, 3, 3))
    torch.manual_seed(0)
    path = export_onnx(Actor(architecture).eval(), folder / "SoccerTwos.onnx")
    return HuggyAgent(path, device="cpu", seed=0)


def standin_work(num_arenas: int, steps: int = 300) -> float:
    """Milliseconds per decision step of the SoccerTwos stand-in's own work, in process: reading
    the actions, the simulation, writing the observation message."""
    from mlagents_envs.communicator_objects.agent_action_pb2 import AgentActionProto
    from mlagents_envs.communicator_objects.unity_message_pb2 import UnityMessageProto

    from envs.standin.soccer.sim import SoccerConfig
    from envs.standin.soccer.standin import BEHAVIORS, SoccerStandIn

    standin = SoccerStandIn(io.StringIO())
    standin.config = SoccerConfig(num_arenas=num_arenas)
    standin.reset(0)
    rng = np.random.default_rng(0)
    messages = []
    for _ in range(20):
        message = UnityMessageProto()
        for behavior in BEHAVIORS:
            for row in rng.integers(0, 3, (2 * num_arenas, 3)).tolist():
                message.unity_input.rl_input.agent_actions[behavior].value.append(
                    AgentActionProto(vector_actions_deprecated=row, discrete_actions=row))
        messages.append(UnityMessageProto.FromString(message.SerializeToString()))
    done = 0
    start = time.perf_counter()
    for k in range(steps):
        rl_input = messages[k % len(messages)].unity_input.rl_input
        if all(len(order) for order in standin.order):
            standin.step(standin.actions_from(rl_input))
            done += 1
        else:  # a report of finished agents only: nothing to answer
            standin.step(np.zeros((4 * num_arenas, 3), np.int64))
    return 1000 * (time.perf_counter() - start) / max(done, 1)


def win_rates(matches: int, num_arenas: int) -> None:
    """Print each scripted pairing's results, both ways round."""
    pairings = [("chaser", "random"), ("chaser", "idle"), ("random", "idle"),
                ("chaser", "chaser"), ("random", "random")]
    print(f"{'blue':>18s} vs {'purple':18s} {'wins':>5s} {'draws':>6s} {'losses':>7s}")
    for a, b in pairings:
        for blue, purple in ((a, b), (b, a)) if a != b else ((a, b),):
            start = time.perf_counter()
            outcomes = play_matches(load_heuristic(f"heuristic:{blue}", seed=1),
                                    load_heuristic(f"heuristic:{purple}", seed=2), matches,
                                    num_arenas)
            wins, draws, losses = ((outcomes == k).sum() for k in (1, 0, -1))
            print(f"{'heuristic:' + blue:>18s} vs {'heuristic:' + purple:18s} {wins:5d} "
                  f"{draws:6d} {losses:7d}   ({time.perf_counter() - start:.0f} s)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-arenas", type=int, default=32,
                        help="SoccerTwos fields in the stand-in (default: its own default, 32)")
    parser.add_argument("--seconds", type=float, default=10.0, help="time per round and phase")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per phase")
    parser.add_argument("--no-networks", action="store_true",
                        help="skip the network-policy phase (no torch)")
    parser.add_argument("--win-rates", type=int, default=0, metavar="N",
                        help="play N in-process matches per scripted pairing instead")
    args = parser.parse_args()
    if args.win_rates:
        win_rates(args.win_rates, args.num_arenas)
        return

    from envs.standin.soccer.standin import BEHAVIORS

    chaser, random = load_heuristic("heuristic:chaser"), load_heuristic("heuristic:random", 0)
    phases: dict[str, tuple[str, dict[str, float], dict[str, Any]]] = {
        "huggy": (builtin_huggy_path(), {"num_agents": 18}, {"Huggy?team=0": None}),
        "soccer, heuristics": (builtin_soccertwos_path(), {"num_arenas": args.num_arenas},
                               dict(zip(BEHAVIORS, (chaser, random), strict=True))),
    }
    with tempfile.TemporaryDirectory() as folder:
        if not args.no_networks:
            network = network_policy(Path(folder))
            phases["soccer, networks"] = (builtin_soccertwos_path(),
                                          {"num_arenas": args.num_arenas},
                                          dict.fromkeys(BEHAVIORS, network))
        best: dict[str, dict[str, float]] = {}
        for round_index in range(args.rounds):
            for name, (file_name, parameters, players) in phases.items():
                env = _environment(file_name, parameters)
                try:
                    result = run_loop(env, players, args.seconds)
                finally:
                    env.close()
                rate = result["decisions"] / result["seconds"]
                print(f"round {round_index + 1} {name:20s} {rate:10,.0f} agent-decisions/s",
                      flush=True)
                if rate > best.get(name, {}).get("rate", 0.0):
                    best[name] = {**result, "rate": rate}
    work = min(standin_work(args.num_arenas) for _ in range(3))
    baseline = best["huggy"]["rate"]
    print()
    print(f"{'phase':22s} {'agent-decisions/s':>18s} {'vs huggy':>9s} {'matches/s':>10s}   "
          "share of the loop: waiting for the stand-in / players / mlagents-envs and the rest")
    for name, result in best.items():
        matches = (f"{result['finished'] / 4 / result['seconds']:10.1f}" if name != "huggy"
                   else f"{'-':>10s}")
        wait, players = (result[key] / result["seconds"] for key in ("wait", "players"))
        print(f"{name:22s} {result['rate']:18,.0f} {result['rate'] / baseline:9.2f} {matches}   "
              f"{wait:.0%} / {players:.0%} / {1 - wait - players:.0%}")
    print(f"\nstand-in's own work per SoccerTwos decision step ({4 * args.num_arenas} agents): "
          f"{work:.2f} ms")
    print("CPU time per 1,000 agent-decisions (Python side + stand-in process), and the rate if "
          "the two took turns on an otherwise idle core:")
    for name, result in best.items():
        python, standin = (1000 * result[key] / result["decisions"]
                           for key in ("cpu_python", "cpu_standin"))
        print(f"  {name:22s} {1000 * python:6.1f} + {1000 * standin:6.1f} ms  ->  "
              f"{1000 / (python + standin):8,.0f} agent-decisions/s")
    rate = best["soccer, heuristics"]["rate"]
    verdict = "meets" if rate >= TARGET else "misses"
    print(f"SoccerTwos with scripted players: {rate:,.0f} agent-decisions/s, {verdict} the "
          f"{TARGET:,.0f} target ({rate / TARGET:.2f}x)")


if __name__ == "__main__":
    main()
