"""`huggy benchmark`: our compute_action, through `auto` and through each engine asked for,
against onnxruntime and a plain eager torch forward, measured in one run with one thread count
(interleaved, so that load from other processes hits every candidate alike), plus the machine's
own float32 matmul rate and each engine's load and first-call time.

"Cold" latencies are single calls right after `EVICT_BYTES` of other memory was written: the
weights then come from memory, not from the caches, as in a server where other work (the HTTP
stack, other processes) ran between two requests.

Deterministic and stochastic actions both: onnxruntime's stochastic reference is the ML-Agents
graph's own `continuous_actions`, sampled in the graph (RandomNormalLike); ours draws the host
noise of a fresh stream per call (`seed=None`)."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from huggy_agent.actor import mlp_policy
from huggy_agent.actor.encoders import Normalizer
from huggy_agent.agent import HuggyAgent
from huggy_agent.devices import available_devices
from huggy_agent.engines import ENGINES, resolve_engine
from huggy_agent.formats.export_onnx import export_onnx
from huggy_agent.reference import canonical_observations

STOCHASTIC = ", stochastic"
"""The suffix of the stochastic rows' names."""


@dataclass
class Candidate:
    """One implementation under test: `single(obs_row)` and `batch(obs_batch)`."""

    name: str
    single: Callable[[np.ndarray], object]
    batch: Callable[[np.ndarray], object]


def flops_per_observation(agent: HuggyAgent) -> int:
    """The floating-point operations of the Linear layers for one observation.

    Args:
        agent: the policy.

    Returns:
        2 x the multiply-adds of every weight matrix (about 1.13 MFLOP for Huggy).
    """
    return 2 * sum(p.numel() for name, p in agent.net.named_parameters() if name.endswith("weight"))


def matmul_gflops(threads: int, size: int = 1024, seconds: float = 1.0) -> float:
    """This machine's float32 matrix-multiply rate, measured now.

    Args:
        threads: torch's thread count for the measurement (left set afterwards).
        size: the side of the square matrices multiplied.
        seconds: how long to multiply.

    Returns:
        The rate in GFLOP/s.
    """
    torch.set_num_threads(threads)
    a, b = torch.randn(size, size), torch.randn(size, size)
    out = torch.empty(size, size)
    torch.mm(a, b, out=out)
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        torch.mm(a, b, out=out)
        calls += 1
    return 2 * size**3 * calls / (time.perf_counter() - start) / 1e9


def mlp_parts(agent: HuggyAgent) -> tuple[Normalizer | None, nn.Sequential]:
    """The parts of an MLP policy such as Huggy's that a user would run by hand.

    Args:
        agent: a policy with one vector input and continuous actions only
            (`huggy_agent.actor.MlpPolicy`).

    Returns:
        The normalizer (None without one) and an `nn.Sequential` of the body and mu layers.

    Raises:
        ValueError: any other kind of policy (the plain-eager baselines cover that kind only).
    """
    parts = mlp_policy(agent.net)
    body = agent.net.network_body._body_endoder.seq_layers
    return parts.normalizer, nn.Sequential(*body, parts.mu)


