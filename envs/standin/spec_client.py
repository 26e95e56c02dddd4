"""The stand-in's Unity side in spec-driven mode (`--behavior-spec JSON`): the protocol of
`client.StandIn` for any behavior, driving a `SpecSim`, with messages built through protobuf
(clear rather than fast: this mode is for tests and demos of policies other than Huggy).

Each agent reports one `ObservationProto` per input (uncompressed float data, with the shape
and dimension properties ML-Agents' sensors give: vector NONE, image NONE + translational
equivariance, variable-length VARIABLE_SIZE + NONE) and, for discrete branches, its
`action_mask` (True = not allowed, mlagents-envs' convention).
"""

from __future__ import annotations

import json
from typing import Any, TextIO

import numpy as np

from envs.standin.protocol import (
    apply_parameters,
    handshake_message,
    initialization_output,
    reset_seed,
)
from envs.standin.spec_sim import BehaviorSpecDescription, SpecSim, SpecSimConfig

PARAMETERS = {"num_agents", "episode_length", "episode_length_step", "seed"}
NONE, TRANSLATIONAL_EQUIVARIANCE, VARIABLE_SIZE = 1, 2, 4
DIMENSION_PROPERTIES = {"vector": (NONE,), "visual": (NONE, TRANSLATIONAL_EQUIVARIANCE,
                                                      TRANSLATIONAL_EQUIVARIANCE),
                        "variable": (VARIABLE_SIZE, NONE)}


def parse_behavior_spec(text: str) -> tuple[str, BehaviorSpecDescription]:
    """The behavior name and spec of `--behavior-spec` (see `launcher.spec_arguments`)."""
    data = json.loads(text)
    return str(data.get("behavior", "Agent")), BehaviorSpecDescription.from_dict(data)


class SpecStandIn:
    """Protocol state of the spec-driven mode (the interface of `client.StandIn`)."""

    def __init__(self, log: TextIO, behavior: str, spec: BehaviorSpecDescription) -> None:
        self.log = log
        self.name = behavior
        self.behavior = f"{behavior}?team=0"
        self.spec = spec
        self.sim: SpecSim | None = None
        self.config = SpecSimConfig()
        self.pending_seed: int | None = None
        self.announced = False
        self.order = np.zeros(0, dtype=np.int64)  # slot of each decision row, in message order

    def handshake_message(self) -> bytes:
        return handshake_message(self.name)

    def apply_parameters(self, side_channel: bytes) -> None:
        apply_parameters(self, side_channel, PARAMETERS)

    def reset(self, seed: int) -> bytes:
        seed = reset_seed(self, seed)
        if self.sim is None:
            self.sim = SpecSim(self.spec, self.config, seed)
            observations, masks = self.sim.observations, self.sim.masks
        else:
            observations, masks = self.sim.reset(self.config)
        self.log.write(f"reset: {self.config}\n")
        n = self.sim.num_agents
        self.order = np.arange(n)
        zeros = np.zeros(n, bool)
        return self._message(self.sim.agent_id, np.zeros(n, np.float32), zeros, observations,
                             masks)

    def step(self, actions: tuple[np.ndarray | None, np.ndarray | None]) -> bytes:
        sim = self.sim
        assert sim is not None
        r = sim.step(*actions)
        if not r.done.any():
            self.order = np.arange(sim.num_agents)
            return self._message(r.agent_id, r.reward, r.done, r.observations, r.masks)
        # A finished agent reports its terminal step; its successor (a new id) asks for its
        # first decision in the same message.
        fresh = np.flatnonzero(r.done)
        self.order = np.concatenate([np.flatnonzero(~r.done), fresh])
        masks = (None if r.masks is None or r.new_masks is None
                 else np.concatenate([r.masks, r.new_masks[fresh]]))
        return self._message(
            np.concatenate([r.agent_id, r.new_agent_id[fresh]]),
            np.concatenate([r.reward, np.zeros(len(fresh), np.float32)]),
            np.concatenate([r.done, np.zeros(len(fresh), bool)]),
            [np.concatenate([o, new[fresh]])
             for o, new in zip(r.observations, r.new_observations, strict=True)], masks)

    def _message(self, ids: np.ndarray, reward: np.ndarray, done: np.ndarray,
                 observations: list[np.ndarray], masks: np.ndarray | None) -> bytes:
        from mlagents_envs.communicator_objects.unity_message_pb2 import UnityMessageProto

        message = UnityMessageProto()
        message.header.status = 200
        output = message.unity_output
        infos = output.rl_output.agentInfos[self.behavior].value
        for row, agent in enumerate(ids.tolist()):
            info = infos.add()
            info.id, info.reward, info.done = agent, float(reward[row]), bool(done[row])
            for index, (spec_input, values) in enumerate(zip(self.spec.inputs, observations,
                                                             strict=True)):
                proto = info.observations.add()
                proto.shape.extend(spec_input.shape)
                proto.float_data.data.extend(values[row].ravel().tolist())
                proto.dimension_properties.extend(DIMENSION_PROPERTIES[spec_input.kind])
                proto.name = f"obs_{index}"
            if masks is not None and not done[row]:
                info.action_mask.extend((~masks[row]).tolist())
        if not self.announced:
            output.rl_initialization_output.CopyFrom(initialization_output(
                self.name, self.behavior, self.spec.continuous_size, self.spec.discrete_branches))
            self.announced = True
        return message.SerializeToString()

    def actions_from(self, rl_input: Any) -> tuple[np.ndarray | None, np.ndarray | None]:
        """(continuous, discrete) rows in slot order; zeros for a missing or malformed answer."""
        sim = self.sim
        assert sim is not None
        n, spec = sim.num_agents, self.spec
        continuous = np.zeros((n, spec.continuous_size), np.float32)
        discrete = np.zeros((n, len(spec.discrete_branches)), np.int64)
        listing = rl_input.agent_actions.get(self.behavior)
        if listing is None or len(listing.value) == 0:
            return continuous, discrete
        rows = list(listing.value)
        if len(rows) != n or any(len(a.continuous_actions) != spec.continuous_size
                                 or len(a.discrete_actions) != len(spec.discrete_branches)
                                 for a in rows):
            self.log.write(f"unexpected actions: {len(rows)} rows for {n} agents; using zeros\n")
            return continuous, discrete
        # Python answers in the order of the decision agents it received (`self.order`).
        continuous[self.order] = np.array([list(a.continuous_actions) for a in rows],
                                          np.float32).reshape(n, -1)
        discrete[self.order] = np.array([list(a.discrete_actions) for a in rows],
                                        np.int64).reshape(n, -1)
        return continuous, discrete
