"""`huggy` subcommands about the policy itself: info, act, sample, batch, precision, onnx-compare,
fingerprint, stats, benchmark, export-onnx, checkpoints."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from huggy_agent.agent import HuggyAgent
from huggy_agent.benchmark import EVICT_BYTES, run_benchmark
from huggy_agent.cli.arguments import positive_int, seed64
from huggy_agent.diagnostics import (
    Agreement,
    fingerprints,
    onnx_compare,
    policy_stats,
    precision_report,
)
from huggy_agent.engines import ENGINE_NAMES
from huggy_agent.formats import load_policy
from huggy_agent.formats.export_onnx import export_onnx
from huggy_agent.formats.results import list_checkpoints
from huggy_agent.formats.sources import policy_path
from huggy_agent.reference import canonical_inputs
from huggy_agent.tables import format_table
from huggy_agent_client.actions import ActionResult, Actions, split_memory
from huggy_agent_client.http_api import json_kind
from huggy_agent_client.spec import ActorSpec


def _json_flag(flag: str, text: str, booleans: bool = False) -> Any:
    """The value of a JSON flag that holds numbers in (nested) lists, and booleans where
    `booleans`; ValueError naming the flag, what it expects and what came (the first value
    that is not a number, with its place)."""
    expected = "numbers" + (" or booleans" if booleans else "") + " in JSON lists"
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{flag}: expected {expected}, received {text[:40]!r}, which is not "
                         f"JSON ({error.msg} at character {error.pos})") from None
    found = _first_other_than_numbers(value, booleans)
    if found is not None:
        other, place = found
        shown = (f"the string {other!r}" if isinstance(other, str)
                 else json.dumps(other) if other is None or isinstance(other, bool)
                 else json_kind(other))
        raise ValueError(f"{flag}: expected {expected}, received {shown}"
                         + (f" at {place}" if place else ""))
    return value


def _first_other_than_numbers(value: Any, booleans: bool, place: str = ""
                              ) -> tuple[Any, str] | None:
    """The first value in `value` (lists walked in order) that is not a number (or a boolean,
    where `booleans`), and its place as `[i][j]`; None if there is none."""
    if isinstance(value, list):
        for index, item in enumerate(value):
            found = _first_other_than_numbers(item, booleans, f"{place}[{index}]")
            if found is not None:
                return found
        return None
    if isinstance(value, bool):
        return None if booleans else (value, place)
    return None if isinstance(value, (int, float)) else (value, place)


def _float32_array(flag: str, value: Any) -> np.ndarray:
    """Numbers checked by `_json_flag` as a float32 array; ValueError for ragged lists or a
    finite number beyond float32 (which would turn into an infinity)."""
    try:
        array = np.asarray(value, dtype=np.float64)
    except ValueError:
        raise ValueError(f"{flag}: expected lists of one length at each level, received ragged "
                         f"lists") from None
    beyond = np.isfinite(array) & (np.abs(array) > np.finfo(np.float32).max)
    if beyond.any():
        place = "".join(f"[{i}]" for i in np.unravel_index(int(np.argmax(beyond)), array.shape))
        raise ValueError(f"{flag}: expected float32 numbers, received {array[beyond][0]:g}"
                         + (f" at {place}" if place else "") + ", beyond float32's range")
    return array.astype(np.float32)


def _add_policy_options(parser: argparse.ArgumentParser, device: bool = True,
                        engine_default: str = "auto") -> None:
    parser.add_argument("--policy", type=policy_path, default=None,
                        help="a .onnx, a .pt or a results folder, local or "
                             "hf://owner/repo[@revision][/path] (default: the bundled Huggy policy)")
    if device:
        parser.add_argument("--device", default="auto",
                            help="auto (NPU, then CUDA, then CPU), cpu, cuda[:N] or npu[:N]")
        parser.add_argument("--precision", default="fp32", choices=["fp32", "fp16", "bf16"],
                            help="precision of the layers; the normalizer stays float32")
        parser.add_argument("--engine", default=engine_default, choices=ENGINE_NAMES,
                            help="how the network runs (default auto: the fastest correct "
                                 "engine for the device, by a fixed rule)"
                            if engine_default == "auto" else
                            f"how our network runs (default {engine_default}; onnxruntime, "
                            "and native's batches, would compare onnxruntime with itself)")


def _add_json(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def _agent(args: argparse.Namespace, seed: int | None = None) -> HuggyAgent:
    return HuggyAgent(args.policy, device=args.device, precision=args.precision, seed=seed,
                      engine=args.engine)


def _print_json(data: object) -> None:
    print(json.dumps(data, indent=2, default=str))


def _observation(args: argparse.Namespace, agent: HuggyAgent) -> list[np.ndarray]:
    """One observation row per input: from --obs (JSON: the row of a single-input policy, or a
    list of rows, one per input), else canonical row 1 (drawn from the normalizers' statistics)."""
    if args.obs is not None:
        value = _json_flag("--obs", args.obs)
        inputs = [value] if len(agent.spec.inputs) == 1 else value
        if not isinstance(inputs, list) or len(inputs) != len(agent.spec.inputs):
            raise ValueError(f"--obs: this policy has {len(agent.spec.inputs)} inputs "
                             f"({agent.spec.describe()}); give a JSON list of one observation "
                             "per input")
        return [_float32_array("--obs" if len(inputs) == 1 else f"--obs[{index}]", row)
                for index, row in enumerate(inputs)]
    return [array[1] for array in canonical_inputs(agent.loaded, 2, seed=args.obs_seed)]


def _add_observation_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--obs", default=None,
                        help="one observation as JSON: a list of numbers, or for a policy with "
                             "several inputs a list with one (nested) list per input (default: a "
                             "random one drawn from the normalizers' statistics)")
    parser.add_argument("--obs-seed", type=seed64, default=0,
                        help="seed of the random observation when --obs is not given")
    parser.add_argument("--mask", default=None,
                        help="action mask as a JSON list of 0/1 or booleans, one per discrete "
                             "action of every branch, 1 = allowed (default: all allowed)")


