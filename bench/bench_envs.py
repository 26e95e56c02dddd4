"""Benchmark of the env stack: the stand-in's own work, mlagents-envs' per-step functions, and
the full decision loop (stand-in over gRPC -> mlagents-envs -> HuggyVectorEnv ->
HuggyAgent.compute_action) with one Unity instance or several (`HuggyVectorEnv(instances=K)`).

Every loop phase runs in a fresh child process, its rounds interleaved with the other phases'
(the fastest round is reported: other processes on the machine only ever slow a phase down):
- "K instances" for each K of `--instances`, with the bundled policy, and for K > 1 also
  "K instances, pinned" (`pin_cores=True`: instance i's worker and Unity process on core i);
- "1 instance, mlagents-envs' own paths" (`fast_step.set_fast_paths(False)`);
- "1 instance, torch's default threads": the policy on as many threads as torch takes by default
  (one per core), as in a caller's own loop that sets none. Its onnxruntime worker threads spin
  for a while after each pass, which keeps an idle virtual CPU from being halted between steps
  as the exchange's own polling does (`envs.spin_wait`); with several instances the spinning
  takes cores the stand-ins need;
- "1 instance, blocking waits": both ends of the exchange block instead of polling first
  (`HUGGY_SPIN_WAIT_US=0`), the baseline of the polling's gain;
- with `--baseline DIR` (a folder holding an older copy of `envs/`, e.g. made with
  `cp -r envs /tmp/old/`), "baseline, 1 instance": that code, with this checkout's policy.

It prints agent-decisions/s per phase and the ratios the targets name; where one instance's
step goes (policy; the vector env's own Python; mlagents-envs and protobuf in the caller's
process; waiting, split into the stand-in's own work, measured apart, and the rest: gRPC,
transport, threads), for this code and the baseline; and the memory each extra instance costs
(its worker and its Unity process: RSS, and PSS from /proc/PID/smaps_rollup).

    .venv/bin/python bench/bench_envs.py [--instances 1,2] [--baseline DIR] [--steps 1000]
        [--seconds 20] [--rounds 3] [--device cpu] [--torch-threads 1]
    .venv/bin/python bench/bench_envs.py --instances 1,8 --device cuda    # the 16-core GPU host
"""

from __future__ import annotations

import argparse
import io
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
DEFAULT_THREADS = "1 instance, torch's default threads"
BLOCKING = "1 instance, blocking waits"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# -- in a child process -----------------------------------------------------------------------


def _memory_mb(pid: int) -> tuple[float, float]:
    """(RSS, PSS) in MB of process `pid`, from /proc/PID/smaps_rollup."""
    values = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("Rss", "Pss"):
            values[key] = int(rest.split()[0]) / 1024
    return values["Rss"], values["Pss"]


def _standin_work(steps: int) -> float:
    """Seconds per step of the stand-in's own work with 18 agents (no gRPC): reading the
    actions from the input message, the simulation, encoding the observations."""
    from mlagents_envs.communicator_objects.unity_message_pb2 import UnityMessageProto

    from envs import fast_step
    from envs.standin.client import BEHAVIOR, StandIn

    standin = StandIn(io.StringIO())
    standin.reset(0)
    rng = np.random.default_rng(0)
    inputs = []
    for _ in range(min(steps, 500)):
        message = UnityMessageProto()
        message.unity_input.rl_input.agent_actions[BEHAVIOR].MergeFromString(
            fast_step.encode_agent_actions(rng.uniform(-1, 1, (18, 21)).astype(np.float32)))
        inputs.append(UnityMessageProto.FromString(message.SerializeToString()))
    start = time.perf_counter()
    for k in range(steps):
        rl_input = inputs[k % len(inputs)].unity_input.rl_input
        standin.step(standin.actions_from(rl_input))
    return (time.perf_counter() - start) / steps


def _timed(totals: dict[str, float], key: str, function: Any) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            totals[key] += time.perf_counter() - start
    return wrapper


