"""Scripted SoccerTwos players, accepted wherever a policy is for that scene:
`heuristic:idle`, `heuristic:random` and `heuristic:chaser`.

    player = load_heuristic("heuristic:chaser")
    actions = player.compute_action([obs_0, obs_1])  # (N, 3) int64, or (3,) for one row

They meet callers at `HuggyAgent`'s boundary: `compute_action(obs, deterministic=True, seed=None,
row_offset=0, action_mask=None)`, a `spec` (`huggy_agent_client.spec.ActorSpec`: inputs obs_0 (264,)
and obs_1 (72,), discrete branches (3, 3, 3)), a `fingerprint` (16 hex digits, like a
policy's weights fingerprint: it names the player and its rules' version), `describe()` and a
no-op `warmup()`. They act from the observations alone (SoccerTwos' stacked ray frames, see
`envs/standin/soccer/README.md`), so they play the stand-in and a real SoccerTwos build alike.

- `idle` sends zeros: it stands still.
- `random` draws each branch uniformly from counter-based noise (`huggy_agent.noise`), the
  same on every machine; it has no mode, so it plays the same whatever `deterministic` says.
- `chaser` runs at the ball, and around it when it faces its own goal (`chase`); deterministic.

With an action mask (True = allowed), a player whose choice is not allowed takes the first
allowed action of that branch (`random` draws among the allowed ones).
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterable
from typing import Any

import numpy as np

from envs.standin.soccer import field, rays
from envs.standin.soccer.sim import BRANCHES
from huggy_agent.noise import SEED_RANGE, uniform_noise
from huggy_agent_client.inputs import as_input_batches, as_mask_batch
from huggy_agent_client.spec import ActorSpec, ObservationInput

PREFIX = "heuristic:"
HEURISTICS = ("idle", "random", "chaser")
RULES_VERSION = 1
"""Part of every fingerprint: bump it when a player's rules change."""

SOCCER_SPEC = ActorSpec((ObservationInput("obs_0", (rays.FORWARD_SIZE,), "vector"),
                         ObservationInput("obs_1", (rays.BACKWARD_SIZE,), "vector")), 0,
                        BRANCHES)
"""SoccerTwos' interface: the forward and backward ray sensors' three stacked frames (264 and 72
values), and three branches (forward/back, sideways, rotation) of three actions."""

# The layout of SoccerTwos' observations (ML-Agents' RayPerceptionSensor, stacked oldest first).
_FRACTION = rays.NUM_TAGS + 1  # per ray: a one-hot of the tags, "hit nothing", the hit fraction
_FORWARD_ANGLES = rays.FORWARD_ANGLES
"""Forward rays, degrees: 90 straight ahead, below 90 to the right."""
_RAY_LENGTH = field.RAY_LENGTH
_OPEN_METRES = 5.0
"""A chaser looking for the ball moves on while its middle ray sees nothing this close."""
_CLOSE_METRES = 1.0
"""A chaser facing its own goal backs off from a ball this close before going around it."""
_AIM_DEGREES = 6.0
"""The chaser turns toward the ball unless it lies within this many degrees of straight ahead."""
FORWARD, BACK = 1, 2  # branch 0
RIGHT, LEFT = 1, 2  # branch 1
TURN_LEFT, TURN_RIGHT = 1, 2  # branch 2


def is_heuristic(source: Any) -> bool:
    """Whether a source names a scripted player.

    Args:
        source: a policy source.

    Returns:
        True for a string `heuristic:NAME`, known or not.
    """
    return isinstance(source, str) and source.startswith(PREFIX)


def load_heuristic(source: str, seed: int | None = None) -> HeuristicPlayer:
    """The scripted player a source names.

    Args:
        source: `heuristic:idle`, `heuristic:random` or `heuristic:chaser`.
        seed: seeds the generator of stochastic calls without a seed of their own.

    Returns:
        The player.

    Raises:
        ValueError: any other name, listing the known ones.
    """
    name = source[len(PREFIX):] if is_heuristic(source) else None
    if name not in HEURISTICS:
        known = ", ".join(PREFIX + known for known in HEURISTICS)
        raise ValueError(f"unknown scripted player {source!r}; expected one of {known}")
    return HeuristicPlayer(name, seed)