def _policy_args(agent: HuggyAgent, observation: list[np.ndarray], args: argparse.Namespace,
                 rows: int | None = None) -> dict[str, Any]:
    """compute_action's obs and action_mask, one row or `rows` copies of it."""
    inputs = observation if rows is None else [np.repeat(o[None], rows, axis=0)
                                               for o in observation]
    mask = None
    if args.mask is not None:
        if not agent.spec.discrete_branches:
            raise ValueError(f"--mask: this policy has no discrete actions to mask "
                             f"({agent.spec.describe()})")
        mask = np.asarray(_json_flag("--mask", args.mask, booleans=True))
    return {"obs": inputs[0] if len(inputs) == 1 else inputs, "action_mask": mask}


def _as_lists(result: ActionResult, agent: HuggyAgent) -> dict[str, list[Any]]:
    """A compute_action result as JSON-ready lists by kind."""
    out: dict[str, list[Any]] = {}
    actions, memory = split_memory(result)
    if memory is not None:
        out["memory"] = memory.tolist()
    if isinstance(actions, Actions):
        out.update(continuous=actions.continuous.tolist(), discrete=actions.discrete.tolist())
    else:
        out["discrete" if agent.spec.discrete_branches else "continuous"] = actions.tolist()
    return out


def cmd_info(args: argparse.Namespace) -> int:
    """`huggy info`: a policy's architecture, parameter counts and fingerprint, after a warm-up call
    (so that a graph engine's table says what really runs).

    Args:
        args: the parsed command line.

    Returns:
        0.
    """
    agent = _agent(args)
    agent.warmup([1])  # a graph engine captures and checks its first graphs: say what really runs
    info = agent.describe()
    if args.json:
        _print_json(info)
        return 0
    params = info["parameters"]
    rows = [("source", info["hub_source"] or info["source"]), ("format", info["format"]),
            ("step", info["step"]),
            ("interface", _agent_spec_line(info)), ("network", info["summary"]),
            ("linear parameters (body + heads)", params["body"] + params["heads"]),
            ("encoder parameters", params["encoders"]), ("LSTM parameters", params["lstm"]),
            ("log-sigma parameters", params["log_sigma"]),
            ("normalizer values", params["normalizer"]), ("fingerprint", info["fingerprint"]),
            ("device", info["device"]), ("precision", info["precision"]),
            ("engine", info["engine"]), ("engine reason", info["engine_reason"]),
            ("engine detail", info["engine_detail"])]
    print(format_table(["field", "value"], rows))
    return 0


def _agent_spec_line(info: dict[str, Any]) -> str:
    return ActorSpec.from_dict(info["spec"]).describe()


