"""A simple dog body, vectorized over agents with numpy, with Huggy's observations and actions.

Not a physics engine: each leg joint moves toward its action target at a rate set by its strength;
an upper leg's Y rotation swings it fore and aft (mirrored between left and right legs, as the
trained policies' symmetric poses show), X and the lower leg's X set how far it reaches down. The
body's pitch is a lightly damped spring pulled by the legs (legs swung forward lower their end of
the body) and stops where the nose or rear touches the ground (body contact), a foot touches
the ground when its leg reaches down far enough at that pitch, feet on the ground that swing
backward push the body along its heading (slipping beyond a top speed), and
a turning force rotates it toward the stick. The trained policies hold their pitch with their
legs' swing, which makes this body bound forward. What matters is
the interface, which follows the Huggy build's: 59 observations in the trained models' order and
scales, 21 actions with Huggy's meaning, Huggy's reward, and an episode that ends at the stick.

Observation layout (59): body ground contact; then for each leg (upper, lower) part: contact,
normalized joint rotation X/Y/Z in [0, 1] (Z, and Y of lower legs, stay 0), strength in [0, 1];
as in ML-Agents' JointDriveController, rotation and strength report the last commanded target
(the action mapped to [0, 1]), not the joint's actual state;
then direction to the stick (3, unit), body position (3, relative to the arena centre at standing
height), velocity (3), angular velocity (3), forward (3), up (3).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from envs.standin import poses as pose

OBS_SIZE = 59
ACT_SIZE = 21
DECISION_PERIOD = 4  # physics steps per decision, as Huggy's DecisionRequester
DT = DECISION_PERIOD * 0.02  # seconds of simulated time per decision
STICK_RADIUS = 1.5  # metres: reaching the stick within this distance ends the episode
_STAND_HEIGHT = 0.93  # body height subtracted from the reported position

# Joint columns: 0-3 upper legs X, 4-7 upper legs Y, 8-11 lower legs X (normalized [0, 1]).
# Legs: 0 front left, 1 front right, 2 back left, 3 back right.
# Columns of ext @ _POSE: mean extension, front minus back, left minus right.
_POSE = np.array([[0.25, 0.5, 0.5], [0.25, 0.5, -0.5], [0.25, -0.5, 0.5], [0.25, -0.5, -0.5]])
_MIRROR = np.array([1.0, -1.0, 1.0, -1.0])  # upper leg Y -> fore-aft swing (+ = foot forward)
_FRONT = np.array([1.0, 1.0, -1.0, -1.0])  # +1 for front legs, -1 for back legs
_PITCH_FREQ = 10.0  # rad/s: natural frequency of the body's pitch spring
_PITCH_DAMPING = 2.0  # 1/s
_SWING_PITCH = -4.0  # pitch (rad) per unit of front-minus-back swing
_TILT_REACH = 2.0  # leg reach gained per radian of tilt toward that leg's end
_MAX_SWEEP = 2.5  # fastest foot sweep (normalized rotation per second) that grips the ground
_LEVEL_PITCH = 0.13  # rad, nose up: the standing pose's pitch
_MAX_REST = 0.7  # rad from the level pitch: the most the legs can tilt the body
_MAX_TILT = 0.9  # rad from the level pitch at which the body's nose or rear hits the ground
_UPPER = 1  # first observation column of the first upper leg part (one every 10 columns)
_LOWER = _UPPER + 5  # ... and of the first lower leg part


def _legs(first: int) -> slice:
    """Observation column `first` of each of the four legs' blocks."""
    return slice(first, first + 40, 10)


def _clip(x: np.ndarray, low: float, high: float) -> np.ndarray:
    """`np.clip` (the same values, NaN included) without its Python wrapper: the simulation's
    arrays are small, so per-call overhead is most of its cost."""
    return np.minimum(np.maximum(x, low), high)


def _columns(*columns: np.ndarray) -> np.ndarray:
    """`np.column_stack` of 1-D arrays, without its Python overhead."""
    out = np.empty((len(columns[0]), len(columns)))
    for j, column in enumerate(columns):
        out[:, j] = column
    return out


def _norms(x: np.ndarray, keepdims: bool = False) -> np.ndarray:
    """Row norms, exactly as `np.linalg.norm(x, axis=1)` computes them."""
    return np.sqrt(np.add.reduce(x * x, axis=1, keepdims=keepdims))  # type: ignore[call-overload]


