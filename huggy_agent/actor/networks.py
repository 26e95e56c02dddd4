"""The actor of every ML-Agents policy kind, built from an `ActorArchitecture`, for inference.

    obs_0 .. obs_k -> observation_encoder (per-input processors, attention over variable-length
    inputs) -> _body_endoder (Linear + Swish layers) -> [LSTM] -> action_model heads

Mirrors ML-Agents' `SimpleActor` (mlagents/trainers/torch_entities/networks.py), which PPO, SAC
and POCA all use for acting, module for module, so state-dict keys are ML-Agents' own
(`network_body._body_endoder.seq_layers.0.weight`, ...). `Actor.forward(*inputs)` takes the
observation tensors in `obs_i` order, then the memory (N, memory_size) when the policy has one,
and returns, in this order and only those the policy has: mu (N, c) and log_sigma ((1, c) for
PPO, state-dependent (N, c) for SAC), the concatenated discrete logits (N, sum(branches)), the
new memory (N, memory_size). Masks, sampling and squashing are the agent's (`huggy_agent.heads`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

import torch
from torch import nn

from huggy_agent.actor.attention import (
    EMBEDDING_SIZE,
    EntityEmbedding,
    ResidualSelfAttention,
    zero_entities_mask,
)
from huggy_agent.actor.encoders import Normalizer, VectorInput, visual_encoder
from huggy_agent.actor.layers import LSTM, LinearEncoder
from huggy_agent_client.spec import ActorSpec, ObservationInput

Head = Literal["ppo", "sac"]
PPO_ACTION_CLIP = 3.0
SAC_LOG_SIGMA_RANGE = (-20.0, 2.0)


@dataclass(frozen=True)
class InputArchitecture:
    """How one observation input is encoded: normalized (vector inputs) and the visual encoder
    (visual inputs; one of `encoders.VISUAL_ENCODERS`)."""

    input: ObservationInput
    normalize: bool = False
    encoder: str | None = None


@dataclass(frozen=True)
class ActorArchitecture:
    """Everything that fixes the actor's modules and shapes; the weights fill them."""

    inputs: tuple[InputArchitecture, ...]
    hidden_units: int
    num_layers: int
    continuous_size: int = 0
    discrete_branches: tuple[int, ...] = ()
    memory_size: int = 0
    head: Head = "ppo"

    @property
    def spec(self) -> ActorSpec:
        """The interface these weights implement."""
        return ActorSpec(tuple(i.input for i in self.inputs), self.continuous_size,
                         self.discrete_branches, self.memory_size)

    @property
    def has_attention(self) -> bool:
        return any(i.input.kind == "variable" for i in self.inputs)

    def as_dict(self) -> dict[str, Any]:
        """The architecture as JSON-ready data, stable (the weights fingerprint hashes it).

        Returns:
            Every field; each input as `{"input": ..., "normalize": ..., "encoder": ...}`.
        """
        data = asdict(self)
        data["inputs"] = [{"input": i.input.as_dict(), "normalize": i.normalize,
                           "encoder": i.encoder} for i in self.inputs]
        data["discrete_branches"] = list(self.discrete_branches)
        return data

    def describe(self) -> str:
        """The architecture in one line.

        Returns:
            Such as `obs_0 (59,) norm -> 3x512 SiLU -> 21 continuous (ppo)`.
        """
        parts = []
        for arch in self.inputs:
            item = f"{arch.input.name} {arch.input.shape}"
            if arch.normalize:
                item += " norm"
            if arch.encoder:
                item += f" {arch.encoder}"
            if arch.input.kind == "variable":
                item += " attention"
            parts.append(item)
        lstm = f" -> LSTM {self.memory_size}" if self.memory_size else ""
        return (f"{', '.join(parts)} -> {self.num_layers}x{self.hidden_units} SiLU{lstm} -> "
                f"{self.spec.describe_actions(self.head)}")


