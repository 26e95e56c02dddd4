"""The stand-in's spec-driven mode: any ML-Agents behavior, taken from a policy's spec.

Not a simulation of anything: a protocol peer for tests and demos of policies other than Huggy
(the real Pyramids policy drives it). Per decision, each agent's observations are drawn from a
seeded generator (vectors N(0, 1), images U[0, 1), variable-length inputs a random number of
N(0, 1) entities then zero padding), and so are its action masks (each action allowed with
probability 0.7, at least one per branch). An episode of slot s lasts exactly
`episode_length + s * episode_length_step` decisions and ends terminated. The reward of a
decision is 0.01, minus 0.01 times the mean square of the continuous actions, minus 1 for each
discrete action the mask forbade: a policy that honours its masks never loses a point.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from envs.standin.sim import SeededSim

ALLOWED_PROBABILITY = 0.7
FORBIDDEN_PENALTY = 1.0
STEP_REWARD = 0.01


@dataclass(frozen=True)
class SpecInput:
    """One observation input on the wire: its shape and kind (vector, visual, variable)."""

    shape: tuple[int, ...]
    kind: str


@dataclass(frozen=True)
class BehaviorSpecDescription:
    """What the spec-driven stand-in plays: observation inputs, continuous size, branches."""

    inputs: tuple[SpecInput, ...]
    continuous_size: int = 0
    discrete_branches: tuple[int, ...] = ()

    @classmethod
    def from_dict(cls, data: dict) -> BehaviorSpecDescription:
        """The behavior of a policy's interface.

        Args:
            data: `huggy_agent_client.spec.ActorSpec.as_dict()` (the memory size is the policy's own, and is
                not read).

        Returns:
            The description.
        """
        return cls(tuple(SpecInput(tuple(i["shape"]), i["kind"]) for i in data["inputs"]),
                   int(data["continuous_size"]), tuple(int(b) for b in data["discrete_branches"]))


@dataclass
class SpecSimConfig:
    """What the EnvironmentParameters side channel can set (applied at the next reset)."""

    num_agents: int = 8
    episode_length: int = 40
    """Decisions of slot 0's episodes; slot s's last `episode_length + s * episode_length_step`."""
    episode_length_step: int = 0

    def validated(self) -> SpecSimConfig:
        """This configuration, checked, with whole numbers where fields count.

        Returns:
            A new configuration.

        Raises:
            ValueError: `num_agents` or `episode_length` below 1, or `episode_length_step` below 0.
        """
        if int(self.num_agents) < 1 or int(self.episode_length) < 1 or \
                int(self.episode_length_step) < 0:
            raise ValueError(f"need num_agents >= 1, episode_length >= 1 and "
                             f"episode_length_step >= 0, got {self}")
        return SpecSimConfig(int(self.num_agents), int(self.episode_length),
                             int(self.episode_length_step))


@dataclass
class SpecStep:
    """One decision's output, one row per agent in slot order (as `sim.StepResult`)."""

    observations: list[np.ndarray]
    masks: np.ndarray | None
    reward: np.ndarray
    done: np.ndarray
    agent_id: np.ndarray
    new_agent_id: np.ndarray
    new_observations: list[np.ndarray]
    new_masks: np.ndarray | None