@dataclass
class SimConfig:
    """What the EnvironmentParameters side channel can set (applied at the next reset)."""

    num_agents: int = 18
    """Number of dogs (Huggy's training scene has 18)."""
    max_steps: int = 500
    """Decisions before an episode is interrupted (max_step_reached); 0 means never."""
    arena_size: float = 7.0
    """Half-width in metres of the square arena that holds the dogs and the sticks."""
    episode_length: int = 0
    """Scripted episodes (for tests of episode statistics) when > 0: slot s's episodes last
    exactly `episode_length + s * episode_length_step` decisions, every decision but the last
    gives reward 0 and the last gives reward s, and they end terminated (at the stick) for even
    s and truncated for odd s. The dogs still move; only the episode ends and rewards change."""
    episode_length_step: int = 0
    """How much longer each slot's scripted episodes are than the previous slot's."""
    echo_actions: int = 0
    """For tests of the wire path, when 1: every observation the stand-in sends for slot s
    carries in columns 0-20 the actions it last received for slot s (zeros before the first
    step), in column 21 the slot's index s, in column 22 the stand-in's port. Applied by the
    stand-in's protocol side (`envs.standin.client`); the simulation itself is unchanged."""
    render: int = 0
    """When 1, the stand-in sends every agent's pose after each reset and step on the render
    side channel (`envs.standin.poses`), for frames drawn outside the simulation; the
    simulation's numbers are unchanged."""

    def validated(self) -> SimConfig:
        """This configuration, checked, with whole numbers where fields count.

        Returns:
            A new configuration.

        Raises:
            ValueError: a field out of its range (naming it).
        """
        if int(self.num_agents) < 1:
            raise ValueError(f"num_agents must be >= 1, got {self.num_agents}")
        if int(self.max_steps) < 0:
            raise ValueError(f"max_steps must be >= 0, got {self.max_steps}")
        if not self.arena_size >= 2 * STICK_RADIUS:
            raise ValueError(f"arena_size must be >= {2 * STICK_RADIUS}, got {self.arena_size}")
        if int(self.episode_length) < 0 or int(self.episode_length_step) < 0:
            raise ValueError("episode_length and episode_length_step must be >= 0, got "
                             f"{self.episode_length} and {self.episode_length_step}")
        for flag in ("echo_actions", "render"):
            if int(getattr(self, flag)) not in (0, 1):
                raise ValueError(f"{flag} must be 0 or 1, got {getattr(self, flag)}")
        return SimConfig(int(self.num_agents), int(self.max_steps), float(self.arena_size),
                         int(self.episode_length), int(self.episode_length_step),
                         int(self.echo_actions), int(self.render))


@dataclass
class StepResult:
    """One decision's output, one row per agent in slot order.

    `obs`/`reward`/`done`/`max_step_reached`/`agent_id` describe the agents as the step left them
    (for a finished agent: its terminal observation and final reward). `new_agent_id`/`new_obs`
    hold, for finished slots only (`done`), the agent that replaced it and its first observation.
    """

    obs: np.ndarray
    reward: np.ndarray
    done: np.ndarray
    max_step_reached: np.ndarray
    agent_id: np.ndarray
    new_agent_id: np.ndarray
    new_obs: np.ndarray


class SeededSim:
    """What the stand-in's simulations share: a validated configuration (with `num_agents`), a
    seeded random stream, and agent ids that count up from 0. Subclasses define `reset()`,
    which the constructor calls to start every slot's first episode.

    Args:
        config: a configuration with `validated()`.
        seed: seeds the random stream.

    Raises:
        ValueError: a configuration its `validated()` refuses.
    """

    def __init__(self, config: Any, seed: int) -> None:
        self.config = config.validated()
        self.rng = np.random.default_rng(seed)
        self._next_id = 0
        self.reset()

    def reset(self) -> Any:
        """Start a new episode for every slot (new ids).

        Returns:
            The subclass's first observations.
        """
        raise NotImplementedError

    def reseed(self, seed: int) -> None:
        """Restart the random stream: everything after the next reset depends only on `seed`.

        Args:
            seed: the new seed.
        """
        self.rng = np.random.default_rng(seed)

    @property
    def num_agents(self) -> int:
        return self.config.num_agents