class HeuristicPlayer:
    """A scripted SoccerTwos player with the policy boundary of `HuggyAgent`.

    Args:
        name: `idle`, `random` or `chaser`.
        seed: seeds the generator of stochastic calls without a seed of their own.

    Raises:
        ValueError: an unknown name.
    """

    def __init__(self, name: str, seed: int | None = None) -> None:
        if name not in HEURISTICS:
            raise ValueError(f"unknown scripted player {name!r}; expected one of "
                             f"{list(HEURISTICS)}")
        self.name = name
        self.source = PREFIX + name
        self.spec = SOCCER_SPEC
        self.fingerprint = hashlib.sha256(
            f"{self.source} rules v{RULES_VERSION}".encode()).hexdigest()[:16]
        self._rng = np.random.default_rng(seed)

    def compute_action(self, obs: Any, deterministic: bool = True, seed: int | None = None,
                       row_offset: int = 0, action_mask: Any = None, memory: Any = None
                       ) -> np.ndarray:
        """Actions for SoccerTwos observations, as a policy's `compute_action` gives them.

        Args:
            obs: [obs_0, obs_1], single rows or batches of N.
            deterministic: the policy contract's; no player here has a mode to choose.
            seed: `random`'s noise stream: row i of a call gets the draws of row `row_offset + i` of
                stream `seed`; None draws a fresh stream from the player's own generator.
            row_offset: the stream's row of the first observation (`random` only).
            action_mask: (N, 9) or (9,), True where allowed; None allows all.
            memory: must be None (these players have none).

        Returns:
            int64 (N, 3) actions, or (3,) for single rows.

        Raises:
            ValueError: a wrong shape or a non-finite value, a mask that a policy would refuse, or a
                `memory`, as a policy refuses them.
        """
        if memory is not None:
            raise ValueError(f"{self.source} has no recurrent memory: memory must be None")
        inputs, single = as_input_batches(obs, self.spec)
        rows = len(inputs[0])
        mask = as_mask_batch(action_mask, self.spec, rows)
        if self.name == "random":
            stream = int(self._rng.integers(SEED_RANGE)) if seed is None else seed
            actions = _random_actions(uniform_noise(stream, rows, 3, row_offset), mask)
        else:
            actions = (np.zeros((rows, 3), np.int64) if self.name == "idle"
                       else chase(inputs[0], inputs[1]))
            if mask is not None:
                actions = _allowed(actions, mask)
        return actions[0] if single else actions

    def describe(self) -> dict[str, Any]:
        """A JSON-serialisable summary, with the keys of `HuggyAgent.describe()` that apply.

        Returns:
            The spec, source, format (`heuristic`), a summary line and the fingerprint.
        """
        return {"spec": self.spec.as_dict(), "source": self.source, "format": "heuristic",
                "summary": f"scripted SoccerTwos player {self.source}",
                "fingerprint": self.fingerprint}

    def warmup(self, batch_sizes: Iterable[int], paths: Collection[str] = ()) -> None:
        """Nothing to prepare (the policy contract's warm-up).

        Args:
            batch_sizes: ignored.
            paths: ignored.
        """


def _branch_views(mask: np.ndarray) -> list[np.ndarray]:
    return [mask[:, 3 * branch:3 * branch + 3] for branch in range(3)]