def _instrument(env: Any, totals: dict[str, float]) -> None:
    """Count time waiting (on the stand-in, or on the workers) and time inside mlagents-envs,
    for this code and for the baseline's (which kept its UnityEnvironment in `env._unity`)."""
    if getattr(env, "instances", 1) > 1:
        env._instances._collect = _timed(totals, "wait", env._instances._collect)
        return
    unity = env._unity if hasattr(env, "_unity") else env._instances.instance._unity
    connection = unity._communicator.unity_to_external.parent_conn
    connection.poll = _timed(totals, "wait", connection.poll)
    connection.recv = _timed(totals, "wait", connection.recv)
    from envs import fast_step

    fast_step.lean_step = _timed(totals, "mlagents", fast_step.lean_step)
    for name in ("set_actions", "step", "get_steps"):
        setattr(unity, name, _timed(totals, "mlagents", getattr(unity, name)))


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """Run one loop phase in this process and return its measurements."""
    sys.path[:0] = [spec["root"], str(REPO)]  # `envs` from root, the policy from this checkout
    import torch

    import envs
    from envs import fast_step
    from huggy_agent import HuggyAgent

    if spec["torch_threads"] is not None:
        torch.set_num_threads(spec["torch_threads"])
    agent = HuggyAgent(device=spec["device"])
    fast_step.set_fast_paths(spec["fast_paths"])
    kwargs = ({"instances": spec["instances"], "pin_cores": spec.get("pin_cores", False)}
              if spec["instances"] > 1 else {})
    env = envs.HuggyVectorEnv(base_port=_free_port(), seed=0, **kwargs)
    totals = {"wait": 0.0, "mlagents": 0.0}
    try:
        _instrument(env, totals)
        obs, _ = env.reset(seed=0)
        for _ in range(20):  # warm-up
            obs, *_ = env.step(agent.compute_action(obs))
        totals.update(wait=0.0, mlagents=0.0)
        policy = stepping = 0.0
        deadline = time.perf_counter() + spec["seconds"]
        start, steps = time.perf_counter(), 0
        while steps < spec["steps"] and time.perf_counter() < deadline:
            t0 = time.perf_counter()
            actions = agent.compute_action(obs)
            t1 = time.perf_counter()
            obs, *_ = env.step(actions)
            policy += t1 - t0
            stepping += time.perf_counter() - t1
            steps += 1
        total = time.perf_counter() - start
        memory = {}
        if spec["instances"] > 1:
            memory = {"instances": [[*_memory_mb(worker), *_memory_mb(unity)] for worker, unity
                                    in zip(env.worker_process_ids, env.process_ids, strict=True)]}
        else:
            memory = {"unity": _memory_mb(env.process_id)}
        agents = env.num_envs
    finally:
        env.close()
    ms = 1000 / steps
    return {"rate": agents * steps / total, "agents": agents, "steps": steps,
            "step_ms": total * ms, "policy_ms": policy * ms, "env_ms": stepping * ms,
            "wait_ms": totals["wait"] * ms, "mlagents_ms": totals["mlagents"] * ms,
            "standin_ms": (1000 * min(_standin_work(200) for _ in range(3))
                           if spec["instances"] == 1 else None),
            "memory": memory, "threads": torch.get_num_threads()}