def cmd_act(args: argparse.Namespace) -> int:
    """`huggy act`: the actions for one observation.

    Args:
        args: the parsed command line.

    Returns:
        0.

    Raises:
        ValueError: a malformed observation, mask or memory, or `--memory` for a policy without
            one.
    """
    agent = _agent(args)
    observation = _observation(args, agent)
    kwargs = _policy_args(agent, observation, args)
    if args.memory is not None:
        if not agent.spec.memory_size:
            raise ValueError(f"--memory: this policy has no recurrent memory "
                             f"({agent.spec.describe()})")
        kwargs["memory"] = _float32_array("--memory", _json_flag("--memory", args.memory))
    result = _as_lists(agent.compute_action(deterministic=not args.stochastic, seed=args.seed,
                                            **kwargs), agent)
    if args.json:
        _print_json({"obs": [o.tolist() for o in observation], **result,
                     "deterministic": not args.stochastic, "seed": args.seed})
    else:
        for name, values in result.items():
            print(f"{name}:", np.array2string(np.asarray(values), precision=4,
                                              max_line_width=100))
    return 0


def cmd_sample(args: argparse.Namespace) -> int:
    """`huggy sample`: many stochastic actions for one observation, summarised.

    Args:
        args: the parsed command line.

    Returns:
        0.
    """
    agent = _agent(args, seed=args.seed)
    observation = _observation(args, agent)
    samples, _ = split_memory(agent.compute_action(
        deterministic=False, seed=args.seed, **_policy_args(agent, observation, args, args.samples)))
    mean_action, _ = split_memory(agent.compute_action(**_policy_args(agent, observation, args)))
    continuous = samples.continuous if isinstance(samples, Actions) else (
        None if agent.spec.discrete_branches else samples)
    discrete = samples.discrete if isinstance(samples, Actions) else (
        samples if agent.spec.discrete_branches else None)
    summary: dict[str, Any] = {"deterministic": _as_lists(mean_action, agent),
                               "samples": args.samples, "seed": args.seed}
    rows = []
    if continuous is not None:
        summary.update(mean=continuous.mean(0).tolist(), std=continuous.std(0).tolist())
        deterministic = np.asarray(summary["deterministic"]["continuous"])
        rows += [(f"continuous {i}", f"{deterministic[i]:+.4f}",
                  f"mean {continuous[:, i].mean():+.4f}, std {continuous[:, i].std():.4f}")
                 for i in range(continuous.shape[1])]
    if discrete is not None:
        frequencies = [np.bincount(discrete[:, b], minlength=size) / len(discrete)
                       for b, size in enumerate(agent.spec.discrete_branches)]
        summary["frequencies"] = [f.tolist() for f in frequencies]
        deterministic = summary["deterministic"]["discrete"]
        rows += [(f"branch {b}", str(deterministic[b]),
                  " ".join(f"{a}:{share:.3f}" for a, share in enumerate(f)))
                 for b, f in enumerate(frequencies)]
    if args.json:
        _print_json(summary)
        return 0
    print(format_table(["action", "deterministic", f"{args.samples} samples"], rows))
    return 0


def _batch_inputs(args: argparse.Namespace, agent: HuggyAgent) -> list[np.ndarray]:
    if args.input is None:
        return canonical_inputs(agent.loaded, args.count, seed=args.obs_seed)
    try:
        loaded = np.load(args.input)
    except ValueError as error:  # not a .npy or .npz file of numbers (numpy says what it found)
        raise ValueError(f"--input {args.input}: expected a .npy or .npz file of numbers; "
                         f"{error}") from None
    if isinstance(loaded, np.ndarray):
        return [loaded]
    missing = [i.name for i in agent.spec.inputs if i.name not in loaded.files]
    if missing:
        raise ValueError(f"--input {args.input}: expected arrays {[i.name for i in agent.spec.inputs]}"
                         f" (np.savez), missing {missing}")
    return [loaded[i.name] for i in agent.spec.inputs]


