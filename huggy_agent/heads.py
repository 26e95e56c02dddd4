"""Action heads: from the actor's outputs to actions, with masks and host noise.

Continuous (ML-Agents' export): PPO `clip(mu + z sigma, -3, 3) / 3`, SAC `tanh(mu + z sigma)`;
deterministic without z. Discrete, per branch: logits masked as ML-Agents masks them
(`logits * mask - 1e8 * (1 - mask)`), softmax; deterministic is the arg-max (the first on ties,
as torch's), stochastic inverts the branch's CDF (float64, on the host) at a uniform u, the
first action whose cumulative probability exceeds u: forbidden actions have probability 0 and
are never drawn. Noise z and u come from `huggy_agent.noise`, by (seed, row, column).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from huggy_agent.actor import PPO_ACTION_CLIP
from huggy_agent.actor.networks import Head

_CLIP_HIGH = np.float32(PPO_ACTION_CLIP)
_CLIP_LOW = np.float32(-PPO_ACTION_CLIP)
"""The PPO clip as float32 scalars: ufuncs resolve their types faster than with Python floats."""


@dataclass(frozen=True)
class ContinuousHead:
    """Continuous actions from (mu, log_sigma) and host noise z (None: deterministic), as the
    engines run it (`huggy_agent.engines.base.ActionHead`).

    The torch and numpy versions do the same IEEE operations in the same order (their `exp` and
    `tanh` may differ by an ulp).
    """

    kind: Head

    def torch(self, outputs: tuple[torch.Tensor, ...], noise: torch.Tensor | None) -> torch.Tensor:
        """Continuous actions on the outputs' device, with no host synchronisation (graph engines capture
        it).

        Args:
            outputs: the actor's outputs, `mu` (N, c) first and `log_sigma` second.
            noise: host noise z (N, c) already on the device, or None for deterministic actions.

        Returns:
            The (N, c) actions: PPO's clipped and scaled into [-1, 1], SAC's through tanh.
        """
        mu, log_sigma = outputs[0], outputs[1]
        action = mu if noise is None else mu + noise * torch.exp(log_sigma)
        if self.kind == "sac":
            return torch.tanh(action)
        return torch.clamp(action, -PPO_ACTION_CLIP, PPO_ACTION_CLIP) / PPO_ACTION_CLIP

    def numpy(self, outputs: tuple[np.ndarray, ...], noise: np.ndarray | None) -> np.ndarray:
        """Continuous actions on the host, the same operations in the same order as `torch`.

        Args:
            outputs: the actor's outputs as arrays, `mu` (N, c) first and `log_sigma` second.
            noise: host noise z (N, c), or None for deterministic actions.

        Returns:
            A new (N, c) array of actions: PPO's clipped and scaled into [-1, 1], SAC's through tanh.
        """
        mu, log_sigma = outputs[0], outputs[1]
        action: np.ndarray
        if noise is None:
            if self.kind == "sac":
                action = np.tanh(mu)
                return action
            action = np.maximum(mu, _CLIP_LOW)
        else:
            action = np.multiply(noise, np.exp(log_sigma))
            np.add(mu, action, out=action)
            if self.kind == "sac":
                np.tanh(action, out=action)
                return action
            np.maximum(action, _CLIP_LOW, out=action)
        np.minimum(action, _CLIP_HIGH, out=action)
        np.divide(action, _CLIP_HIGH, out=action)
        return action

    def apply(self, mu: Tensor, log_sigma: Tensor, noise: np.ndarray | None
              ) -> np.ndarray:
        """Continuous actions computed where the outputs are: on the host for CPU tensors, else on their
        device.

        Args:
            mu: (N, c) means.
            log_sigma: (N, c) log standard deviations, or PPO's (1, c) that broadcasts over rows.
            noise: host noise z (N, c), or None for deterministic actions.

        Returns:
            (N, c) float32 actions as a numpy array.
        """
        if mu.device.type == "cpu":
            return self.numpy((mu.numpy(), log_sigma.numpy()), noise)
        device_noise = None if noise is None else torch.from_numpy(noise).to(mu.device)
        return self.torch((mu, log_sigma), device_noise).cpu().numpy()


def masked_probabilities(logits: torch.Tensor, branches: tuple[int, ...],
                         mask: torch.Tensor | None) -> list[torch.Tensor]:
    """Per branch, the action probabilities after masking as ML-Agents masks them.

    Args:
        logits: (N, sum of branches) logits.
        branches: the size of each branch.
        mask: (N, sum of branches), 1 or True where an action is allowed; None allows all.

    Returns:
        One (N, b) tensor per branch, float32 (float64 for float64 logits).
    """
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    if mask is not None:
        allowed = mask.to(device=logits.device, dtype=logits.dtype)
        logits = logits * allowed - 1e8 * (1.0 - allowed)
    return [torch.softmax(part, dim=1) for part in torch.split(logits, list(branches), dim=1)]


def discrete_actions(logits: torch.Tensor, branches: tuple[int, ...], mask: torch.Tensor | None,
                     uniforms: np.ndarray | None) -> np.ndarray:
    """Discrete actions, one per branch: the arg-max, or a draw by inverting the branch's CDF.

    Args:
        logits: (N, sum of branches) logits.
        branches: the size of each branch.
        mask: (N, sum of branches), 1 or True where an action is allowed; None allows all.
        uniforms: (N, branches) uniforms in [0, 1) for stochastic actions; None for the arg-max
            (the first on ties).

    Returns:
        (N, branches) int64 actions; a forbidden action is never drawn.
    """
    probabilities = masked_probabilities(logits, branches, mask)
    if uniforms is None:
        return torch.stack([torch.argmax(p, dim=1) for p in probabilities], dim=1).cpu().numpy()
    actions = np.empty((logits.shape[0], len(branches)), dtype=np.int64)
    for branch, probs in enumerate(probabilities):
        cdf = np.cumsum(probs.cpu().numpy().astype(np.float64), axis=1)
        target = uniforms[:, branch] * cdf[:, -1]
        actions[:, branch] = np.minimum((cdf <= target[:, None]).sum(axis=1), branches[branch] - 1)
    return actions
