"""Action heads: from the actor's outputs to actions, with masks and host noise.

Continuous (ML-Agents' export): PPO `clip(mu + z sigma, -3, 3) / 3`, SAC `tanh(mu + z sigma)`;
deterministic without z. Discrete, per branch: logits masked as ML-Agents masks them
(`logits * mask - 1e8 * (1 - mask)`), softmax; deterministic is the arg-max (the first on ties,
as torch's), stochastic inverts the branch's CDF (float64, on the host) at a uniform u, the
first action whose cumulative probability exceeds u: forbidden actions have probability 0 and
are never drawn. Noise z and u come from `huggy_agent.noise`, by (seed, row, column).
"""

from __future__ import annotations

import numpy as np
import torch

from huggy_agent.actor import PPO_ACTION_CLIP


def continuous_actions(mu: torch.Tensor, log_sigma: torch.Tensor, head: str,
                       noise: np.ndarray | None) -> torch.Tensor:
    """(N, c) float32 actions on mu's device; `noise` (N, c) standard normal, None for the mean."""
    action = mu
    if noise is not None:
        action = action + torch.from_numpy(noise).to(mu.device) * torch.exp(log_sigma)
    if head == "sac":
        return torch.tanh(action)
    return torch.clamp(action, -PPO_ACTION_CLIP, PPO_ACTION_CLIP).div_(PPO_ACTION_CLIP)


def masked_probabilities(logits: torch.Tensor, branches: tuple[int, ...],
                         mask: torch.Tensor | None) -> list[torch.Tensor]:
    """Per branch, the (N, b) probabilities after masking (mask: 1/True = allowed), in float32
    (float64 for float64 logits)."""
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    if mask is not None:
        allowed = mask.to(device=logits.device, dtype=logits.dtype)
        logits = logits * allowed - 1e8 * (1.0 - allowed)
    return [torch.softmax(part, dim=1) for part in torch.split(logits, list(branches), dim=1)]


def discrete_actions(logits: torch.Tensor, branches: tuple[int, ...], mask: torch.Tensor | None,
                     uniforms: np.ndarray | None) -> np.ndarray:
    """(N, branches) int64 actions; `uniforms` (N, branches) in [0, 1), None for the arg-max."""
    probabilities = masked_probabilities(logits, branches, mask)
    if uniforms is None:
        return torch.stack([torch.argmax(p, dim=1) for p in probabilities], dim=1).cpu().numpy()
    actions = np.empty((logits.shape[0], len(branches)), dtype=np.int64)
    for branch, probs in enumerate(probabilities):
        cdf = np.cumsum(probs.cpu().numpy().astype(np.float64), axis=1)
        target = uniforms[:, branch] * cdf[:, -1]
        actions[:, branch] = np.minimum((cdf <= target[:, None]).sum(axis=1), branches[branch] - 1)
    return actions