def cmd_batch(args: argparse.Namespace) -> int:
    """`huggy batch`: actions for many observations at once, optionally written to a file.

    Args:
        args: the parsed command line.

    Returns:
        0.

    Raises:
        ValueError: an `--input` that is not a .npy or .npz of the policy's inputs, or an `--output`
            without the suffix numpy would write.
    """
    agent = _agent(args)
    inputs = _batch_inputs(args, agent)
    start = time.perf_counter()
    result = agent.compute_action(inputs[0] if len(inputs) == 1 else inputs,
                                  deterministic=not args.stochastic, seed=args.seed)
    seconds = time.perf_counter() - start
    arrays = {k: np.asarray(v) for k, v in _as_lists(result, agent).items()}
    first = next(iter(arrays.values()))
    rows = len(first) if first.ndim == 2 else 1  # an --input of one row answers one row
    if args.output is not None:
        suffix = ".npy" if len(arrays) == 1 else ".npz"
        if args.output.suffix != suffix:  # numpy would append the suffix to the name
            raise ValueError(f"--output {args.output}: expected a path ending in {suffix} "
                             f"(this policy's actions are {', '.join(arrays)})")
        if len(arrays) == 1:
            np.save(args.output, first)
        else:
            np.savez(args.output, **arrays)  # type: ignore[arg-type]  # numpy stubs: allow_pickle
    summary = {"rows": rows, "seconds": seconds, "obs_per_s": rows / seconds,
               **{f"{k}_mean": float(v.mean()) for k, v in arrays.items()},
               "output": str(args.output) if args.output else None}
    if args.json:
        _print_json(summary)
    else:
        means = ", ".join(f"{k} mean {float(v.mean()):+.4f}" for k, v in arrays.items())
        print(f"{rows:,} observation{'s' * (rows != 1)} in {seconds * 1e3:.1f} ms "
              f"({summary['obs_per_s']:,.0f} obs/s); {means}"
              + (f"; written to {args.output}" if args.output else ""))
    return 0


def _agreement_table(rows: list[Agreement]) -> str:
    return format_table(
        ["run", "max abs error", "mean abs error", "cosine", "tolerance", "ok"],
        [(r.label, r.max_abs_error, r.mean_abs_error, f"{r.cosine_similarity:.6f}", r.tolerance,
          {True: "yes", False: "NO", None: "-"}[r.passed]) for r in rows])


def cmd_precision(args: argparse.Namespace) -> int:
    """`huggy precision`: each precision on each device against float64.

    Args:
        args: the parsed command line.

    Returns:
        0 when every run is within its tolerance, else 1.
    """
    rows = precision_report(args.policy, args.devices, args.count)
    if args.json:
        _print_json([r.as_dict() for r in rows])
    else:
        print(f"each precision against a float64 reference on {args.count} observations "
              "(+64 scaled by 1e3):")
        print(_agreement_table(rows))
    return 0 if all(r.passed for r in rows) else 1


def cmd_onnx_compare(args: argparse.Namespace) -> int:
    """`huggy onnx-compare`: our network against onnxruntime on an ML-Agents ONNX file.

    Args:
        args: the parsed command line.

    Returns:
        0 when the actions agree within the tolerance, else 1.

    Raises:
        ValueError: the file is not an `.onnx`, the engine would run onnxruntime itself, or the
            policy's interface differs from the file's.
    """
    onnx_path = args.onnx
    if onnx_path.suffix != ".onnx":
        raise ValueError(f"{onnx_path}: expected an ML-Agents .onnx file (to compare a .pt "
                         "with it, pass the .pt as --policy)")
    if args.policy is None:
        args.policy = onnx_path
    agent = _agent(args)
    if agent.engine in ("onnxruntime", "native"):
        raise ValueError(f"--engine {args.engine} runs batches on onnxruntime here "
                         f"({agent.engine}): onnxruntime would be compared with itself; use "
                         "--engine torch")
    reference = agent.spec if args.policy == onnx_path else load_policy(onnx_path).spec
    if reference != agent.spec:
        raise ValueError(f"{onnx_path} is {reference.describe()}, the policy "
                         f"{agent.spec.describe()}: they cannot be compared")
    result = onnx_compare(agent, onnx_path, args.count)
    if args.json:
        _print_json(result.as_dict())
    else:
        print(_agreement_table([result]))
    return 0 if result.passed else 1


def cmd_fingerprint(args: argparse.Namespace) -> int:
    """`huggy fingerprint`: the weights hash and the actions of a canonical observation.

    Args:
        args: the parsed command line.

    Returns:
        0.
    """
    result = fingerprints(_agent(args))
    if args.json:
        _print_json(result)
    else:
        print(f"fingerprint  {result['fingerprint']}\nsource       {result['source']}\n"
              f"actions of canonical observation 0 (equal within the numerical contract's "
              f"tolerance wherever this model runs):")
        for kind, values in result["reference_actions"].items():
            print(f"{kind}: " + np.array2string(np.asarray(values), precision=6,
                                                max_line_width=96))
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    """`huggy stats`: parameter counts per layer, normalizer and log-sigma statistics.

    Args:
        args: the parsed command line.

    Returns:
        0.
    """
    stats = policy_stats(_agent(args))
    if args.json:
        _print_json(stats)
        return 0
    rows = [(layer["name"], "x".join(map(str, layer["shape"])), layer["count"])
            for layer in stats["layers"]]
    print(format_table(["parameter", "shape", "count"], rows))
    for section in ("parameters", "log_sigma"):
        if section in stats:
            print(f"\n{section}:")
            print(format_table(["statistic", "value"], list(stats[section].items())))
    for normalizer in stats["normalizers"]:
        print(f"\nnormalizer of {normalizer['input']}:")
        print(format_table(["statistic", "value"],
                           [(k, v) for k, v in normalizer.items() if k != "input"]))
    return 0