# -- in the parent ----------------------------------------------------------------------------


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

    from envs import fast_step
    from envs.standin.client import BEHAVIOR, StandIn

    standin = StandIn(io.StringIO())
    message = UnityMessageProto.FromString(standin.reset(0))
    infos = message.unity_output.rl_output.agentInfos[BEHAVIOR].value
    spec = behavior_spec_from_proto(
        message.unity_output.rl_initialization_output.brain_parameters[0], infos[0])
    env = UnityEnvironment.__new__(UnityEnvironment)  # just enough state for the method
    env._env_state = {BEHAVIOR: fast_step._steps_from_proto(infos, spec)}
    env._side_channel_manager = SideChannelManager([])
    actions = {BEHAVIOR: ActionTuple(continuous=np.random.default_rng(0).uniform(
        -1, 1, (18, 21)).astype(np.float32))}
    cases = {
        "steps_from_proto": (lambda: fast_step.original_steps_from_proto(infos, spec),
                             lambda: fast_step._steps_from_proto(infos, spec)),
        "_generate_step_input": (
            lambda: fast_step._ORIGINALS["generate_step_input"](env, actions),
            lambda: fast_step._generate_step_input(env, actions)),
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


def run_phase(spec: dict[str, Any]) -> dict[str, Any]:
    done = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)],
                          capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, **spec.get("environ", {})})
    if done.returncode != 0:
        raise RuntimeError(f"phase {spec} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _split_row(name: str, r: dict[str, Any]) -> tuple:
    """(name, step, policy, vector env, mlagents-envs + protobuf, waiting, stand-in's work,
    gRPC + transport) in ms: the vector env's own time is env.step outside mlagents-envs (and
    outside `fast_step.lean_step`, which stands in for it), waiting is inside mlagents-envs."""
    return (name, r["step_ms"], r["policy_ms"], r["env_ms"] - r["mlagents_ms"],
            r["mlagents_ms"] - r["wait_ms"], r["wait_ms"], r["standin_ms"],
            r["wait_ms"] - r["standin_ms"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", default="1,2",
                        help="comma-separated instance counts to run (default 1,2)")
    parser.add_argument("--baseline", type=Path, default=None,
                        help="a folder holding an older copy of envs/ to run beside this one")
    parser.add_argument("--steps", type=int, default=1000, help="decisions per loop phase")
    parser.add_argument("--seconds", type=float, default=20.0, help="time cap per phase")
    parser.add_argument("--rounds", type=int, default=3,
                        help="interleaved repetitions; the fastest of each phase is reported")
    parser.add_argument("--device", default="cpu", help="the policy's device (default cpu)")
    parser.add_argument("--torch-threads", type=int, default=1,
                        help="torch threads of the policy (default 1: on a small machine more "
                             "threads spin against the environment processes)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return

    import envs  # noqa: F401
    from envs import spin_wait
    from huggy_agent.tables import format_table

    counts = [int(k) for k in args.instances.split(",")]
    common = {"steps": args.steps, "seconds": args.seconds, "device": args.device,
              "torch_threads": args.torch_threads, "root": str(REPO), "fast_paths": True}
    phases: dict[str, dict[str, Any]] = {
        f"{k} instance{'s' * (k > 1)}": {**common, "instances": k} for k in counts}
    phases.update({f"{k} instances, pinned": {**common, "instances": k, "pin_cores": True}
                   for k in counts if k > 1})
    phases["1 instance, mlagents-envs' own paths"] = {**common, "instances": 1,
                                                      "fast_paths": False}
    if 1 in counts:
        phases[DEFAULT_THREADS] = {**common, "instances": 1, "torch_threads": None}
        phases[BLOCKING] = {**common, "instances": 1,
                            "environ": {spin_wait.ENVIRONMENT_VARIABLE: "0"}}
    if args.baseline is not None:
        if not (args.baseline / "envs" / "__init__.py").is_file():
            raise SystemExit(f"--baseline: no envs/ package in {args.baseline}")
        phases["baseline, 1 instance"] = {**common, "instances": 1,
                                          "root": str(args.baseline.resolve())}
    best: dict[str, dict[str, Any]] = {}
    for _ in range(args.rounds):
        for name, spec in phases.items():
            result = run_phase(spec)
            if name not in best or result["rate"] > best[name]["rate"]:
                best[name] = result

    sim_rate, standin_rate = max(bench_sim(args.steps, args.seconds) for _ in range(args.rounds))
    print(format_table(["stand-in alone (18 agents, no gRPC)", "agent-steps/s"], [
        ("HuggySim.step", sim_rate), ("HuggySim.step + wire encoding", standin_rate)]))
    print()
    paths = bench_mlagents_paths(max(100, args.steps // 2))
    print(format_table(["mlagents-envs per step (18 agents)", "original us", "fast us", "speed-up"],
                       [(name, o, f, f"{o / f:.1f}x") for name, (o, f) in paths.items()]))
    print()
    one = best.get("1 instance")
    base = best.get("baseline, 1 instance")
    rows = []
    for name, r in best.items():
        rows.append((name, r["agents"], r["rate"], r["step_ms"], r["policy_ms"],
                     r["env_ms"] - r["wait_ms"], r["wait_ms"],
                     f"{r['rate'] / one['rate']:.2f}x" if one else "",
                     f"{r['rate'] / base['rate']:.2f}x" if base else ""))
    print(format_table(["loop, bundled policy", "slots", "agent-decisions/s", "ms/step",
                        "policy ms", "env Python ms", "waiting ms", "vs 1 instance",
                        "vs baseline"], rows))
    print()
    split = [_split_row(name, r) for name, r in best.items()
             if r["standin_ms"] is not None
             and name not in ("1 instance, mlagents-envs' own paths", DEFAULT_THREADS, BLOCKING)]
    print("Where one instance's step goes (ms; waiting = stand-in's own work + gRPC/transport):")
    print(format_table(["one instance", "step", "policy", "vector env (ours)",
                        "mlagents-envs+protobuf", "waiting", "stand-in work", "gRPC+transport"],
                       split))
    memories = [m for r in best.values() for m in r["memory"].get("instances", [])]
    if memories:
        rss = [worker + unity for worker, _, unity, _ in memories]
        pss = [worker + unity for _, worker, _, unity in memories]
        print()
        print(f"memory per extra instance (worker + its Unity process): RSS {np.mean(rss):.1f} MB "
              f"(max {max(rss):.1f}), PSS {np.mean(pss):.1f} MB (max {max(pss):.1f}); target "
              "<= 150 MB")
    print()
    if one:
        print(f"1 instance: {one['rate']:,.0f} agent-decisions/s (target >= 20,000), "
              f"{one['rate'] / best[BLOCKING]['rate']:.2f}x its rate with blocking waits")
    for name in ("2 instances", "2 instances, pinned"):
        if one and name in best:
            print(f"{name} vs 1: {best[name]['rate'] / one['rate']:.2f}x "
                  f"(target >= 1.5x on 2 cores; vs 1 with blocking waits "
                  f"{best[name]['rate'] / best[BLOCKING]['rate']:.2f}x: instances on fewer "
                  "than 2 CPUs each block)")
    if one and base:
        print(f"1 instance vs baseline: {one['rate'] / base['rate']:.2f}x (target >= 1.2x)")
    for name in ("8 instances", "8 instances, pinned"):
        if name in best:
            print(f"{name}: {best[name]['rate']:,.0f} agent-decisions/s "
                  "(target >= 40,000 on the 16-core GPU host)")
    default_threads = (f" ({DEFAULT_THREADS}: {best[DEFAULT_THREADS]['threads']})"
                       if DEFAULT_THREADS in best else "")
    print(f"cores: {os.cpu_count()}, policy on {args.device}, torch threads {args.torch_threads}"
          + default_threads)


if __name__ == "__main__":
    main()
