"""The stand-in's Unity side in spec-driven mode (`--behavior-spec JSON`): the protocol of
`client.StandIn` for any behaviors, each driving a `SpecSim`, with messages built through
protobuf (clear rather than fast: this mode is for tests and demos of policies other than Huggy).

`JSON` is one behavior (an `ActorSpec.as_dict()` with an optional `"behavior"` name, default
`Agent`), played as team 0 by `num_agents` agents; or a list of such objects, each with its own
`"team"` (default 0) and optional `"agents"` count (default: the `num_agents` parameter), all
played in one process: for example a `Striker` of team 0 and a `Goalie` of team 1, which
mlagents-envs sees as `Striker?team=0` and `Goalie?team=1`.

Each agent reports one `ObservationProto` per input (uncompressed float data, with the shape
and dimension properties ML-Agents' sensors give: vector NONE, image NONE + translational
equivariance, variable-length VARIABLE_SIZE + NONE) and, for discrete branches, its
`action_mask` (True = not allowed, mlagents-envs' convention).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TextIO

import numpy as np

from envs.standin.protocol import (
    apply_parameters,
    handshake_message,
    initialization_output,
    reset_seed,
)
from envs.standin.spec_sim import BehaviorSpecDescription, SpecScene, SpecSimConfig, SpecStep

PARAMETERS = {"num_agents", "episode_length", "episode_length_step", "seed"}
NONE, TRANSLATIONAL_EQUIVARIANCE, VARIABLE_SIZE = 1, 2, 4
DIMENSION_PROPERTIES = {"vector": (NONE,), "visual": (NONE, TRANSLATIONAL_EQUIVARIANCE,
                                                      TRANSLATIONAL_EQUIVARIANCE),
                        "variable": (VARIABLE_SIZE, NONE)}


@dataclass(frozen=True)
class SpecBehavior:
    """One behavior of a spec-driven scene."""

    name: str
    team: int
    agents: int | None
    """Agents playing it; None: the `num_agents` environment parameter."""
    spec: BehaviorSpecDescription

    @property
    def wire_name(self) -> str:
        """The name mlagents-envs gives it: `name?team=T`."""
        return f"{self.name}?team={self.team}"


def parse_behavior_spec(text: str) -> list[SpecBehavior]:
    """The behaviors of `--behavior-spec` (see `launcher.spec_arguments`).

    Args:
        text: one behavior object (an `ActorSpec.as_dict()` with an optional `"behavior"` name), or
            a non-empty list of them, each with an optional `"team"` and `"agents"`.

    Returns:
        The behaviors, in order.

    Raises:
        ValueError: not an object or a list of them, an entry that is not a spec, a team or agent
            count that is not a whole number in range, or a behavior and team given twice; naming
            the entry and field at fault.
    """
    data = json.loads(text)
    entries = data if isinstance(data, list) else [data]
    if not entries or not all(isinstance(entry, dict) for entry in entries):
        raise ValueError(f"--behavior-spec: expected a behavior object or a non-empty list of "
                         f"them, got {text[:200]!r}")
    behaviors = []
    for index, entry in enumerate(entries):
        where = f"--behavior-spec entry {index}"
        try:
            spec = BehaviorSpecDescription.from_dict(entry)
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"{where}: expected an ActorSpec.as_dict() (inputs, "
                             f"continuous_size, discrete_branches), got {entry!r}: "
                             f"{error!r}") from error
        team, agents = entry.get("team", 0), entry.get("agents")
        if isinstance(team, bool) or not isinstance(team, int) or team < 0:
            raise ValueError(f"{where}: team must be an integer >= 0, got {team!r}")
        if agents is not None and (isinstance(agents, bool) or not isinstance(agents, int)
                                   or agents < 1):
            raise ValueError(f"{where}: agents must be an integer >= 1, got {agents!r}")
        behaviors.append(SpecBehavior(str(entry.get("behavior", "Agent")), team, agents, spec))
    names = [b.wire_name for b in behaviors]
    if len(set(names)) != len(names):
        raise ValueError(f"--behavior-spec: each behavior and team may appear once, got {names}")
    return behaviors


class SpecStandIn:
    """Protocol state of the spec-driven mode (the interface of `client.StandIn`).

    Args:
        log: where to write what happens.
        behaviors: the behaviors to play, in order.
    """

    def __init__(self, log: TextIO, behaviors: Sequence[SpecBehavior]) -> None:
        self.log = log
        self.behaviors = list(behaviors)
        self.sim: SpecScene | None = None
        self.config = SpecSimConfig()
        self.pending_seed: int | None = None
        self.announced = False
        # Per behavior, the slot of each deciding agent in message order: Python answers in it.
        self.order = [np.zeros(0, dtype=np.int64) for _ in self.behaviors]

    def handshake_message(self) -> bytes:
        """The player's first message, named after the first behavior.

        Returns:
            The serialized `UnityMessageProto`.
        """
        return handshake_message(self.behaviors[0].name)

    def apply_parameters(self, side_channel: bytes) -> None:
        """Apply the EnvironmentParameters of a message (`protocol.apply_parameter_values`).

        Args:
            side_channel: the message's side-channel bytes.
        """
        apply_parameters(self, side_channel, PARAMETERS)

    def reset(self, seed: int) -> bytes:
        """Reset the scene (made on the first reset) and report every agent's first decision.

        Args:
            seed: the handshake's seed (a seed sent as a parameter takes its place).

        Returns:
            The serialized observation message.
        """
        seed = reset_seed(self, seed)
        if self.sim is None:
            self.sim = SpecScene([(b.spec, b.agents) for b in self.behaviors], self.config, seed)
            firsts = [(sim.observations, sim.masks) for sim in self.sim.sims]
        else:
            firsts = self.sim.reset(self.config)
        self.log.write(f"reset: {self.config}\n")
        parts = []
        for index, (sim, (observations, masks)) in enumerate(zip(self.sim.sims, firsts,
                                                                 strict=True)):
            n = sim.num_agents
            self.order[index] = np.arange(n)
            zeros = np.zeros(n, bool)
            parts.append((sim.agent_id, np.zeros(n, np.float32), zeros, observations, masks))
        return self._message(parts)

    def step(self, actions: list[tuple[np.ndarray | None, np.ndarray | None]]) -> bytes:
        """Step every behavior's simulation.

        Args:
            actions: per behavior, (continuous, discrete) rows by slot.

        Returns:
            The serialized observation message.
        """
        assert self.sim is not None
        return self._message([self._rows(index, sim.step(*behavior_actions))
                              for index, (sim, behavior_actions)
                              in enumerate(zip(self.sim.sims, actions, strict=True))])

    def _rows(self, index: int, r: SpecStep) -> tuple:
        """One behavior's message rows after a step. A finished agent reports its terminal
        step; its successor (a new id) asks for its first decision in the same message."""
        if not r.done.any():
            self.order[index] = np.arange(len(r.done))
            return r.agent_id, r.reward, r.done, r.observations, r.masks
        fresh = np.flatnonzero(r.done)
        self.order[index] = np.concatenate([np.flatnonzero(~r.done), fresh])
        masks = (None if r.masks is None or r.new_masks is None
                 else np.concatenate([r.masks, r.new_masks[fresh]]))
        return (np.concatenate([r.agent_id, r.new_agent_id[fresh]]),
                np.concatenate([r.reward, np.zeros(len(fresh), np.float32)]),
                np.concatenate([r.done, np.zeros(len(fresh), bool)]),
                [np.concatenate([o, new[fresh]])
                 for o, new in zip(r.observations, r.new_observations, strict=True)], masks)

    def _message(self, parts: list[tuple]) -> bytes:
        from mlagents_envs.communicator_objects.unity_message_pb2 import UnityMessageProto

        message = UnityMessageProto()
        message.header.status = 200
        output = message.unity_output
        for behavior, (ids, reward, done, observations, masks) in zip(self.behaviors, parts,
                                                                      strict=True):
            infos = output.rl_output.agentInfos[behavior.wire_name].value
            for row, agent in enumerate(ids.tolist()):
                info = infos.add()
                info.id, info.reward, info.done = agent, float(reward[row]), bool(done[row])
                for index, (spec_input, values) in enumerate(zip(behavior.spec.inputs,
                                                                 observations, strict=True)):
                    proto = info.observations.add()
                    proto.shape.extend(spec_input.shape)
                    proto.float_data.data.extend(values[row].ravel().tolist())
                    proto.dimension_properties.extend(DIMENSION_PROPERTIES[spec_input.kind])
                    proto.name = f"obs_{index}"
                if masks is not None and not done[row]:
                    info.action_mask.extend((~masks[row]).tolist())
        if not self.announced:
            output.rl_initialization_output.CopyFrom(initialization_output(
                self.behaviors[0].name,
                [(b.wire_name, b.spec.continuous_size, b.spec.discrete_branches)
                 for b in self.behaviors]))
            self.announced = True
        return message.SerializeToString()

    def actions_from(self, rl_input: Any) -> list[tuple[np.ndarray, np.ndarray]]:
        """The step's actions of a message from Python.

        Args:
            rl_input: the message's `UnityRLInputProto`.

        Returns:
            Per behavior, (continuous, discrete) rows in slot order; zeros for a missing or malformed
                answer (logged).
        """
        assert self.sim is not None
        return [self._behavior_actions(rl_input, behavior, sim.num_agents, order)
                for behavior, sim, order in zip(self.behaviors, self.sim.sims, self.order,
                                                strict=True)]

    def _behavior_actions(self, rl_input: Any, behavior: SpecBehavior, n: int,
                          order: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        spec = behavior.spec
        continuous = np.zeros((n, spec.continuous_size), np.float32)
        discrete = np.zeros((n, len(spec.discrete_branches)), np.int64)
        listing = rl_input.agent_actions.get(behavior.wire_name)
        if listing is None or len(listing.value) == 0:
            return continuous, discrete
        rows = list(listing.value)
        if len(rows) != n or any(len(a.continuous_actions) != spec.continuous_size
                                 or len(a.discrete_actions) != len(spec.discrete_branches)
                                 for a in rows):
            self.log.write(f"unexpected actions for {behavior.wire_name}: {len(rows)} rows for "
                           f"{n} agents; using zeros\n")
            return continuous, discrete
        # Python answers in the order of the decision agents it received (`order`).
        continuous[order] = np.array([list(a.continuous_actions) for a in rows],
                                     np.float32).reshape(n, -1)
        discrete[order] = np.array([list(a.discrete_actions) for a in rows],
                                   np.int64).reshape(n, -1)
        return continuous, discrete