class HuggySim(SeededSim):
    """`num_agents` independent dogs; `reset()` then `step(actions)` once per decision.

    Args:
        config: the scene's settings; None: the defaults.
        seed: seeds the random stream.

    Raises:
        ValueError: a configuration `SimConfig.validated` refuses.
    """

    def __init__(self, config: SimConfig | None = None, seed: int = 0) -> None:
        super().__init__(config or SimConfig(), seed)

    def reset(self, config: SimConfig | None = None) -> np.ndarray:
        """Start a new episode for every slot (new ids).

        Args:
            config: a new configuration to apply first, or None.

        Returns:
            The first observations, (N, 59) float32.

        Raises:
            ValueError: a configuration `SimConfig.validated` refuses.
        """
        if config is not None:
            self.config = config.validated()
        n = self.config.num_agents
        self.pos = np.zeros((n, 3))
        self.yaw = np.zeros(n)
        self.pitch = np.zeros(n)
        self.pitch_rate = np.zeros(n)
        self.roll = np.zeros(n)
        self.vel = np.zeros((n, 3))
        self.angvel = np.zeros((n, 3))
        self.joints = np.full((n, 12), 0.5)
        self.targets = np.full((n, 12), 0.5)
        self.strength = np.full((n, 8), 0.5)
        self.stick = np.zeros((n, 3))
        self.steps = np.zeros(n, dtype=np.int64)
        self.agent_id = np.zeros(n, dtype=np.int64)
        self.final_poses = np.zeros((0, pose.POSE_SIZE), np.float32)
        self._respawn(np.ones(n, dtype=bool))
        return self.observe()

    def _respawn(self, mask: np.ndarray) -> None:
        k = int(mask.sum())
        if k == 0:
            return
        a = self.config.arena_size
        self.pos[mask] = _columns(self.rng.uniform(-a, a, k), np.zeros(k),
                                  self.rng.uniform(-a, a, k))
        self.yaw[mask] = self.rng.uniform(-np.pi, np.pi, k)
        self.vel[mask] = 0.0
        self.angvel[mask] = 0.0
        self.pitch_rate[mask] = 0.0
        self.joints[mask] = 0.5
        self.targets[mask] = 0.5
        self.strength[mask] = 0.5
        self.steps[mask] = 0
        self.agent_id[mask] = np.arange(self._next_id, self._next_id + k)
        self._next_id += k
        self._place_sticks(mask)
        self._pose(mask)

    def _place_sticks(self, mask: np.ndarray) -> None:
        """A stick anywhere in the arena, at least two stick radii from its dog."""
        a = self.config.arena_size
        todo = mask.copy()
        while todo.any():
            k = int(todo.sum())
            self.stick[todo] = _columns(self.rng.uniform(-a, a, k), np.zeros(k),
                                        self.rng.uniform(-a, a, k))
            far = np.hypot(*(self.stick[:, [0, 2]] - self.pos[:, [0, 2]]).T) > 2 * STICK_RADIUS
            todo &= ~far

    def _extension(self) -> np.ndarray:
        return 0.6 * self.joints[:, 8:12] + 0.4 * self.joints[:, 0:4]  # (N, 4) in [0, 1]

    def _pose(self, mask: np.ndarray | None = None) -> None:
        """Height and roll follow from the legs' extension; pitch springs toward the pose the
        legs' extension and swing give it over one decision (`mask`: set it there at once)."""
        pose = self._extension() @ _POSE
        height = 0.3 + pose[:, 0]
        swing = (self.joints[:, 4:8] - 0.5) * _MIRROR
        rest = _LEVEL_PITCH + 2.0 * pose[:, 1] + _SWING_PITCH * (swing @ _FRONT) / 2
        rest = _clip(rest, _LEVEL_PITCH - _MAX_REST, _LEVEL_PITCH + _MAX_REST)
        roll = 2.0 * pose[:, 2]
        rows: np.ndarray | slice = slice(None) if mask is None else mask
        if mask is None:
            self.pitch_rate += DT * (_PITCH_FREQ**2 * (rest - self.pitch)
                                     - _PITCH_DAMPING * self.pitch_rate)
            pitch = self.pitch + DT * self.pitch_rate
            grounded = np.abs(pitch - _LEVEL_PITCH) >= _MAX_TILT
            self.pitch_rate[grounded] = 0.0
            pitch = _clip(pitch, _LEVEL_PITCH - _MAX_TILT, _LEVEL_PITCH + _MAX_TILT)
        else:
            pitch = rest
        self.pos[rows, 1] = height[rows]
        self.pitch[rows] = pitch[rows]
        self.roll[rows] = roll[rows]

    def _frame(self, yaw_cos_sin: tuple[np.ndarray, np.ndarray] | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
        """Forward and up unit vectors (N, 3) from yaw, pitch and roll (`yaw_cos_sin`: the
        yaw's cosine and sine, when already computed)."""
        cy, sy = yaw_cos_sin or (np.cos(self.yaw), np.sin(self.yaw))
        cp, sp = np.cos(self.pitch), np.sin(self.pitch)
        cr, sr = np.cos(self.roll), np.sin(self.roll)
        forward = _columns(sy * cp, sp, cy * cp)
        # up = Ry(yaw) Rx(-pitch) Rz(roll) (0, 1, 0)
        ux, uy, uz = -sr, cr * cp, cr * -sp
        up = _columns(ux * cy + uz * sy, uy, -ux * sy + uz * cy)
        return forward, up

    def _feet_down(self) -> np.ndarray:
        """(N, 4) bool: each lower leg reaches the ground."""
        tilt = _TILT_REACH * (self.pitch - _LEVEL_PITCH)[:, None] * -_FRONT  # nose down: front feet reach
        return self.joints[:, 8:12] + tilt >= 0.5

    def _contacts(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        lower = self._feet_down()
        upper = self.joints[:, 0:4] > 0.7
        body = ((lower.sum(axis=1) <= 1) & (self._extension() @ _POSE[:, 0] < 0.45)
                | (np.abs(self.pitch - _LEVEL_PITCH) >= _MAX_TILT - 1e-9))
        return body, upper, lower

    def observe(self, yaw_cos_sin: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
        """The observations of the current state.

        Args:
            yaw_cos_sin: the cosine and sine of every dog's yaw, when already computed (see `_frame`);
                None computes them.

        Returns:
            (N, 59) float32.
        """
        n = self.config.num_agents
        body, upper, lower = self._contacts()
        obs = np.zeros((n, OBS_SIZE), dtype=np.float32)
        obs[:, 0] = body
        # Each leg part's block: contact, rotation X, Y, Z, strength.
        obs[:, _legs(_UPPER)] = upper
        obs[:, _legs(_UPPER + 1)] = self.targets[:, 0:4]
        obs[:, _legs(_UPPER + 2)] = self.targets[:, 4:8]
        obs[:, _legs(_UPPER + 4)] = self.strength[:, 0::2]
        obs[:, _legs(_LOWER)] = lower
        obs[:, _legs(_LOWER + 1)] = self.targets[:, 8:12]
        obs[:, _legs(_LOWER + 4)] = self.strength[:, 1::2]
        to_stick = self.stick - self.pos
        obs[:, 41:44] = to_stick / _norms(to_stick, keepdims=True)
        obs[:, 44:47] = self.pos - [0.0, _STAND_HEIGHT, 0.0]
        obs[:, 47:50] = self.vel
        obs[:, 50:53] = self.angvel
        forward, up = self._frame(yaw_cos_sin)
        obs[:, 53:56] = forward
        obs[:, 56:59] = up
        return obs

    def poses(self) -> np.ndarray:
        """Every dog's pose, for drawing (columns in `envs.standin.poses`).

        Returns:
            (N, POSE_SIZE) float32.
        """
        out = np.empty((self.config.num_agents, pose.POSE_SIZE), np.float32)
        body, _, lower = self._contacts()
        out[:, pose.ARENA] = self.config.arena_size
        out[:, pose.POSITION] = self.pos
        out[:, pose.YAW] = self.yaw
        out[:, pose.PITCH] = self.pitch
        out[:, pose.ROLL] = self.roll
        out[:, pose.JOINTS] = self.joints
        out[:, pose.STRENGTH] = self.strength
        out[:, pose.FEET_DOWN] = lower
        out[:, pose.BODY_CONTACT] = body
        out[:, pose.STICK] = self.stick[:, [0, 2]]
        return out

    def _scripted_ends(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Reward, reached and interrupted of the scripted episodes (see `SimConfig`)."""
        slot = np.arange(self.config.num_agents)
        done = self.steps >= self.config.episode_length + slot * self.config.episode_length_step
        reward = np.where(done, slot, 0).astype(np.float64)
        return reward, done & (slot % 2 == 0), done & (slot % 2 == 1)

    def step(self, actions: np.ndarray) -> StepResult:
        """Apply one decision's actions for DT seconds; finished slots restart at once.

        Args:
            actions: (N, 21); clipped to [-1, 1], NaN read as 0.

        Returns:
            The decision's output, one row per agent in slot order.

        Raises:
            ValueError: actions of another shape.
        """
        n = self.config.num_agents
        actions = np.asarray(actions, dtype=np.float64)
        if actions.shape != (n, ACT_SIZE):
            raise ValueError(f"expected actions of shape ({n}, {ACT_SIZE}), got {actions.shape}")
        a = _clip(actions, -1.0, 1.0)
        a[np.isnan(a)] = 0.0
        targets = np.empty((n, 12))
        targets[:, 0:4] = (a[:, 0:8:2] + 1) / 2  # upper legs X
        targets[:, 4:8] = (a[:, 1:8:2] + 1) / 2  # upper legs Y
        targets[:, 8:12] = (a[:, 8:12] + 1) / 2  # lower legs X
        self.targets = targets
        self.strength = (a[:, 12:20] + 1) / 2
        joint_strength = np.concatenate([self.strength[:, 0::2], self.strength[:, 0::2],
                                         self.strength[:, 1::2]], axis=1)
        old_joints = self.joints.copy()
        self.joints += (0.25 + 0.35 * joint_strength) * (targets - self.joints)
        turn = _clip(a[:, 20], 0.0, 1.0)

        # Feet on the ground that sweep backward push the body along its heading.
        lower = self._feet_down()
        sweep = (old_joints[:, 4:8] - self.joints[:, 4:8]) * _MIRROR / DT
        sweep = _clip(sweep, -_MAX_SWEEP, _MAX_SWEEP)
        thrust = (lower * self.strength[:, 1::2] * sweep).sum(axis=1)
        to_stick = self.stick - self.pos
        bearing = np.arctan2(to_stick[:, 0], to_stick[:, 2]) - self.yaw
        bearing = (bearing + np.pi) % (2 * np.pi) - np.pi
        # Legs on one side swung forward and on the other back (Y, mirrored) turn the body;
        # a symmetric pose (Y_left = 1 - Y_right, as the trained policies hold) does not.
        splay = self.joints[:, 4:8] - 0.5
        yaw_rate = 3.0 * turn * _clip(bearing, -1, 1) + 4.0 * splay.sum(axis=1)
        old_pos, old_pitch, old_roll = self.pos.copy(), self.pitch.copy(), self.roll.copy()
        self.yaw = (self.yaw + yaw_rate * DT + np.pi) % (2 * np.pi) - np.pi
        cos_yaw, sin_yaw = np.cos(self.yaw), np.sin(self.yaw)
        speed = 0.5 * np.hypot(self.vel[:, 0], self.vel[:, 2]) * np.sign(
            self.vel[:, 0] * sin_yaw + self.vel[:, 2] * cos_yaw
        ) + 1.0 * thrust
        self._pose()
        horizontal = _columns(sin_yaw, cos_yaw) * speed[:, None]
        arena = self.config.arena_size
        self.pos[:, 0:3:2] = _clip(old_pos[:, 0:3:2] + horizontal * DT, -arena, arena)
        self.vel = (self.pos - old_pos) / DT
        self.angvel = _columns(
            (self.pitch - old_pitch) / DT * cos_yaw,
            yaw_rate,
            (self.roll - old_roll) / DT * cos_yaw,
        )
        self.steps += 1

        to_stick = self.stick - self.pos
        distance = _norms(to_stick)
        direction = to_stick / distance[:, None]
        reward = 0.01 * np.einsum("ij,ij->i", self.vel, direction) - 0.001 - 0.001 * turn
        reached = distance < STICK_RADIUS
        interrupted = ~reached & (self.config.max_steps > 0) & (self.steps >= self.config.max_steps)
        if self.config.episode_length > 0:
            reward, reached, interrupted = self._scripted_ends()
        done = reached | interrupted
        obs = self.observe((cos_yaw, sin_yaw))
        agent_id = self.agent_id.copy()
        if self.config.render:  # the finished dogs' last poses, before they respawn
            self.final_poses = self.poses()[done] if done.any() else self.final_poses[:0]
        self._respawn(done)
        new_obs = self.observe() if done.any() else obs
        return StepResult(obs, reward.astype(np.float32), done, interrupted, agent_id,
                          np.where(done, self.agent_id, -1), new_obs)
