"""Benchmark of the env stack: the stand-in's own simulation, and the full decision loop
(stand-in over gRPC -> mlagents-envs -> HuggyVectorEnv -> HuggyAgent.compute_action).

Prints, from one run: the simulation rate (agent-steps/s, no gRPC), the full loop's
agent-decisions/s with 18 agents, where each step's time goes (policy / Python-side protobuf +
mlagents-envs + Gymnasium / waiting on the stand-in: its simulation, its protobuf and gRPC), and
the same loop with mlagents-envs' original code paths (`compat.set_fast_paths(False)`) as the
baseline. Bounded: every phase stops after its step count or `--seconds`, whichever comes first.

    .venv/bin/python bench/bench_envs.py [--steps 1000] [--seconds 20]
"""

from __future__ import annotations

import argparse
import io
import socket
import time
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class LoopTimes:
    steps: int
    total: float
    policy: float
    env_step: float
    waiting: float

    @property
    def per_step_ms(self) -> float:
        return 1000 * self.total / self.steps


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def bench_sim(steps: int, seconds: float) -> tuple[float, float]:
    """(agent-steps/s of HuggySim.step, agent-steps/s of sim + wire encoding) with 18 agents."""
    from envs.standin.client import StandIn

    standin = StandIn(io.StringIO())
    standin.reset(0)
    rng = np.random.default_rng(0)
    actions = rng.uniform(-1, 1, (steps, 18, 21)).astype(np.float32)
    rates = []
    for step in (standin.sim.step, standin.step):
        deadline = time.perf_counter() + seconds
        start, done = time.perf_counter(), 0
        for a in actions:
            step(a)
            done += 1
            if time.perf_counter() > deadline:
                break
        rates.append(18 * done / (time.perf_counter() - start))
    return rates[0], rates[1]


def bench_mlagents_paths(repeats: int) -> dict[str, tuple[float, float]]:
    """Microseconds per call (original, fast) of mlagents-envs' two per-step Python functions,
    on one stand-in step message with 18 agents (no gRPC)."""
    from mlagents_envs.base_env import ActionTuple
    from mlagents_envs.communicator_objects.unity_message_pb2 import UnityMessageProto
    from mlagents_envs.environment import UnityEnvironment
    from mlagents_envs.rpc_utils import behavior_spec_from_proto
    from mlagents_envs.side_channel.side_channel_manager import SideChannelManager

    from envs import compat
    from envs.standin.client import BEHAVIOR, StandIn

    standin = StandIn(io.StringIO())
    message = UnityMessageProto.FromString(standin.reset(0))
    infos = message.unity_output.rl_output.agentInfos[BEHAVIOR].value
    spec = behavior_spec_from_proto(
        message.unity_output.rl_initialization_output.brain_parameters[0], infos[0])
    env = UnityEnvironment.__new__(UnityEnvironment)  # just enough state for the method
    env._env_state = {BEHAVIOR: compat._steps_from_proto(infos, spec)}
    env._side_channel_manager = SideChannelManager([])
    actions = {BEHAVIOR: ActionTuple(continuous=np.random.default_rng(0).uniform(
        -1, 1, (18, 21)).astype(np.float32))}
    cases = {
        "steps_from_proto": (lambda: compat.original_steps_from_proto(infos, spec),
                             lambda: compat._steps_from_proto(infos, spec)),
        "_generate_step_input": (
            lambda: compat._ORIGINALS["generate_step_input"](env, actions),
            lambda: compat._generate_step_input(env, actions)),
    }
    out = {}
    for name, pair in cases.items():
        times = []
        for fn in pair:
            best = float("inf")
            for _ in range(3):
                start = time.perf_counter()
                for _ in range(repeats):
                    fn()
                best = min(best, (time.perf_counter() - start) / repeats * 1e6)
            times.append(best)
        out[name] = (times[0], times[1])
    return out


def bench_loop(agent: object | None, steps: int, seconds: float, fast: bool) -> LoopTimes:
    """The full loop for `steps` decisions (agent None: zero actions, no policy)."""
    from envs import HuggyVectorEnv, compat

    compat.set_fast_paths(fast)  # for the whole phase: two of the three are looked up per step
    try:
        return _measure_loop(HuggyVectorEnv(base_port=_free_port(), seed=0), agent, steps,
                             seconds)
    finally:
        compat.set_fast_paths(True)


