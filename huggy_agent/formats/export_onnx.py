"""Export an `Actor` in ML-Agents' own ONNX interface, so the file drops back into Unity.

Inputs: `obs_0, obs_1, ...` (visual ones NCHW), then `action_masks` [batch, sum of branches]
(1 = allowed) when there are discrete branches, then `recurrent_in` [batch, 1, memory] with
memory. Outputs, in ML-Agents' order and only those the policy has: `version_number` (3),
`memory_size`; `continuous_actions` (sampled in-graph with RandomNormalLike),
`continuous_action_output_shape`, `deterministic_continuous_actions`; `discrete_actions`
(Multinomial), `discrete_action_output_shape`, `deterministic_discrete_actions`; `recurrent_out`.
Opset 9. The actor's modules carry ML-Agents' names, so the initializers do too
(`network_body._body_endoder.seq_layers.0.weight`, ...), and our loader and Unity's importer
both read the file like one ML-Agents wrote.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from torch import nn

from huggy_agent.actor import PPO_ACTION_CLIP, Actor, build_actor

OPSET = 9
MLAGENTS_EXPORT_VERSION = 3.0


def output_names(actor: Actor) -> list[str]:
    """The ONNX outputs ML-Agents exports for an actor's spec.

    Args:
        actor: the policy network.

    Returns:
        `version_number`, `memory_size`, then the continuous, the discrete and the recurrent outputs
            the actor has, in ML-Agents' order.
    """
    spec = actor.architecture.spec
    names = ["version_number", "memory_size"]
    if spec.continuous_size:
        names += ["continuous_actions", "continuous_action_output_shape",
                  "deterministic_continuous_actions"]
    if spec.discrete_branches:
        names += ["discrete_actions", "discrete_action_output_shape",
                  "deterministic_discrete_actions"]
    if spec.memory_size:
        names.append("recurrent_out")
    return names


def input_names(actor: Actor) -> list[str]:
    """The ONNX inputs ML-Agents exports for an actor's spec.

    Args:
        actor: the policy network.

    Returns:
        `obs_0, obs_1, ...`, then `action_masks` when there are discrete branches, then
            `recurrent_in` when there is memory.
    """
    spec = actor.architecture.spec
    return ([i.name for i in spec.inputs] + (["action_masks"] if spec.discrete_branches else [])
            + (["recurrent_in"] if spec.memory_size else []))


class MLAgentsExportModule(nn.Module):
    """An Actor's modules under ML-Agents' top-level names, computing ML-Agents' outputs.

    Args:
        actor: the float32 policy network whose modules it holds.
    """

    version_number: torch.Tensor
    memory_size_vector: torch.Tensor
    continuous_act_size_vector: torch.Tensor
    discrete_act_size_vector: torch.Tensor

    def __init__(self, actor: Actor) -> None:
        super().__init__()
        spec = actor.architecture.spec
        self.spec = spec
        self.head = actor.architecture.head
        self.network_body = actor.network_body
        self.action_model = actor.action_model
        self.register_buffer("version_number", torch.tensor([MLAGENTS_EXPORT_VERSION]))
        self.register_buffer("memory_size_vector", torch.tensor([float(spec.memory_size)]))
        self.register_buffer("continuous_act_size_vector",
                             torch.tensor([float(spec.continuous_size)]))
        self.register_buffer("discrete_act_size_vector",
                             torch.tensor([[float(b) for b in spec.discrete_branches]]))

    def forward(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """ML-Agents' outputs for its inputs, as the exported graph computes them.

        Args:
            *tensors: the inputs in `input_names` order: the observations, then the action masks
                (batch, sum of branches) when there are discrete branches, then the memory
                (batch, 1, memory) when there is memory.

        Returns:
            The outputs in `output_names` order; sampled actions draw their noise in the graph.
        """
        spec = self.spec
        count = len(spec.inputs)
        inputs, rest = list(tensors[:count]), list(tensors[count:])
        masks = rest.pop(0) if spec.discrete_branches else None
        memories = rest.pop(0)[:, 0, :] if spec.memory_size else None
        encoding, memories_out = self.network_body(inputs, memories, torch.float32)
        outputs = [self.version_number, self.memory_size_vector]
        continuous = self.action_model._continuous_distribution
        discrete = self.action_model._discrete_distribution
        if continuous is not None:
            mu, log_sigma = continuous(encoding)
            log_sigma = mu * 0 + log_sigma  # ML-Agents' export broadcasts it this way
            sampled = mu + torch.randn_like(mu) * torch.exp(log_sigma)
            if self.head == "sac":
                # ML-Agents' TanhGaussian deterministic_sample() is the raw mean: kept for Unity.
                sampled, deterministic = torch.tanh(sampled), mu
            else:
                sampled = torch.clamp(sampled, -PPO_ACTION_CLIP, PPO_ACTION_CLIP) / PPO_ACTION_CLIP
                deterministic = torch.clamp(mu, -PPO_ACTION_CLIP, PPO_ACTION_CLIP) / PPO_ACTION_CLIP
            outputs += [sampled, self.continuous_act_size_vector, deterministic]
        if discrete is not None:
            assert masks is not None
            logits = discrete(encoding)
            sampled, deterministic = [], []
            start = 0
            for size in spec.discrete_branches:
                allowed = masks[:, start:start + size]
                branch = logits[:, start:start + size] * allowed - 1e8 * (-1.0 * allowed + 1.0)
                probs = torch.softmax(branch, dim=-1)
                sampled.append(torch.multinomial(probs, 1))
                deterministic.append(torch.argmax(probs, dim=1, keepdim=True))
                start += size
            outputs += [torch.cat(sampled, dim=1), self.discrete_act_size_vector,
                        torch.cat(deterministic, dim=1)]
        if spec.memory_size:
            assert memories_out is not None
            outputs.append(memories_out.unsqueeze(1))
        return tuple(outputs)


def example_inputs(actor: Actor, rows: int = 1) -> tuple[torch.Tensor, ...]:
    """Zero inputs of the ML-Agents interface, to trace an export with.

    Args:
        actor: the policy network.
        rows: the batch size of each input.

    Returns:
        The inputs in `input_names` order: zeros, the action masks all ones.
    """
    spec = actor.architecture.spec
    tensors = [torch.zeros(rows, *i.shape) for i in spec.inputs]
    if spec.discrete_branches:
        tensors.append(torch.ones(rows, spec.mask_size))
    if spec.memory_size:
        tensors.append(torch.zeros(rows, 1, spec.memory_size))
    return tuple(tensors)


def export_onnx(actor: Actor, path: str | Path) -> Path:
    """Write an actor in ML-Agents' ONNX interface, as float32.

    A half-precision actor's weights are exported rounded; export `LoadedPolicy.build()` to keep the
    source weights.

    Args:
        actor: the policy network.
        path: the `.onnx` file to write.

    Returns:
        `path`.
    """
    path = Path(path)
    copy = build_actor(actor.architecture, {k: v.detach().float().cpu() for k, v in
                                            actor.state_dict().items()}, "export")
    module = MLAgentsExportModule(copy).eval()
    inputs, outputs = input_names(copy), output_names(copy)
    batch = {0: "batch"}
    dynamic = {name: batch for name in inputs + outputs
               if name not in ("version_number", "memory_size", "continuous_action_output_shape",
                               "discrete_action_output_shape")}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module, example_inputs(copy), str(path), input_names=inputs, output_names=outputs,
            dynamic_axes=dynamic, opset_version=OPSET, do_constant_folding=True, dynamo=False,
        )
    return path