def _allowed(actions: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """`actions`, with each choice the mask forbids replaced by its branch's first allowed
    action."""
    out = actions.copy()
    for branch, allowed in enumerate(_branch_views(mask)):
        chosen = out[:, branch]
        forbidden = ~allowed[np.arange(len(out)), chosen]
        out[forbidden, branch] = np.argmax(allowed[forbidden], axis=1)
    return out


def _random_actions(uniforms: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    """One action per (row, branch) from uniforms in [0, 1): uniform over the branch's actions,
    or over its allowed ones."""
    if mask is None:
        return np.minimum((uniforms * 3).astype(np.int64), 2)
    actions = np.empty(uniforms.shape, np.int64)
    for branch, allowed in enumerate(_branch_views(mask)):
        count = allowed.sum(axis=1)
        pick = np.minimum((uniforms[:, branch] * count).astype(np.int64), count - 1)
        # the pick-th allowed action: the first index where the running count exceeds pick
        actions[:, branch] = np.argmax(np.cumsum(allowed, axis=1) > pick[:, None], axis=1)
    return actions


def chase(forward_obs: np.ndarray, backward_obs: np.ndarray) -> np.ndarray:
    """The chaser's actions from SoccerTwos observations.

    When its latest forward rays see the ball it turns toward it and runs at it (a forward move
    kicks), unless it faces its own goal (seen ahead, or the other goal seen behind, in any of its
    three stacked frames), when it steps sideways around the ball instead (backing off first from a
    ball within `_CLOSE_METRES`); otherwise it turns right until the ball is ahead, moving forward
    while the way ahead is open.

    Args:
        forward_obs: (N, 264) forward ray frames, oldest first.
        backward_obs: (N, 72) backward ray frames, oldest first.

    Returns:
        (N, 3) int64 actions.
    """
    rows = len(forward_obs)
    frames_ahead = forward_obs.reshape(rows, rays.STACKS, rays.FORWARD_RAYS,
                                       rays.VALUES_PER_RAY)  # oldest frame first
    frames_behind = backward_obs.reshape(rows, rays.STACKS, rays.BACKWARD_RAYS,
                                         rays.VALUES_PER_RAY)
    ahead = frames_ahead[:, -1]
    ball_ahead = ahead[..., rays.BALL] > 0.5
    nearest = np.argmin(np.where(ball_ahead, ahead[..., _FRACTION], np.inf), axis=1)
    seen_ahead = ball_ahead.any(axis=1)
    offset = _FORWARD_ANGLES[nearest] - 90.0  # > 0: the ball is to the left
    # Facing our own goal (seen ahead, or the other goal seen behind, in any of the three
    # frames: a ball close ahead hides most of the forward rays): a push would go that way.
    facing_own_goal = ((frames_ahead[..., rays.OWN_GOAL] > 0.5).any(axis=(1, 2))
                       | (frames_behind[..., rays.OPPOSING_GOAL] > 0.5).any(axis=(1, 2)))

    actions = np.zeros((rows, 3), np.int64)
    actions[seen_ahead, 0] = FORWARD
    turn = np.where(offset > _AIM_DEGREES, TURN_LEFT,
                    np.where(offset < -_AIM_DEGREES, TURN_RIGHT, 0))
    actions[seen_ahead, 2] = turn[seen_ahead]
    # Go around the ball instead: step sideways (which replaces the forward move) while turning
    # to keep it ahead, until the own goal is out of sight.
    around = seen_ahead & facing_own_goal
    actions[around, 1] = np.where(offset[around] >= 0, RIGHT, LEFT)
    # Too close to get around it: back off first.
    close = around & (ahead[np.arange(rows), nearest, _FRACTION] * _RAY_LENGTH < _CLOSE_METRES)
    actions[close, 0] = BACK
    actions[close, 1] = 0
    # Not ahead: turn one way until it is (turning toward a ball seen behind, then away to
    # look for it when it slips between the rays, would never end), moving on where the way
    # ahead is open, so that a ball hidden by others or between rays comes into view.
    actions[~seen_ahead, 2] = TURN_RIGHT
    open_ahead = ahead[:, 0, _FRACTION] * _RAY_LENGTH > _OPEN_METRES
    actions[~seen_ahead & open_ahead, 0] = FORWARD
    return actions