class ObservationEncoder(nn.Module):
    """Per-input processors (`processors.<i>`), and for variable-length inputs an
    `x_self_encoder` and a residual self-attention (`rsa`), as ML-Agents builds them.

    Args:
        architecture: the actor's architecture.
    """

    def __init__(self, architecture: ActorArchitecture) -> None:
        super().__init__()
        processors: list[nn.Module] = []
        embedding_sizes = []
        for arch in architecture.inputs:
            shape = arch.input.shape
            if arch.input.kind == "vector":
                processors.append(VectorInput(shape[0], arch.normalize))
                embedding_sizes.append(shape[0])
            elif arch.input.kind == "visual":
                processors.append(visual_encoder(arch.encoder or "simple", shape,  # type: ignore[arg-type]
                                                 architecture.hidden_units))
                embedding_sizes.append(architecture.hidden_units)
            else:
                processors.append(nn.Identity())  # the entity embedding, made below
                embedding_sizes.append(0)
        self_size = sum(embedding_sizes)
        self.variable = [i for i, arch in enumerate(architecture.inputs)
                         if arch.input.kind == "variable"]
        for index in self.variable:
            max_entities, entity_size = architecture.inputs[index].input.shape
            processors[index] = EntityEmbedding(entity_size, max_entities,
                                                EMBEDDING_SIZE if self_size else 0)
        self.processors = nn.ModuleList(processors)
        self.x_self_encoder = (LinearEncoder(self_size, 1, EMBEDDING_SIZE)
                               if self.variable and self_size else None)
        self.rsa = ResidualSelfAttention() if self.variable else None
        self.total_enc_size = self_size + (EMBEDDING_SIZE if self.variable else 0)

    def forward(self, inputs: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        """Encode every observation input.

        Vector inputs pass their float32 normalizer first; the other encoders run in `dtype`.

        Args:
            inputs: one (N, ...) tensor per input, in `obs_i` order.
            dtype: the layers' dtype.

        Returns:
            (N, total_enc_size): the inputs' encodings side by side, then the attention's pooled
                embedding when there are variable-length inputs.
        """
        # Vector inputs pass their float32 normalizer first; the other encoders run in `dtype`.
        encodes = [processor(inputs[i]).to(dtype) if isinstance(processor, VectorInput)
                   else processor(inputs[i].to(dtype))
                   for i, processor in enumerate(self.processors) if i not in self.variable]
        encoded_self = torch.cat(encodes, dim=1) if encodes else None
        if self.rsa is None:
            assert encoded_self is not None
            return encoded_self
        masks = torch.cat([zero_entities_mask(inputs[i]) for i in self.variable], dim=1).to(dtype)
        processed_self = (self.x_self_encoder(encoded_self)
                          if self.x_self_encoder is not None and encoded_self is not None else None)
        embeddings = torch.cat([self.processors[i](processed_self, inputs[i].to(dtype))
                                for i in self.variable], dim=1)
        attention = self.rsa(embeddings, masks)
        return attention if encoded_self is None else torch.cat([encoded_self, attention], dim=1)


class NetworkBody(nn.Module):
    """Observation encoder, `_body_endoder` (ML-Agents' spelling), and the LSTM if any.

    Args:
        architecture: the actor's architecture.
    """

    def __init__(self, architecture: ActorArchitecture) -> None:
        super().__init__()
        self.observation_encoder = ObservationEncoder(architecture)
        self._body_endoder = LinearEncoder(self.observation_encoder.total_enc_size,
                                           architecture.num_layers, architecture.hidden_units)
        self.lstm = (LSTM(architecture.hidden_units, architecture.memory_size)
                     if architecture.memory_size else None)

    def forward(self, inputs: list[torch.Tensor], memories: torch.Tensor | None, dtype: torch.dtype
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Encode the observations and run the body (and the LSTM step).

        Args:
            inputs: one (N, ...) tensor per input, in `obs_i` order.
            memories: (N, memory_size) for a recurrent actor, else None.
            dtype: the layers' dtype.

        Returns:
            The encoding (N, hidden_units), or the LSTM's output (N, memory_size / 2); and the new
                memory (N, memory_size), None without an LSTM.
        """
        encoding = self._body_endoder(self.observation_encoder(inputs, dtype))
        if self.lstm is None:
            return encoding, None
        assert memories is not None
        output, memories_out = self.lstm(encoding, memories.to(dtype))
        return output, memories_out


class GaussianDistribution(nn.Module):
    """`mu` and `log_sigma`: a (1, c) parameter (PPO, POCA) or a Linear layer clamped to
    [-20, 2] (SAC's conditional sigma).

    Args:
        hidden_size: width of the encoding.
        num_outputs: continuous actions.
        conditional_sigma: whether `log_sigma` is a Linear layer (SAC).
    """

    def __init__(self, hidden_size: int, num_outputs: int, conditional_sigma: bool) -> None:
        super().__init__()
        self.mu = nn.Linear(hidden_size, num_outputs)
        self.log_sigma: nn.Module | nn.Parameter = (
            nn.Linear(hidden_size, num_outputs) if conditional_sigma
            else nn.Parameter(torch.zeros(1, num_outputs)))

    def forward(self, inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The Gaussian's parameters.

        Args:
            inputs: (N, hidden_size) encoding.

        Returns:
            mu (N, c) and log_sigma: the (1, c) parameter, or (N, c) clamped to `SAC_LOG_SIGMA_RANGE`.
        """
        mu: torch.Tensor = self.mu(inputs)
        if isinstance(self.log_sigma, nn.Parameter):
            return mu, self.log_sigma
        return mu, torch.clamp(self.log_sigma(inputs), *SAC_LOG_SIGMA_RANGE)


class MultiCategoricalDistribution(nn.Module):
    """One Linear layer per discrete branch (`branches.<j>`); logits concatenated.

    Args:
        hidden_size: width of the encoding.
        branches: the size of each branch.
    """

    def __init__(self, hidden_size: int, branches: tuple[int, ...]) -> None:
        super().__init__()
        self.branches = nn.ModuleList(nn.Linear(hidden_size, size) for size in branches)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """The logits of every branch.

        Args:
            inputs: (N, hidden_size) encoding.

        Returns:
            (N, sum of branches).
        """
        return torch.cat([branch(inputs) for branch in self.branches], dim=1)


class ActionModel(nn.Module):
    """`_continuous_distribution` and/or `_discrete_distribution`, as the action spec has them.

    Args:
        architecture: the actor's architecture.
        encoding_size: width of the body's output.
    """

    def __init__(self, architecture: ActorArchitecture, encoding_size: int) -> None:
        super().__init__()
        self._continuous_distribution = (
            GaussianDistribution(encoding_size, architecture.continuous_size,
                                 conditional_sigma=architecture.head == "sac")
            if architecture.continuous_size else None)
        self._discrete_distribution = (
            MultiCategoricalDistribution(encoding_size, architecture.discrete_branches)
            if architecture.discrete_branches else None)


class Actor(nn.Module):
    """The policy network, ML-Agents' `SimpleActor` module for module.

    The normalizers stay float32 in every precision; everything after them runs in the dtype the
    module was moved to (`.to(torch.bfloat16)`, ...).

    Args:
        architecture: what fixes the modules and shapes; `build_actor` fills in the weights.
    """

    def __init__(self, architecture: ActorArchitecture) -> None:
        super().__init__()
        self.architecture = architecture
        self.network_body = NetworkBody(architecture)
        encoding_size = architecture.memory_size // 2 or architecture.hidden_units
        self.action_model = ActionModel(architecture, encoding_size)
        self._inputs = len(architecture.inputs)

    @property
    def layer_dtype(self) -> torch.dtype:
        """The dtype of the layers (the precision the actor runs in)."""
        first = self.network_body._body_endoder.seq_layers[0]
        assert isinstance(first, nn.Linear)
        return first.weight.dtype

    def forward(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The actor's outputs for a batch.

        Args:
            *tensors: the observation tensors in `obs_i` order, then the memory (N, memory_size) when
                the policy has one.

        Returns:
            In this order and only those the policy has: mu (N, c) and log_sigma ((1, c) for PPO,
                state-dependent (N, c) for SAC), the concatenated discrete logits (N, sum(branches)),
                the new memory (N, memory_size). Masks, sampling and squashing are the agent's
                (`huggy_agent.heads`).
        """
        inputs = list(tensors[: self._inputs])
        memories = tensors[self._inputs] if len(tensors) > self._inputs else None
        encoding, memories_out = self.network_body(inputs, memories, self.layer_dtype)
        outputs: list[torch.Tensor] = []
        model = self.action_model
        if model._continuous_distribution is not None:
            outputs += model._continuous_distribution(encoding)
        if model._discrete_distribution is not None:
            outputs.append(model._discrete_distribution(encoding))
        if memories_out is not None:
            outputs.append(memories_out)
        return tuple(outputs)

    def parameter_counts(self) -> dict[str, int]:
        """The number of values in each part of the network.

        Returns:
            Counts for `encoders`, `body` (the Linear layers), `lstm`, `heads`, `log_sigma` and
                `normalizer` (the normalizers' mean and std values).
        """
        counts = {"encoders": 0, "body": 0, "lstm": 0, "heads": 0, "log_sigma": 0,
                  "normalizer": 0}
        for name, tensor in [*self.named_parameters(), *self.named_buffers()]:
            if ".normalizer." in name:
                counts["normalizer"] += tensor.numel()
            elif name.startswith("network_body.observation_encoder."):
                counts["encoders"] += tensor.numel()
            elif name.startswith("network_body._body_endoder."):
                counts["body"] += tensor.numel()
            elif name.startswith("network_body.lstm."):
                counts["lstm"] += tensor.numel()
            elif "log_sigma" in name:
                counts["log_sigma"] += tensor.numel()
            else:
                counts["heads"] += tensor.numel()
        return counts


@dataclass(frozen=True)
class MlpPolicy:
    """The modules of an MLP policy, the kind Huggy is: one vector input (normalized or not),
    Linear + Swish layers, Gaussian continuous actions, nothing else (no discrete actions, no
    memory). `log_sigma` is PPO's shared (1, c) parameter or SAC's Linear layer (clamped to
    `SAC_LOG_SIGMA_RANGE`)."""

    normalizer: Normalizer | None
    hidden: tuple[nn.Linear, ...]
    mu: nn.Linear
    log_sigma: nn.Parameter | nn.Linear
    head: Head


def mlp_policy(net: nn.Module) -> MlpPolicy:
    """The parts of a network that is an MLP policy (see `MlpPolicy`).

    Args:
        net: a module, expected to be an `Actor`.

    Returns:
        The normalizer, hidden layers, mu layer, log_sigma and head kind.

    Raises:
        ValueError: `net` is not an `Actor`, or not an MLP policy (its interface is named).
    """
    if not isinstance(net, Actor):
        raise ValueError(f"expected an ML-Agents actor, got {type(net).__name__}")
    architecture = net.architecture
    inputs = architecture.inputs
    if (len(inputs) != 1 or inputs[0].input.kind != "vector" or architecture.discrete_branches
            or architecture.memory_size or not architecture.continuous_size):
        raise ValueError("an MLP policy has one vector input and continuous actions only, not "
                         f"{architecture.spec.describe()}")
    vector_input = net.network_body.observation_encoder.processors[0]
    distribution = net.action_model._continuous_distribution
    assert isinstance(vector_input, VectorInput) and distribution is not None
    log_sigma = distribution.log_sigma
    assert isinstance(log_sigma, (nn.Parameter, nn.Linear))
    hidden = tuple(layer for layer in net.network_body._body_endoder.seq_layers
                   if isinstance(layer, nn.Linear))
    return MlpPolicy(vector_input.normalizer, hidden, distribution.mu, log_sigma,
                     architecture.head)


def expected_keys(architecture: ActorArchitecture) -> dict[str, tuple[int, ...]]:
    """The state-dict keys an `Actor` of an architecture holds.

    Args:
        architecture: the actor's architecture.

    Returns:
        Each key with its shape, in the state dict's order.
    """
    return {key: tuple(value.shape) for key, value in Actor(architecture).state_dict().items()}


def build_actor(architecture: ActorArchitecture, tensors: dict[str, torch.Tensor],
                origin: str) -> Actor:
    """A float32 `Actor` holding `tensors`, every key and shape checked first.

    Args:
        architecture: the actor's architecture.
        tensors: the weights under the Actor's own state-dict keys.
        origin: names the weights' source in errors.

    Returns:
        The actor, in eval mode, without gradients.

    Raises:
        ValueError: a key is missing or unexpected, or a shape differs; naming `origin`, the key and
            both shapes.
    """
    actor = Actor(architecture)
    expected = {key: tuple(value.shape) for key, value in actor.state_dict().items()}
    missing = [key for key in expected if key not in tensors]
    unexpected = [key for key in tensors if key not in expected]
    if missing or unexpected:
        raise ValueError(f"{origin}: weights do not match {architecture.describe()}: "
                         f"missing {missing}, unexpected {unexpected}")
    for key, shape in expected.items():
        if tuple(tensors[key].shape) != shape:
            raise ValueError(f"{origin}: shape mismatch for {key}: expected {shape}, "
                             f"got {tuple(tensors[key].shape)}")
    actor.load_state_dict({key: tensors[key].detach().float() for key in expected}, strict=True)
    return actor.eval().requires_grad_(False)


__all__ = ["Actor", "ActorArchitecture", "InputArchitecture", "MlpPolicy", "Normalizer",
           "build_actor", "expected_keys", "mlp_policy"]