def _plain_eager(agent: HuggyAgent) -> Callable[[np.ndarray], np.ndarray]:
    """What a user writes by hand: nn.Sequential of the same weights, under torch.no_grad()."""
    normalizer, sequential = mlp_parts(agent)
    sequential = sequential.eval()
    size = agent.spec.inputs[0].shape[0]
    mean = normalizer.running_mean if normalizer is not None else torch.zeros(size)
    std = normalizer.std if normalizer is not None else torch.ones(size)

    def forward(obs: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            x = torch.clamp((torch.as_tensor(obs) - mean) / std, -5, 5)
            return (torch.clamp(sequential(x), -3, 3) / 3).numpy()

    return forward


def _onnxruntime(onnx_path: Path, threads: int, output: str) -> Callable[[np.ndarray], object]:
    """`output` (`deterministic_continuous_actions` or `continuous_actions`) of an ML-Agents ONNX
    file, run by onnxruntime with `threads` intra-op threads."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])
    return lambda obs: session.run([output], {"obs_0": obs})


SETTLE_S = 0.1
"""The pause before each candidate's turn: onnxruntime's worker threads spin for a while after
each run, and would slow whichever candidate comes next on the same cores (docs/benchmarks.md,
"Summary", the `huggy benchmark` rows)."""


EVICT_BYTES = 64 << 20
"""Memory written before each cold call: more than the last-level cache of common CPUs."""


def _latencies(candidates: list[Candidate], row: np.ndarray, rounds: int, calls: int
               ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(warm, cold) latencies in seconds: per round and candidate, `calls` calls back to back,
    then `calls // 20` (at least 5) each after writing `EVICT_BYTES`. Interleaved rounds, so
    noise from other processes hits every candidate alike; each turn starts after `SETTLE_S`."""
    warm: dict[str, list[float]] = {c.name: [] for c in candidates}
    cold: dict[str, list[float]] = {c.name: [] for c in candidates}
    evict = np.zeros(EVICT_BYTES // 4, dtype=np.float32)
    for candidate in candidates:  # warm-up
        for _ in range(max(50, calls // 4)):
            candidate.single(row)
    for _ in range(rounds):
        for candidate in candidates:
            time.sleep(SETTLE_S)
            for _ in range(calls):
                start = time.perf_counter()
                candidate.single(row)
                warm[candidate.name].append(time.perf_counter() - start)
            for _ in range(max(5, calls // 20)):
                evict += 1.0
                start = time.perf_counter()
                candidate.single(row)
                cold[candidate.name].append(time.perf_counter() - start)
    return ({name: np.array(values) for name, values in warm.items()},
            {name: np.array(values) for name, values in cold.items()})


def _throughputs(candidates: list[Candidate], batch: np.ndarray, repeats: int) -> dict[str, float]:
    """Best of `repeats` interleaved calls per candidate, each after `SETTLE_S`, in observations
    per second."""
    best = {c.name: float("inf") for c in candidates}
    for candidate in candidates:
        candidate.batch(batch)
    for _ in range(repeats):
        for candidate in candidates:
            time.sleep(SETTLE_S)
            start = time.perf_counter()
            candidate.batch(batch)
            best[candidate.name] = min(best[candidate.name], time.perf_counter() - start)
    return {name: len(batch) / seconds for name, seconds in best.items()}


def _engine_setups(engines: Sequence[str]) -> list[tuple[str, str]]:
    """(engine, device kind) pairs to measure: each named engine (or every engine, for `all`)
    on each device kind here where it can run."""
    wanted = list(ENGINES) if "all" in engines else [e for e in engines if e != "auto"]
    setups = []
    refusals: dict[str, str] = {}
    for device in reversed(available_devices()):  # cpu first
        for engine in wanted:
            try:
                resolve_engine(engine, torch.device(device), "fp32")
            except ValueError as error:
                refusals.setdefault(engine, str(error))
                continue
            setups.append((engine, device))
    if "all" not in engines:  # an engine asked for by name runs somewhere, or is an error
        for engine in wanted:
            if not any(name == engine for name, _ in setups):
                raise ValueError(f"engine {engine} runs on no device here: {refusals[engine]}")
    return setups


def _start_ms(policy: str | Path | None, device: str, engine: str) -> tuple[float, float]:
    """(load, first call at one observation) in ms for a fresh agent, in this warm process."""
    start = time.perf_counter()
    agent = HuggyAgent(policy, device=device, engine=engine)
    loaded = time.perf_counter()
    agent.compute_action(np.zeros(agent.obs_size, dtype=np.float32))
    return 1e3 * (loaded - start), 1e3 * (time.perf_counter() - loaded)


def run_benchmark(policy: str | Path | None = None, threads: int | None = None,
                  rounds: int = 10, calls: int = 200, batch_size: int = 4096,
                  batch_repeats: int = 5, engines: Sequence[str] = ("all",)) -> dict[str, Any]:
    """All figures of `huggy benchmark` (docs/policy.md, "Engines", says what each means).

    Row 0 is `huggy compute_action` through `auto` on the CPU, rows 1 and 2 the references
    (onnxruntime on the policy's ML-Agents ONNX file or an export of it, plain eager torch), rows
    3 and 4 stochastic actions (ours through `auto`, onnxruntime's in-graph sampling), then one
    row per other (engine, device) of `engines`: the engine `auto` runs on the CPU is row 0 (a
    second session of it would only compete with the first for the cores).

    Args:
        policy: the policy (None: the bundled one); an MLP policy.
        threads: torch's and onnxruntime's thread count; None keeps torch's current count.
        rounds: interleaved rounds of single-observation calls.
        calls: warm calls per candidate and round (and `calls // 20`, at least 5, cold ones).
        batch_size: rows of the throughput batch.
        batch_repeats: timed batch calls per candidate (the best counts).
        engines: engine names, or `all` for every engine that runs here.

    Returns:
        The thread count, batch size, FLOP per observation, matmul rate, `auto`'s engine, load and
            first-call times per engine, one result per candidate (latency percentiles in
            microseconds, cold p50, batch throughput, share of the matmul rate, ratios to
            onnxruntime) and the headline ratios.

    Raises:
        ValueError: the policy is not an MLP policy, or an engine named runs on no device here.
    """
    threads = threads or torch.get_num_threads()
    torch.set_num_threads(threads)
    agent = HuggyAgent(policy, device="cpu")
    try:
        mlp_parts(agent)
    except ValueError:
        raise ValueError(f"benchmark measures MLP policies (one vector input, continuous actions "
                         f"only: what its eager torch baseline runs); this policy is "
                         f"{agent.spec.describe()}") from None
    setups = [setup for setup in _engine_setups(engines) if setup != (agent.engine, "cpu")]
    starts = {"auto (cpu)": _start_ms(policy, "cpu", "auto")}
    starts.update({f"{engine} ({device})": _start_ms(policy, device, engine)
                   for engine, device in setups})
    with tempfile.TemporaryDirectory() as tmp:
        onnx_path = agent.loaded.origin if agent.loaded.file_format == "mlagents-onnx" \
            else export_onnx(agent.net, Path(tmp) / "policy.onnx")
        ort_run = _onnxruntime(Path(onnx_path), threads, "deterministic_continuous_actions")
        ort_sample = _onnxruntime(Path(onnx_path), threads, "continuous_actions")
        eager = _plain_eager(agent)

        def stochastic(obs: np.ndarray) -> object:
            return agent.compute_action(obs, deterministic=False)

        candidates = [
            Candidate("huggy compute_action", agent.compute_action, agent.compute_action),
            Candidate("onnxruntime", lambda o: ort_run(o[None]), ort_run),
            Candidate("torch eager Sequential", lambda o: eager(o[None]), eager),
            Candidate(f"huggy compute_action{STOCHASTIC}", stochastic, stochastic),
            Candidate(f"onnxruntime{STOCHASTIC}", lambda o: ort_sample(o[None]), ort_sample),
        ]
        for engine, device in setups:
            other = HuggyAgent(policy, device=device, engine=engine)
            candidates.append(Candidate(f"huggy compute_action [{engine}, {device}]",
                                        other.compute_action, other.compute_action))
        obs = canonical_observations(agent.loaded, batch_size, seed=1)
        latencies, cold_latencies = _latencies(candidates, obs[1], rounds, calls)
        throughputs = _throughputs(candidates, obs, batch_repeats)
    gflops = matmul_gflops(threads)
    flops = flops_per_observation(agent)
    results: list[dict[str, Any]] = []
    for candidate in candidates:
        lat = latencies[candidate.name] * 1e6
        results.append({
            "name": candidate.name,
            "p50_us": float(np.percentile(lat, 50)), "p95_us": float(np.percentile(lat, 95)),
            "p99_us": float(np.percentile(lat, 99)),
            "cold_p50_us": float(np.percentile(cold_latencies[candidate.name] * 1e6, 50)),
            "batch_obs_per_s": throughputs[candidate.name],
            "matmul_efficiency": throughputs[candidate.name] * flops / (gflops * 1e9),
        })
    ours, ort_result, eager_result, ours_sampled, ort_sampled = results[:5]
    for result in results:  # stochastic rows against onnxruntime's sampling, the rest against its
        reference = ort_sampled if result["name"].endswith(STOCHASTIC) else ort_result
        result["p50_vs_onnxruntime"] = result["p50_us"] / reference["p50_us"]
        result["cold_p50_vs_onnxruntime"] = result["cold_p50_us"] / reference["cold_p50_us"]
    return {
        "threads": threads, "batch_size": batch_size, "flops_per_obs": flops,
        "matmul_gflops": gflops, "auto_engine": agent.engine,
        "load_ms": starts["auto (cpu)"][0], "first_call_ms": starts["auto (cpu)"][1],
        "engines": [{"engine": name, "load_ms": load, "first_call_ms": first}
                    for name, (load, first) in starts.items()],
        "results": results,
        "ratios": {
            "p50_vs_onnxruntime": ours["p50_us"] / ort_result["p50_us"],
            "p50_vs_eager": ours["p50_us"] / eager_result["p50_us"],
            "cold_p50_vs_onnxruntime": ours["cold_p50_us"] / ort_result["cold_p50_us"],
            "stochastic_p50_vs_onnxruntime": ours_sampled["p50_us"] / ort_sampled["p50_us"],
            "batch_vs_onnxruntime": ours["batch_obs_per_s"] / ort_result["batch_obs_per_s"],
            "batch_vs_matmul_rate": ours["matmul_efficiency"],
            "per_row_p50_vs_onnxruntime": {r["name"]: r["p50_vs_onnxruntime"] for r in results},
        },
    }
