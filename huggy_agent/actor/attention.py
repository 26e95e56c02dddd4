"""Attention over variable-length observations (mlagents/trainers/torch_entities/attention.py).

An `EntityEmbedding` encodes each entity of a (N, entities, entity_size) observation, joined
with the 128-wide `x_self` encoding of the other observations; `ResidualSelfAttention` attends
over all entities and average-pools those that are not padding (an entity whose squared sum is
below 0.01 is padding, as in ML-Agents).
"""

from __future__ import annotations

import torch
from torch import nn

from huggy_agent.actor.layers import LayerNorm, LinearEncoder

EMBEDDING_SIZE = 128
NUM_HEADS = 4
NEG_INF = -1e6
EPSILON = 1e-7


def zero_entities_mask(entities: torch.Tensor) -> torch.Tensor:
    """Which entities of a variable-length observation are padding.

    Args:
        entities: (N, entities, entity_size).

    Returns:
        (N, entities) in `entities`' dtype: 1 where an entity is padding (squared sum < 0.01),
            else 0.
    """
    return (torch.sum(entities.float() ** 2, dim=2) < 0.01).to(entities.dtype)


class EntityEmbedding(nn.Module):
    """One Linear + Swish over each entity, concatenated with `x_self` when `self_size` > 0.

    Args:
        entity_size: values per entity.
        max_entities: entities per observation.
        self_size: width of the other observations' encoding joined to each entity (0: none).
        embedding_size: width of each entity's embedding.
    """

    def __init__(self, entity_size: int, max_entities: int, self_size: int,
                 embedding_size: int = EMBEDDING_SIZE) -> None:
        super().__init__()
        self.self_size = self_size
        self.max_entities = max_entities
        self.self_ent_encoder = LinearEncoder(self_size + entity_size, 1, embedding_size)

    def forward(self, x_self: torch.Tensor | None, entities: torch.Tensor) -> torch.Tensor:
        """Embed every entity.

        Args:
            x_self: (N, self_size) encoding of the other observations; None when `self_size` is 0.
            entities: (N, max_entities, entity_size).

        Returns:
            (N, max_entities, embedding_size).
        """
        # (N, self) and (N, E, entity) -> (N, E, embedding)
        if self.self_size > 0:
            assert x_self is not None
            expanded = x_self.reshape(-1, 1, self.self_size).expand(-1, self.max_entities, -1)
            entities = torch.cat([expanded, entities], dim=2)
        encoded: torch.Tensor = self.self_ent_encoder(entities)
        return encoded


class ResidualSelfAttention(nn.Module):
    """Multi-head self-attention with a residual connection and masked average pooling.

    Args:
        embedding_size: width of each entity's embedding.
        num_heads: attention heads (`embedding_size` is split evenly among them).
    """

    def __init__(self, embedding_size: int = EMBEDDING_SIZE, num_heads: int = NUM_HEADS) -> None:
        super().__init__()
        self.n_heads = num_heads
        self.head_size = embedding_size // num_heads
        self.embedding_size = self.head_size * num_heads
        self.fc_q = nn.Linear(embedding_size, embedding_size)
        self.fc_k = nn.Linear(embedding_size, embedding_size)
        self.fc_v = nn.Linear(embedding_size, embedding_size)
        self.fc_out = nn.Linear(embedding_size, embedding_size)
        self.embedding_norm = LayerNorm()
        self.residual_norm = LayerNorm()

    def forward(self, inp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Attend over the entities and average-pool those that are not padding.

        Args:
            inp: (N, E, embedding_size) entity embeddings.
            mask: (N, E), 1 where an entity is padding (`zero_entities_mask`).

        Returns:
            (N, embedding_size).
        """
        n_ent = inp.shape[1]
        inp = self.embedding_norm(inp)
        query = self.fc_q(inp).reshape(-1, n_ent, self.n_heads, self.head_size).permute(0, 2, 1, 3)
        key = self.fc_k(inp).reshape(-1, n_ent, self.n_heads, self.head_size).permute(0, 2, 3, 1)
        value = self.fc_v(inp).reshape(-1, n_ent, self.n_heads, self.head_size).permute(0, 2, 1, 3)
        qk = torch.matmul(query, key)  # (N, heads, E, E)
        key_mask = mask.reshape(-1, 1, 1, n_ent)
        qk = (1 - key_mask) * qk / (self.embedding_size ** 0.5) + key_mask * NEG_INF
        attention = torch.matmul(torch.softmax(qk, dim=3), value)  # (N, heads, E, head)
        attention = attention.permute(0, 2, 1, 3).reshape(-1, n_ent, self.embedding_size)
        output = self.residual_norm(self.fc_out(attention) + inp)
        numerator = torch.sum(output * (1 - mask).reshape(-1, n_ent, 1), dim=1)
        denominator = torch.sum(1 - mask, dim=1, keepdim=True) + EPSILON
        return numerator / denominator