def cmd_benchmark(args: argparse.Namespace) -> int:
    """`huggy benchmark`: latency and throughput of each engine against onnxruntime and plain eager
    torch (see `huggy_agent.benchmark.run_benchmark`).

    Args:
        args: the parsed command line.

    Returns:
        0.
    """
    print("benchmarking (about 30 s)...", file=sys.stderr)
    report = run_benchmark(args.policy, args.threads, args.rounds, args.calls, args.batch,
                           engines=[args.engine])
    if args.json:
        _print_json(report)
        return 0
    print(f"threads {report['threads']}, float32 matmul {report['matmul_gflops']:.1f} GFLOP/s, "
          f"{report['flops_per_obs'] / 1e6:.2f} MFLOP per observation; auto runs "
          f"{report['auto_engine']} on the CPU (row 'huggy compute_action')")
    print(format_table(
        ["implementation", "p50 us", "p95 us", "p99 us", "p50 / onnxruntime", "cold p50 us",
         "cold / onnxruntime", f"batch {report['batch_size']} obs/s", "of matmul rate"],
        [(r["name"], r["p50_us"], r["p95_us"], r["p99_us"], f"{r['p50_vs_onnxruntime']:.2f}",
          r["cold_p50_us"], f"{r['cold_p50_vs_onnxruntime']:.2f}", r["batch_obs_per_s"],
          f"{100 * r['matmul_efficiency']:.0f}%")
         for r in report["results"]]))
    print(f"cold: one observation right after {EVICT_BYTES >> 20} MB of other memory was written "
          "(the caches evicted, as between a server's requests)")
    print("\n" + format_table(["engine", "load ms", "first call ms (1 obs)"],
                              [(e["engine"], e["load_ms"], e["first_call_ms"])
                               for e in report["engines"]]))
    ratios = report["ratios"]
    print(f"\nours/onnxruntime p50: {ratios['p50_vs_onnxruntime']:.2f}x   "
          f"cold: {ratios['cold_p50_vs_onnxruntime']:.2f}x   "
          f"ours/eager p50: {ratios['p50_vs_eager']:.2f}x   "
          f"batch throughput: {100 * ratios['batch_vs_matmul_rate']:.0f}% of the matmul rate")
    print(f"stochastic ours/onnxruntime p50: {ratios['stochastic_p50_vs_onnxruntime']:.2f}x   "
          f"batch {report['batch_size']} ours/onnxruntime: {ratios['batch_vs_onnxruntime']:.2f}x")
    return 0


def cmd_export_onnx(args: argparse.Namespace) -> int:
    """`huggy export-onnx`: the policy's source weights in ML-Agents' ONNX interface.

    Args:
        args: the parsed command line.

    Returns:
        0.
    """
    agent = HuggyAgent(args.policy, device="cpu", engine="torch")
    path = export_onnx(agent.loaded.build(), args.output)  # the source weights, in float32
    print(f"wrote {path} (ML-Agents interface, opset 9; weights fingerprint {agent.fingerprint})")
    return 0


def cmd_checkpoints(args: argparse.Namespace) -> int:
    """`huggy checkpoints`: a results folder's checkpoints with step and recorded reward.

    Args:
        args: the parsed command line.

    Returns:
        0.

    Raises:
        ValueError: the folder holds no checkpoint.
    """
    entries = list_checkpoints(args.folder)
    if not entries:
        raise ValueError(f"no checkpoints in {args.folder}: expected an ML-Agents "
                         "results/<run_id>/ folder, with run_logs/training_status.json or "
                         "<Behavior>/<Behavior>-<step>.onnx or .pt files")
    if args.json:
        _print_json([{"behavior": e.behavior, "step": e.step, "reward": e.reward,
                      "path": str(e.path) if e.path else None} for e in entries])
        return 0
    print(format_table(["behavior", "step", "reward", "file"],
                       [(e.behavior, e.step, e.reward,
                         str(e.path) if e.path else "(not in this copy)") for e in entries]))
    return 0


