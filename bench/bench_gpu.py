"""The accelerator table for our engines, every figure against a baseline of the same run
(bounded; not a test).

    .venv/bin/python bench/bench_gpu.py                       # on a CUDA machine (~2 minutes)
    .venv/bin/python bench/bench_gpu.py --device cpu --sizes 4096 --rounds 3   # dry run, no GPU

On the GPU machine (torch 2.11, no torch.accelerator.Graph: the engine uses torch.cuda.CUDAGraph),
run it from the source tree with `PYTHONPATH=.`. Rows, each measured in one run with interleaved
rounds:

- one observation, numpy in and numpy out, p50/p99: `compute_action` through auto (cuda-graph)
  and through the eager `torch` engine; a plain eager nn.Sequential of the same weights; and a
  hand-written CUDA graph of the same network and head with pinned buffers (the floor);
- throughput, numpy in and out, at each of `--sizes` (fp32) and the first size in bf16: auto,
  the eager `torch` engine, and the same network on device-resident input (no copies: the
  ceiling);
- capture: the first rung (which also initialises cuBLAS), each further rung, and a warm-up of
  the rungs a Serve replica uses.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from huggy_agent import HuggyAgent  # noqa: E402
from huggy_agent.actor import PPO_ACTION_CLIP  # noqa: E402
from huggy_agent.actor.encoders import NORMALIZER_CLIP  # noqa: E402
from huggy_agent.benchmark import mlp_parts  # noqa: E402
from huggy_agent.reference import canonical_observations  # noqa: E402
from huggy_agent.tables import format_table  # noqa: E402

Call = Callable[[np.ndarray], object]


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def plain_eager(agent: HuggyAgent) -> Call:
    """What a user writes by hand: nn.Sequential of the same weights on the device, numpy in and
    out, under torch.no_grad()."""
    normalizer, sequential = mlp_parts(agent)
    sequential = sequential.eval()
    layer_dtype = agent.net.layer_dtype

    def forward(obs: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            x = torch.as_tensor(obs).to(agent.device)
            if normalizer is not None:
                x = torch.clamp((x - normalizer.running_mean) / normalizer.std, -NORMALIZER_CLIP,
                                NORMALIZER_CLIP)
            mu = sequential(x.to(layer_dtype)).float()
            return (torch.clamp(mu, -PPO_ACTION_CLIP, PPO_ACTION_CLIP) / PPO_ACTION_CLIP).cpu().numpy()

    return forward


def hand_written_graph(agent: HuggyAgent) -> Call:
    """The network and head captured once as a CUDA graph for one observation, with pinned
    buffers and one copy each way: the floor for a numpy round trip."""
    device = agent.device
    host_in = torch.zeros(1, agent.obs_size, pin_memory=True)
    host_out = torch.zeros(1, agent.act_size, pin_memory=True)
    static_in = torch.zeros(1, agent.obs_size, device=device)
    with torch.inference_mode():
        def head() -> torch.Tensor:
            mu = agent.net(static_in)[0].float()
            return torch.clamp(mu, -PPO_ACTION_CLIP, PPO_ACTION_CLIP) / PPO_ACTION_CLIP

        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(3):
                head()
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = head()
    host_in_array = host_in.numpy()

    def call(obs: np.ndarray) -> np.ndarray:
        host_in_array[...] = obs
        static_in.copy_(host_in, non_blocking=True)
        graph.replay()
        host_out.copy_(static_out, non_blocking=True)
        torch.cuda.current_stream(device).synchronize()
        return host_out.numpy().copy()

    return call


def device_resident(agent: HuggyAgent, obs: np.ndarray) -> Callable[[], None]:
    """The network and head on input already on the device, output left there: the ceiling."""
    x = torch.from_numpy(obs).to(agent.device)

    def call() -> None:
        with torch.inference_mode():
            mu = agent.net(x)[0].float()
            torch.clamp(mu, -PPO_ACTION_CLIP, PPO_ACTION_CLIP).div_(PPO_ACTION_CLIP)
        synchronize(agent.device)

    return call


def latencies(candidates: dict[str, Call], row: np.ndarray, rounds: int, calls: int
              ) -> dict[str, np.ndarray]:
    """Seconds per call, interleaved rounds."""
    times: dict[str, list[float]] = {name: [] for name in candidates}
    for call in candidates.values():
        for _ in range(100):
            call(row)
    for _ in range(rounds):
        for name, call in candidates.items():
            for _ in range(calls):
                start = time.perf_counter()
                call(row)
                times[name].append(time.perf_counter() - start)
    return {name: np.array(values) for name, values in times.items()}


def throughputs(candidates: dict[str, Callable[[], object]], rows: int, rounds: int
                ) -> dict[str, float]:
    """Observations per second, best of `rounds` interleaved calls."""
    best = {name: float("inf") for name in candidates}
    for call in candidates.values():
        call()
    for _ in range(rounds):
        for name, call in candidates.items():
            start = time.perf_counter()
            call()
            best[name] = min(best[name], time.perf_counter() - start)
    return {name: rows / seconds for name, seconds in best.items()}


def capture_times(policy: Path | None, device: str) -> list[tuple[str, float]]:
    """(what, ms): the first capture, each further rung, and a Serve replica's warm-up."""
    agent = HuggyAgent(policy, device=device)
    if not hasattr(agent._engine, "capture_seconds"):  # not a graph engine
        return []
    seconds = agent._engine.capture_seconds
    rows = []
    for rung in (1, 2, 64, 1024, 16384):
        agent.warmup([rung], paths=("deterministic",))
        rows.append((f"capture act, {rung} rows" + (" (first: cuBLAS init too)" if rung == 1
                                                   else ""), 1e3 * seconds[("act", rung)]))
    start = time.perf_counter()
    agent.warmup([1 << k for k in range(9)], paths=("distribution",))
    rows.append(("warm-up of a Serve replica (forward, 1-256 rows)",
                 1e3 * (time.perf_counter() - start)))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu for a dry run")
    parser.add_argument("--policy", type=Path, default=None, help="default: the bundled policy")
    parser.add_argument("--sizes", type=lambda s: [int(v) for v in s.split(",")],
                        default=[65536, 262144], help="batch sizes for throughput")
    parser.add_argument("--rounds", type=int, default=10, help="interleaved rounds")
    parser.add_argument("--calls", type=int, default=200, help="calls per round at one row")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA device here; use --device cpu for a dry run", file=sys.stderr)
        return 2
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"{name}, torch {torch.__version__}, "
          f"torch.accelerator.Graph: {hasattr(getattr(torch, 'accelerator', None), 'Graph')}")

    captures = capture_times(args.policy, args.device)  # on fresh agents, before anything else
    auto = HuggyAgent(args.policy, device=args.device)
    eager_engine = HuggyAgent(args.policy, device=args.device, engine="torch")
    print(f"auto runs {auto.engine}: {auto.describe()['engine_detail']}")
    obs = canonical_observations(auto.loaded, max(args.sizes), seed=1)

    single: dict[str, Call] = {
        f"ours compute_action [{auto.engine}]": auto.compute_action,
        "ours compute_action [torch, eager]": eager_engine.compute_action,
        "plain eager nn.Sequential": plain_eager(auto),
    }
    if device.type == "cuda":
        single["hand-written CUDA graph, pinned buffers"] = hand_written_graph(auto)
    lat = latencies(single, obs[1], args.rounds, args.calls)
    ours_p50 = float(np.median(lat[next(iter(single))]))
    rows = [(label, 1e6 * float(np.median(t)), 1e6 * float(np.percentile(t, 99)),
             f"{float(np.median(t)) / ours_p50:.2f}") for label, t in lat.items()]
    print("\none observation, numpy in and out")
    print(format_table(["implementation", "p50 us", "p99 us", "p50 / ours"], rows))

    table = []
    for precision, sizes in (("fp32", args.sizes), ("bf16", args.sizes[:1])):
        fast = auto if precision == "fp32" else HuggyAgent(args.policy, device=args.device,
                                                           precision=precision)
        eager = eager_engine if precision == "fp32" else HuggyAgent(
            args.policy, device=args.device, precision=precision, engine="torch")
        for size in sizes:
            batch = obs[:size]
            rates = throughputs({
                f"ours [{fast.engine}]": lambda b=batch, a=fast: a.compute_action(b),
                "ours [torch, eager]": lambda b=batch, a=eager: a.compute_action(b),
                "device-resident input (ceiling)": device_resident(fast, batch),
            }, size, max(3, args.rounds // 2))
            ours = rates[f"ours [{fast.engine}]"]
            table += [(f"{size:,} {precision}", label, f"{rate / 1e6:.3g} M",
                       f"{ours / rate:.2f}") for label, rate in rates.items()]
    print("\nthroughput, numpy in and out (the ceiling keeps its data on the device)")
    print(format_table(["batch", "implementation", "obs/s", "ours / this"], table))
    if captures:
        print("\ngraph capture")
        print(format_table(["what", "ms"], captures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