def _measure_loop(env: Any, agent: Any, steps: int, seconds: float) -> LoopTimes:
    """Time `steps` decisions of `env` driven by `agent` (None: zero actions)."""
    waiting = 0.0
    conn = env._unity._communicator.unity_to_external.parent_conn
    poll, recv = conn.poll, conn.recv

    def timed(method):  # noqa: ANN001, ANN202 - thin wrapper measuring the wait for Unity
        def wrapper(*args):  # noqa: ANN002, ANN202
            nonlocal waiting
            start = time.perf_counter()
            try:
                return method(*args)
            finally:
                waiting += time.perf_counter() - start
        return wrapper

    conn.poll, conn.recv = timed(poll), timed(recv)
    try:
        obs, _ = env.reset(seed=0)
        zeros = np.zeros((env.num_envs, 21), np.float32)
        for _ in range(20):  # warm-up
            obs, *_ = env.step(zeros if agent is None else agent.compute_action(obs))
        waiting = policy = env_step = 0.0
        deadline = time.perf_counter() + seconds
        start, done = time.perf_counter(), 0
        while done < steps and time.perf_counter() < deadline:
            t0 = time.perf_counter()
            actions = zeros if agent is None else agent.compute_action(obs)
            t1 = time.perf_counter()
            obs, *_ = env.step(actions)
            t2 = time.perf_counter()
            policy += t1 - t0
            env_step += t2 - t1
            done += 1
        return LoopTimes(done, time.perf_counter() - start, policy, env_step, waiting)
    finally:
        env.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000, help="decisions per loop phase")
    parser.add_argument("--seconds", type=float, default=20.0, help="time cap per phase")
    parser.add_argument("--rounds", type=int, default=3,
                        help="interleaved repetitions; the fastest of each phase is reported, "
                             "since other processes on the machine only ever slow a phase down")
    args = parser.parse_args()

    import envs  # noqa: F401
    from huggy_agent import HuggyAgent
    from huggy_agent.tables import format_table

    agent = HuggyAgent(device="cpu")
    sim_rate, standin_rate = max(bench_sim(args.steps, args.seconds) for _ in range(args.rounds))
    sim_ms = 1000 * 18 / standin_rate
    configs = {
        "env only, original mlagents paths": (None, False),
        "env only, fast paths": (None, True),
        "full loop, original mlagents paths": (agent, False),
        "full loop, fast paths": (agent, True),
    }
    phases: dict[str, LoopTimes] = {}
    for _ in range(args.rounds):
        for name, (policy, fast_paths) in configs.items():
            t = bench_loop(policy, args.steps, args.seconds, fast_paths)
            if name not in phases or t.per_step_ms < phases[name].per_step_ms:
                phases[name] = t
    print(format_table(["stand-in simulation (18 agents, no gRPC)", "agent-steps/s"], [
        ("HuggySim.step", sim_rate),
        ("HuggySim.step + wire encoding", standin_rate),
    ]))
    print()
    paths = bench_mlagents_paths(max(100, args.steps // 2))
    print(format_table(["mlagents-envs per step (18 agents)", "original us", "fast us", "speed-up"],
                       [(name, o, f, f"{o / f:.1f}x") for name, (o, f) in paths.items()]))
    print()
    rows = []
    for name, t in phases.items():
        python_side = t.env_step - t.waiting
        rows.append((name, 18 * t.steps / t.total, t.per_step_ms,
                     f"{100 * t.policy / t.total:.0f}%", f"{100 * python_side / t.total:.0f}%",
                     f"{100 * t.waiting / t.total:.0f}%"))
    print(format_table(["loop (18 agents)", "agent-decisions/s", "ms/step", "policy",
                        "protobuf+mlagents+gym", "waiting on stand-in"], rows))
    fast, slow = phases["full loop, fast paths"], phases["full loop, original mlagents paths"]
    env_fast, env_slow = phases["env only, fast paths"], phases["env only, original mlagents paths"]
    full = fast.per_step_ms
    overhead = full - 1000 * fast.policy / fast.steps - sim_ms
    print()
    print(f"fast paths vs original, env only: {env_slow.per_step_ms / env_fast.per_step_ms:.2f}x;"
          f" full loop: {slow.per_step_ms / fast.per_step_ms:.2f}x")
    print(f"full loop step {full:.2f} ms = policy {1000 * fast.policy / fast.steps:.2f} ms"
          f" + stand-in sim+encode {sim_ms:.2f} ms + gRPC/protobuf/Gymnasium {overhead:.2f} ms"
          f" ({100 * overhead / full:.0f}% of the step)")
    print(f"target 20,000 agent-decisions/s: measured {18 * fast.steps / fast.total:,.0f}")


if __name__ == "__main__":
    main()
