"""Reports about a loaded policy: precision against float64, fingerprints, statistics, and a
comparison with onnxruntime on an ML-Agents ONNX file."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from huggy_agent.agent import HuggyAgent
from huggy_agent.devices import PRECISIONS, available_devices
from huggy_agent.heads import masked_probabilities
from huggy_agent.numerics import PRECISION_ACTION_ATOL
from huggy_agent.reference import canonical_inputs, float64_outputs
from huggy_agent_client.actions import Actions, split_memory

# The error each precision is expected to stay within, against float64 (max abs, actions in [-1, 1]).
PRECISION_TOLERANCE = PRECISION_ACTION_ATOL


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

    def as_dict(self) -> dict[str, Any]:
        """The agreement as JSON-serialisable data.

        Returns:
            Every field, and `passed`.
        """
        return {**asdict(self), "passed": self.passed}


def compare(label: str, actions: np.ndarray, reference: np.ndarray,
            tolerance: float | None = None) -> Agreement:
    """How closely a set of actions matches a reference, both flattened.

    Args:
        label: names the comparison in reports.
        actions: the actions compared.
        reference: the reference, of the same size.
        tolerance: the max abs error allowed; None for none.

    Returns:
        The max and mean abs error, the cosine similarity, whether every action is finite, and
            the tolerance.
    """
    a = np.asarray(actions, np.float64).ravel()
    r = np.asarray(reference, np.float64).ravel()
    error = np.abs(a - r)
    cosine = float(a @ r / (np.linalg.norm(a) * np.linalg.norm(r) + 1e-300))
    return Agreement(label, float(error.max()), float(error.mean()), cosine,
                     bool(np.isfinite(a).all()), tolerance)


def comparable_outputs(agent: HuggyAgent, inputs: list[np.ndarray]) -> np.ndarray:
    """What a precision report compares of a policy's pass over `inputs`.

    Args:
        agent: the policy.
        inputs: one array per observation input.

    Returns:
        One row per observation, flattened: the deterministic continuous actions, the
            probabilities of every discrete action (all allowed), and the new memory, side by side.
    """
    outputs = agent.distribution(inputs if len(inputs) > 1 else inputs[0])
    parts = []
    with torch.inference_mode():
        if outputs.mu is not None:
            assert outputs.log_sigma is not None
            parts.append(agent.head.torch((outputs.mu, outputs.log_sigma), None))
        if outputs.logits is not None:
            parts += masked_probabilities(outputs.logits, agent.spec.discrete_branches, None)
        if outputs.memory is not None:
            parts.append(outputs.memory)
        return np.concatenate([p.float().cpu().numpy().reshape(len(p), -1) for p in parts], axis=1)


def _float64_comparable(agent: HuggyAgent, inputs: list[np.ndarray]) -> np.ndarray:
    outputs = list(float64_outputs(agent.loaded, inputs))
    parts = []
    with torch.inference_mode():
        if agent.spec.continuous_size:
            mu = torch.from_numpy(outputs.pop(0))
            log_sigma = torch.from_numpy(outputs.pop(0))
            parts.append(agent.head.torch((mu, log_sigma), None))
        if agent.spec.discrete_branches:
            parts += masked_probabilities(torch.from_numpy(outputs.pop(0)),
                                          agent.spec.discrete_branches, None)
        if agent.spec.memory_size:
            parts.append(torch.from_numpy(outputs.pop(0)))
        return np.concatenate([p.double().numpy().reshape(len(p), -1) for p in parts], axis=1)


def precision_report(policy: str | Path | None, devices: list[str] | None = None,
                     count: int = 1024) -> list[Agreement]:
    """Each precision on each device against float64.

    Compared on `count` canonical inputs plus 64 rows scaled by 1e3, to show that large
    observations stay finite (the normalizers are float32 in every precision): continuous actions,
    discrete action probabilities and memories (see `comparable_outputs`).

    Args:
        policy: the policy (None: the bundled one).
        devices: device kinds; None: every kind available here.
        count: canonical rows.

    Returns:
        One agreement per (device, precision), with the precision's tolerance.
    """
    reference_agent = HuggyAgent(policy, device="cpu")
    inputs = canonical_inputs(reference_agent.loaded, count)
    inputs = [np.concatenate([a, a[:64] * (1e3 if arch.input.kind == "vector" else 1.0)])
              for a, arch in zip(inputs, reference_agent.arch.inputs, strict=True)]
    reference = _float64_comparable(reference_agent, inputs)
    rows = []
    for device in devices or available_devices():
        for precision in PRECISIONS:
            agent = HuggyAgent(policy, device=device, precision=precision)
            rows.append(compare(f"{device} {precision}", comparable_outputs(agent, inputs),
                                reference, PRECISION_TOLERANCE[precision]))
    return rows


def reference_actions(agent: HuggyAgent) -> dict[str, list[Any]]:
    """Deterministic actions for canonical row 0 (every action allowed; zero memory).

    Two deployments serve the same model computed correctly when these agree within the numerical
    contract's tolerance (`huggy_agent.numerics`); they are not hashed, since floats need not match
    bit for bit across machines or devices.

    Args:
        agent: the policy.

    Returns:
        A float `continuous` list and/or an integer `discrete` list.
    """
    inputs = [a[0] for a in canonical_inputs(agent.loaded, 1)]
    actions, _ = split_memory(agent.compute_action(inputs if len(inputs) > 1 else inputs[0]))
    if isinstance(actions, Actions):
        return {"continuous": actions.continuous.tolist(), "discrete": actions.discrete.tolist()}
    key = "discrete" if agent.spec.discrete_branches else "continuous"
    return {key: actions.tolist()}


def fingerprints(agent: HuggyAgent) -> dict[str, Any]:
    """What identifies a served policy.

    Args:
        agent: the policy.

    Returns:
        The weights hash (exact, see `weights_fingerprint`), the reference actions and the source.
    """
    return {"fingerprint": agent.fingerprint, "reference_actions": reference_actions(agent),
            "source": str(agent.loaded.origin)}


def policy_stats(agent: HuggyAgent) -> dict[str, Any]:
    """Statistics of a policy's weights.

    Args:
        agent: the policy.

    Returns:
        Parameter counts per layer and per part, each normalizer's mean and std ranges, the
            loader's extras, and log-sigma statistics where the policy has a state-independent one.
    """
    layers = [{"name": name, "shape": list(p.shape), "count": p.numel()}
              for name, p in agent.net.named_parameters()]
    stats: dict[str, Any] = {"layers": layers, "parameters": agent.net.parameter_counts(),
                   "normalizers": []}
    tensors = agent.loaded.tensors
    for index, arch in enumerate(agent.arch.inputs):
        if arch.normalize:
            prefix = f"network_body.observation_encoder.processors.{index}.normalizer."
            mean = tensors[prefix + "running_mean"].double()
            std = tensors[prefix + "std"].double()
            stats["normalizers"].append({
                "input": arch.input.name, "mean_min": float(mean.min()),
                "mean_max": float(mean.max()), "std_min": float(std.min()),
                "std_max": float(std.max())})
    stats.update({k: v for k, v in agent.loaded.extras.items()})
    key = "action_model._continuous_distribution.log_sigma"
    if key in tensors:
        log_sigma = tensors[key].double()
        stats["log_sigma"] = {"min": float(log_sigma.min()), "max": float(log_sigma.max()),
                              "mean": float(log_sigma.mean()),
                              "sigma_mean": float(log_sigma.exp().mean())}
    return stats


def onnx_reference(onnx_path: str | Path, agent: HuggyAgent, inputs: list[np.ndarray]
                   ) -> np.ndarray:
    """onnxruntime's deterministic actions on an ML-Agents ONNX file, every action allowed and zero
    memory.

    Args:
        onnx_path: the ML-Agents ONNX file.
        agent: the same policy loaded here (for its spec and head).
        inputs: one array per observation input.

    Returns:
        float64 (N, continuous + branches): the continuous actions (tanh of a SAC export's raw mean)
            and the discrete actions, side by side.
    """
    import onnxruntime as ort

    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}
    rows = len(inputs[0])
    feed = {f"obs_{i}": array for i, array in enumerate(inputs)}
    if "action_masks" in names:
        feed["action_masks"] = np.ones((rows, agent.spec.mask_size), np.float32)
    if "recurrent_in" in names:
        feed["recurrent_in"] = np.zeros((rows, 1, agent.spec.memory_size), np.float32)
    wanted = [n for n in ("deterministic_continuous_actions", "deterministic_discrete_actions")
              if n in {o.name for o in session.get_outputs()}]
    outputs = dict(zip(wanted, session.run(wanted, feed), strict=True))
    parts = []
    if "deterministic_continuous_actions" in outputs:
        continuous = outputs["deterministic_continuous_actions"]
        parts.append(np.tanh(continuous) if agent.arch.head == "sac" else continuous)
    if "deterministic_discrete_actions" in outputs:
        parts.append(outputs["deterministic_discrete_actions"].astype(np.float64))
    return np.concatenate(parts, axis=1)


def _ours_for_onnx(agent: HuggyAgent, inputs: list[np.ndarray]) -> np.ndarray:
    actions, _ = split_memory(agent.compute_action(inputs if len(inputs) > 1 else inputs[0]))
    if isinstance(actions, Actions):
        return np.concatenate([actions.continuous, actions.discrete.astype(np.float64)], axis=1)
    return np.asarray(actions, np.float64)


def onnx_compare(agent: HuggyAgent, onnx_path: str | Path, count: int = 1000) -> Agreement:
    """Our deterministic actions against onnxruntime's on the same ONNX file (see `onnx_reference`).

    Args:
        agent: the policy.
        onnx_path: its ML-Agents ONNX file.
        count: canonical rows.

    Returns:
        The agreement, with the tolerance of the agent's precision; discrete actions count as
            errors of 1 or more where they differ.
    """
    inputs = canonical_inputs(agent.loaded, count)
    return compare(f"{agent.device} {agent.precision} {agent.engine} vs onnxruntime",
                   _ours_for_onnx(agent, inputs),
                   onnx_reference(onnx_path, agent, inputs), PRECISION_TOLERANCE[agent.precision])
