"""Reports about a loaded policy: precision against float64, fingerprints, statistics, and a
comparison with onnxruntime on an ML-Agents ONNX file."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from huggy_agent.agent import HuggyAgent
from huggy_agent.devices import PRECISIONS, available_devices
from huggy_agent.reference import canonical_observations, float64_actions

# The error each precision is expected to stay within, against float64 (max abs, actions in [-1, 1]).
PRECISION_TOLERANCE = {"fp32": 1e-5, "fp16": 5e-3, "bf16": 5e-2}


@dataclass(frozen=True)
class Agreement:
    """How closely one set of actions matches a reference."""

    label: str
    max_abs_error: float
    mean_abs_error: float
    cosine_similarity: float
    finite: bool
    tolerance: float | None = None

    @property
    def passed(self) -> bool | None:
        """Within tolerance and finite (None when no tolerance applies)."""
        if self.tolerance is None:
            return None
        return self.finite and self.max_abs_error <= self.tolerance

    def as_dict(self) -> dict:
        """JSON-serialisable, with `passed`."""
        return {**asdict(self), "passed": self.passed}


def compare(label: str, actions: np.ndarray, reference: np.ndarray,
            tolerance: float | None = None) -> Agreement:
    """Max/mean abs error and cosine similarity of `actions` against `reference` (flattened)."""
    a = np.asarray(actions, np.float64).ravel()
    r = np.asarray(reference, np.float64).ravel()
    error = np.abs(a - r)
    cosine = float(a @ r / (np.linalg.norm(a) * np.linalg.norm(r) + 1e-300))
    return Agreement(label, float(error.max()), float(error.mean()), cosine,
                     bool(np.isfinite(a).all()), tolerance)


def precision_report(policy: str | Path | None, devices: list[str] | None = None,
                     count: int = 1024) -> list[Agreement]:
    """Each precision on each device (default: every available kind) against float64, on
    `count` observations from the normalizer's own statistics, plus 64 rows scaled by 1e3 to show
    that large observations stay finite (the normalizer is float32 in every precision)."""
    reference_agent = HuggyAgent(policy, device="cpu")
    obs = canonical_observations(reference_agent.loaded, count)
    obs = np.concatenate([obs, obs[:64] * 1e3])
    reference = float64_actions(reference_agent.loaded, obs)
    rows = []
    for device in devices or available_devices():
        for precision in PRECISIONS:
            agent = HuggyAgent(policy, device=device, precision=precision)
            rows.append(compare(f"{device} {precision}", agent.compute_action(obs), reference,
                                PRECISION_TOLERANCE[precision]))
    return rows


def reference_actions(agent: HuggyAgent) -> list[float]:
    """Deterministic actions for canonical observation 0 (drawn from the normalizer's own
    statistics with a fixed seed). Two deployments serve the same model computed correctly when
    these agree within the numerical contract's tolerance (`huggy_agent.numerics`); they are
    not hashed, since floats need not match bit for bit across machines or devices."""
    return agent.compute_action(canonical_observations(agent.loaded, 1)[0]).tolist()


def fingerprints(agent: HuggyAgent) -> dict:
    """The weights hash (exact, see `weights_fingerprint`) and the reference actions."""
    return {"weights": agent.fingerprint, "reference_actions": reference_actions(agent),
            "source": str(agent.loaded.origin)}


def policy_stats(agent: HuggyAgent) -> dict:
    """Parameter counts per layer, normalizer and log-sigma statistics."""
    layers = [{"name": name, "shape": list(p.shape), "count": p.numel()}
              for name, p in agent.net.named_parameters()]
    stats: dict = {"layers": layers, "parameters": agent.describe()["parameters"]}
    tensors = agent.loaded.tensors
    if agent.arch.normalize:
        mean, std = tensors["normalizer.mean"].double(), tensors["normalizer.std"].double()
        stats["normalizer"] = {"mean_min": float(mean.min()), "mean_max": float(mean.max()),
                               "std_min": float(std.min()), "std_max": float(std.max()),
                               **{k: v for k, v in agent.loaded.extras.items()}}
    if agent.arch.head == "ppo":
        log_sigma = tensors["log_sigma"].double()
        stats["log_sigma"] = {"min": float(log_sigma.min()), "max": float(log_sigma.max()),
                              "mean": float(log_sigma.mean()),
                              "sigma_mean": float(log_sigma.exp().mean())}
    return stats


def onnx_compare(agent: HuggyAgent, onnx_path: str | Path, count: int = 1000) -> Agreement:
    """Our deterministic actions against onnxruntime's `deterministic_continuous_actions` on the
    same ONNX file (tanh applied to it for SAC exports, whose output is the raw mean)."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    obs = canonical_observations(agent.loaded, count)
    (reference,) = session.run(["deterministic_continuous_actions"], {"obs_0": obs})
    if agent.arch.head == "sac":
        reference = np.tanh(reference)
    return compare(f"{agent.device} {agent.precision} vs onnxruntime", agent.compute_action(obs),
                   reference, PRECISION_TOLERANCE[agent.precision])