def add_parsers(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register the policy subcommands."""
    def command(name: str, handler: Callable[[argparse.Namespace], int], help_text: str,
                device: bool | None = True, json_flag: bool = True,
                engine_default: str = "auto") -> argparse.ArgumentParser:
        """`device`: with --device, --precision and --engine; False: --policy only; None:
        no policy options."""
        parser = subparsers.add_parser(name, help=help_text, description=help_text)
        if device is not None:
            _add_policy_options(parser, device, engine_default)
        if json_flag:
            _add_json(parser)
        parser.set_defaults(handler=handler)
        return parser

    command("info", cmd_info, "show a policy's architecture, parameter counts and fingerprint")

    act = command("act", cmd_act, "compute the actions for one observation")
    _add_observation_options(act)
    act.add_argument("--stochastic", action="store_true", help="sample instead of the mean action")
    act.add_argument("--seed", type=seed64, default=None, help="seed of the stochastic noise")
    act.add_argument("--memory", default=None,
                     help="a recurrent policy's memory as a JSON list (default: zeros)")

    sample = command("sample", cmd_sample,
                     "draw many stochastic actions for one observation and summarise them")
    _add_observation_options(sample)
    sample.add_argument("--samples", type=positive_int, default=1000,
                        help="how many samples (default 1000)")
    sample.add_argument("--seed", type=seed64, default=0, help="seed of the noise (default 0)")

    batch = command("batch", cmd_batch, "compute actions for many observations at once")
    batch.add_argument("--input", type=Path, default=None,
                       help=".npy file of shape (N, ...) for a single-input policy, or .npz with "
                            "arrays obs_0, obs_1, ... (default: random observations)")
    batch.add_argument("--output", type=Path, default=None,
                       help="write actions to this .npy (.npz with continuous/discrete/memory "
                            "when there is more than one array)")
    batch.add_argument("--count", type=positive_int, default=4096,
                       help="random observations (default 4096)")
    batch.add_argument("--obs-seed", type=seed64, default=0,
                       help="seed of the random observations")
    batch.add_argument("--stochastic", action="store_true", help="sample instead of the mean")
    batch.add_argument("--seed", type=seed64, default=None, help="seed of the stochastic noise")

    precision = command("precision", cmd_precision,
                        "max abs error and cosine similarity of fp32/fp16/bf16 against float64",
                        device=False)
    precision.add_argument("--devices", nargs="+", default=None,
                           help="devices to test (default: every available kind)")
    precision.add_argument("--count", type=positive_int, default=1024,
                           help="observations (default 1024)")

    compare = command("onnx-compare", cmd_onnx_compare,
                      "our network against onnxruntime on an ML-Agents ONNX file",
                      engine_default="torch")
    compare.add_argument("onnx", type=Path, help="the ML-Agents .onnx file (also the policy by "
                         "default; pass --policy to compare a .pt against it)")
    compare.add_argument("--count", type=positive_int, default=1000, help="observations (default 1000)")

    command("fingerprint", cmd_fingerprint,
            "the weights hash (same for a run's .pt and .onnx on any machine) and the "
            "actions of a canonical observation")
    command("stats", cmd_stats, "parameter counts per layer, normalizer and log-sigma statistics")

    bench = command("benchmark", cmd_benchmark,
                    "latency and throughput of each engine against onnxruntime and plain eager "
                    "torch", device=False)
    bench.add_argument("--engine", default="all", choices=["all", *ENGINE_NAMES],
                       help="the engine(s) to measure beside auto (default: all that run here)")
    bench.add_argument("--threads", type=positive_int, default=None,
                       help="torch and onnxruntime threads (default: torch's default)")
    bench.add_argument("--rounds", type=positive_int, default=10,
                       help="interleaved rounds (default 10)")
    bench.add_argument("--calls", type=positive_int, default=200,
                       help="calls per round (default 200)")
    bench.add_argument("--batch", type=positive_int, default=4096, help="batch size (default 4096)")

    export = command("export-onnx", cmd_export_onnx,
                     "export the policy in ML-Agents' ONNX interface (drops back into Unity)",
                     device=False, json_flag=False)
    export.add_argument("output", type=Path, help="the .onnx file to write")

    checkpoints = command("checkpoints", cmd_checkpoints,
                          "list a results folder's checkpoints with step and recorded reward",
                          device=None)
    checkpoints.add_argument("folder", type=Path, help="an ML-Agents results/<run_id>/ folder")