class SpecSim(SeededSim):
    """`num_agents` agents of one behavior; `reset()` then `step(continuous, discrete)`.

    Args:
        spec: the behavior.
        config: the scene's settings; None: the defaults.
        seed: seeds the draws.

    Raises:
        ValueError: a configuration `SpecSimConfig.validated` refuses.
    """

    def __init__(self, spec: BehaviorSpecDescription, config: SpecSimConfig | None = None,
                 seed: int = 0) -> None:
        self.spec = spec
        super().__init__(config or SpecSimConfig(), seed)

    def reset(self, config: SpecSimConfig | None = None) -> tuple[list[np.ndarray], np.ndarray | None]:
        """New episodes for every slot (new ids).

        Args:
            config: a new configuration to apply first, or None.

        Returns:
            The first observations (one (N, *shape) array per input) and action masks (None without
                discrete actions).

        Raises:
            ValueError: a configuration `SpecSimConfig.validated` refuses.
        """
        if config is not None:
            self.config = config.validated()
        n = self.config.num_agents
        self.steps = np.zeros(n, dtype=np.int64)
        self.agent_id = np.arange(self._next_id, self._next_id + n)
        self._next_id += n
        self.observations, self.masks = self._draw(n)
        return self.observations, self.masks

    def _draw(self, rows: int) -> tuple[list[np.ndarray], np.ndarray | None]:
        arrays = []
        for spec_input in self.spec.inputs:
            shape = (rows, *spec_input.shape)
            if spec_input.kind == "visual":
                arrays.append(self.rng.random(shape, dtype=np.float32))
                continue
            values = self.rng.standard_normal(shape).astype(np.float32)
            if spec_input.kind == "variable":
                present = self.rng.integers(0, spec_input.shape[0] + 1, rows)
                values[np.arange(spec_input.shape[0])[None, :] >= present[:, None]] = 0.0
            arrays.append(values)
        branches = self.spec.discrete_branches
        if not branches:
            return arrays, None
        allowed = self.rng.random((rows, sum(branches))) < ALLOWED_PROBABILITY
        start = 0
        for size in branches:
            allowed[np.arange(rows), start + self.rng.integers(0, size, rows)] = True
            start += size
        return arrays, allowed

    def step(self, continuous: np.ndarray | None, discrete: np.ndarray | None) -> SpecStep:
        """Apply one decision's actions; finished slots restart at once with new ids.

        Args:
            continuous: (N, c) floats, or None.
            discrete: (N, branches) integers, or None.

        Returns:
            The decision's output, one row per agent in slot order.
        """
        n = self.config.num_agents
        reward = np.full(n, STEP_REWARD, dtype=np.float64)
        if self.spec.continuous_size and continuous is not None:
            reward -= STEP_REWARD * np.mean(np.square(np.clip(continuous, -1, 1)), axis=1)
        if self.spec.discrete_branches and discrete is not None and self.masks is not None:
            offsets = np.cumsum([0, *self.spec.discrete_branches[:-1]])
            chosen = np.clip(discrete, 0, np.array(self.spec.discrete_branches) - 1) + offsets
            forbidden = ~self.masks[np.arange(n)[:, None], chosen]
            reward -= FORBIDDEN_PENALTY * forbidden.sum(axis=1)
        self.steps += 1
        lengths = self.config.episode_length + np.arange(n) * self.config.episode_length_step
        done = self.steps >= lengths
        observations, masks = self._draw(n)
        agent_id = self.agent_id.copy()
        new_agent_id = np.full(n, -1)
        if done.any():
            count = int(done.sum())
            new_agent_id[done] = np.arange(self._next_id, self._next_id + count)
            self._next_id += count
            self.agent_id[done] = new_agent_id[done]
            self.steps[done] = 0
        new_observations, new_masks = self._draw(n)
        self.observations = [np.where(_rows(done, o), new, o)
                             for o, new in zip(observations, new_observations, strict=True)]
        self.masks = (None if masks is None or new_masks is None
                      else np.where(done[:, None], new_masks, masks))
        return SpecStep(observations, masks, reward.astype(np.float32), done, agent_id,
                        new_agent_id, new_observations, new_masks)


def _rows(mask: np.ndarray, like: np.ndarray) -> np.ndarray:
    """`mask` (N,) shaped to broadcast over the rows of `like`."""
    return mask.reshape((-1,) + (1,) * (like.ndim - 1))


def behavior_seed(seed: int, index: int) -> int:
    """The seed of one behavior of a scene.

    Args:
        seed: the scene's seed.
        index: the behavior's index.

    Returns:
        `seed` itself for the first (a one-behavior scene plays as before), an independent stream
            for each other.
    """
    if index == 0:
        return seed
    return int(np.random.SeedSequence([seed, index]).generate_state(1, np.uint64)[0])


class SpecScene:
    """Several behaviors in one scene, each a `SpecSim` of its own spec and agent count (None:
    the configuration's `num_agents`), seeded apart (`behavior_seed`).

    Args:
        behaviors: (spec, agents or None) of each behavior.
        config: the scene's settings.
        seed: the scene's seed.
    """

    def __init__(self, behaviors: Sequence[tuple[BehaviorSpecDescription, int | None]],
                 config: SpecSimConfig, seed: int) -> None:
        self.agent_counts = [agents for _, agents in behaviors]
        self.sims = [SpecSim(spec, self._config(config, agents), behavior_seed(seed, index))
                     for index, (spec, agents) in enumerate(behaviors)]

    @staticmethod
    def _config(config: SpecSimConfig, agents: int | None) -> SpecSimConfig:
        return config if agents is None else replace(config, num_agents=agents)

    def reseed(self, seed: int) -> None:
        """Restart every behavior's random stream (see `SeededSim.reseed`).

        Args:
            seed: the scene's new seed.
        """
        for index, sim in enumerate(self.sims):
            sim.reseed(behavior_seed(seed, index))

    def reset(self, config: SpecSimConfig) -> list[tuple[list[np.ndarray], np.ndarray | None]]:
        """New episodes for every slot of every behavior.

        Args:
            config: the scene's settings.

        Returns:
            Each behavior's first observations and masks.
        """
        return [sim.reset(self._config(config, agents))
                for sim, agents in zip(self.sims, self.agent_counts, strict=True)]
