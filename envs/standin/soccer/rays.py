"""Ray perception as ML-Agents' `RayPerceptionSensor` (com.unity.ml-agents, Runtime/Sensors)
encodes it, for the SoccerTwos agents' two sensors, and the stacking of its frames.

Rays (`RayPerceptionSensorComponentBase.GetRayAnglesAlternating`, the scene's sensors use the
alternating order): angle 90 degrees is the sensor's forward, then 90 - d, 90 + d, 90 - 2d, ...
with d = max degrees / rays per direction. A ray at angle a points along cos(a) * right +
sin(a) * forward of the sensor, so angles below 90 lean right. The forward sensor has 5 rays per
direction over 60 degrees (11 rays: 90, 78, 102, 66, 114, 54, 126, 42, 138, 30, 150); the
backward one, on a child object turned 180 degrees, 1 ray per direction over 45 degrees (3 rays:
90, 45, 135 in its own frame, so its ray at 45 points back and to the agent's left).

Per ray (`RayPerceptionOutput.RayOutput.ToFloatArray`): a one-hot of the detectable tag hit
(all zeros when nothing tagged was hit), then 1 if the ray hit nothing else 0, then the hit
distance as a fraction of the ray length (1 when nothing was hit): 6 tags + 2 = 8 values, rays in
the angle order above. The tags, from each agent's point of view (`DETECTABLE_TAGS`): ball, own
goal, opposing goal, wall, teammate, opponent.

Each ray is a sphere cast (`cast`); the frames are stacked three deep (`FrameStack`).
"""

from __future__ import annotations

import numpy as np

from envs.standin.soccer import field

DETECTABLE_TAGS = ("ball", "ownGoal", "opposingGoal", "wall", "teammate", "opponent")
"""The scene's detectable tags in sensor order, named from the agent's side (blue agents list
blueGoal, purpleGoal, blueAgent, purpleAgent for own goal, opposing goal, teammate, opponent;
purple agents the other way round)."""
BALL, OWN_GOAL, OPPOSING_GOAL, WALL, TEAMMATE, OPPONENT = range(6)
NUM_TAGS = len(DETECTABLE_TAGS)
VALUES_PER_RAY = NUM_TAGS + 2
STACKS = 3


def alternating_angles(rays_per_direction: int, max_degrees: float) -> np.ndarray:
    """Ray angles in the order of `GetRayAnglesAlternating`.

    Args:
        rays_per_direction: rays on each side of the centre.
        max_degrees: the outermost ray's angle from the centre.

    Returns:
        Degrees, 90 (the centre) first, then alternating right (below 90) and left.
    """
    delta = max_degrees / rays_per_direction
    angles = [90.0]
    for i in range(1, rays_per_direction + 1):
        angles += [90.0 - i * delta, 90.0 + i * delta]
    return np.array(angles)


FORWARD_ANGLES = alternating_angles(5, 60.0)
BACKWARD_ANGLES = alternating_angles(1, 45.0)
FORWARD_RAYS, BACKWARD_RAYS = len(FORWARD_ANGLES), len(BACKWARD_ANGLES)
FORWARD_SIZE = FORWARD_RAYS * VALUES_PER_RAY * STACKS
"""264: obs_0, the forward sensor's stacked frames."""
BACKWARD_SIZE = BACKWARD_RAYS * VALUES_PER_RAY * STACKS
"""72: obs_1, the backward sensor's stacked frames."""
SENSOR_NAMES = ("StackingSensor_size3_{team}RayPerceptionSensor",
                "StackingSensor_size3_{team}RayPerceptionSensorReverse")
"""Observation names as Unity reports them (`StackingSensor` wraps each sensor, named
BlueRayPerceptionSensor[Reverse] or PurpleRayPerceptionSensor[Reverse]); agents order their
sensors by name, hence forward (obs_0) before backward (obs_1)."""

_RIGHT_AND_FORWARD = np.concatenate([
    np.stack([np.cos(np.radians(FORWARD_ANGLES)), np.sin(np.radians(FORWARD_ANGLES))], axis=1),
    -np.stack([np.cos(np.radians(BACKWARD_ANGLES)), np.sin(np.radians(BACKWARD_ANGLES))], axis=1),
])
"""(14, 2): each ray's direction as (right, forward) components in the agent's frame."""
NUM_RAYS = len(_RIGHT_AND_FORWARD)


def ray_directions(yaw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The unit directions of every ray of agents, the forward sensor's then the backward one's.

    Args:
        yaw: (K,) the agents' headings.

    Returns:
        (x, z) components, each (K, 14).
    """
    sin, cos = np.sin(yaw)[:, None], np.cos(yaw)[:, None]
    right_part, forward_part = _RIGHT_AND_FORWARD[:, 0], _RIGHT_AND_FORWARD[:, 1]
    # right = (cos yaw, -sin yaw), forward = (sin yaw, cos yaw)
    return right_part * cos + forward_part * sin, forward_part * cos - right_part * sin


def _first_circle_hits(x: np.ndarray, z: np.ndarray, dx: np.ndarray, dz: np.ndarray,
                       cx: np.ndarray, cz: np.ndarray, radius: np.ndarray
                       ) -> tuple[np.ndarray, np.ndarray]:
    """(M, rays, K) distance along each ray from (x, z) (K,) in directions (dx, dz) (rays, K)
    at which it first comes within `radius` (M,) of the centres (cx, cz) (M, K), and whether it
    does: not when never, beyond the ray's length, or already within at the start (the distance
    is then any value, NaN included)."""
    ox, oz = cx - x, cz - z
    along = dx * ox[:, None, :] + dz * oz[:, None, :]
    outside = ox * ox + oz * oz - (radius * radius)[:, None]  # > 0: the cast starts clear of it
    with np.errstate(invalid="ignore"):  # no real root: the ray misses (NaN fails the tests)
        distance = along - np.sqrt(along * along - outside[:, None, :])
    return distance, (distance >= 0) & (distance <= _RAY_LENGTH) & (outside > 0)[:, None, :]


# The casts run in float32 (the observations' precision; 2e-6 m at 20 m), half the memory
# traffic of float64 over the (pieces, rays, agents) arrays. Per static piece, (pieces, 1)
# columns against (pieces, agents) arrays.
_FACE_CLEARANCE = field.WALL_HALF_THICKNESS + field.RAY_CAST_RADIUS
_NX, _NZ = (c[:, None] for c in field.WALL_NORMAL.T.astype(np.float32))
_UX, _UZ = (c[:, None] for c in field.WALL_DIRECTION.T.astype(np.float32))
_NORMAL_OFFSET = (np.einsum("pd,pd->p", field.WALL_CENTRE, field.WALL_NORMAL)
                  + _FACE_CLEARANCE).astype(np.float32)[:, None]
_ALONG_OFFSET = np.einsum("pd,pd->p", field.WALL_CENTRE, field.WALL_DIRECTION).astype(
    np.float32)[:, None]
_HALF_LENGTH = field.WALL_HALF_LENGTH.astype(np.float32)[:, None]
_RAY_LENGTH = np.float32(field.RAY_LENGTH)


def _first_face_hits(x: np.ndarray, z: np.ndarray, dx: np.ndarray, dz: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray]:
    """(pieces, rays, K) distance along each ray at which the cast sphere first touches a
    static piece's play-area face, and whether it does within the piece's length (the distance
    is any value where not)."""
    height = x * _NX + z * _NZ - _NORMAL_OFFSET  # (pieces, K)
    closing = dx * _NX[:, None] + dz * _NZ[:, None]  # (pieces, rays, K)
    with np.errstate(divide="ignore", invalid="ignore"):  # parallel rays give inf or NaN
        distance = -height[:, None, :] / closing
    along = ((x * _UX + z * _UZ - _ALONG_OFFSET)[:, None, :]
             + distance * (dx * _UX[:, None] + dz * _UZ[:, None]))
    return distance, ((distance >= 0) & (distance <= _RAY_LENGTH) & (height > 0)[:, None, :]
                      & (np.abs(along) <= _HALF_LENGTH[:, None]))


def cast(x: np.ndarray, z: np.ndarray, yaw: np.ndarray, body_x: np.ndarray,
         body_z: np.ndarray, body_radius: np.ndarray, body_tag: np.ndarray,
         wall_tag: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Cast every ray of K agents.

    Each ray is a sphere cast (radius 0.5, length 20) from 0.5 above the agent's centre. Like
    Unity's sphere casts it does not report what the sphere overlaps where it starts (so an
    agent never sees itself). The distance is how far the sphere's centre travels until it
    first touches something.

    Args:
        x, z: (K,) the agents' positions.
        yaw: (K,) their headings.
        body_x, body_z: (K, M) the moving bodies each agent may see (its own included: it is
            never seen).
        body_radius: (M,) how far from a body's centre a cast first touches it
            (`field.RAY_AGENT_RADIUS`, `field.RAY_BALL_RADIUS`).
        body_tag: (K, M) each body's tag index for that agent.
        wall_tag: (K, pieces) each static piece's tag index for that agent.

    Returns:
        distance: (K, 14) float32 hit distance in metres (inf where nothing was hit);
        tag: (K, 14) the tag index of what was hit (-1 where nothing was).
    """
    # Arrays are laid out (candidates, rays, agents), agents innermost, so that every
    # broadcast runs along the longest axis; each value is the same elementwise operation.
    dx, dz = (np.ascontiguousarray(d.T, dtype=np.float32) for d in ray_directions(yaw))
    x, z = x.astype(np.float32), z.astype(np.float32)
    hits = (_first_circle_hits(x, z, dx, dz, np.ascontiguousarray(body_x.T, dtype=np.float32),
                               np.ascontiguousarray(body_z.T, dtype=np.float32),
                               body_radius.astype(np.float32)),
            _first_face_hits(x, z, dx, dz))
    candidates = _hit_or_inf(np.concatenate([d for d, _ in hits]),
                             np.concatenate([valid for _, valid in hits]))
    # The nearest candidate and the first of equals, as `np.argmin` picks it.
    distance = np.minimum.reduce(candidates, axis=0)
    first = len(candidates) - ((candidates == distance) * _COUNTDOWN[-len(candidates):]).max(0)
    tag = np.concatenate([body_tag, wall_tag], axis=1)[np.arange(len(x)), first].T
    distance = np.ascontiguousarray(distance.T)
    return distance, np.where(np.isfinite(distance), tag, -1)


_COUNTDOWN = np.arange(64, 0, -1, dtype=np.int8)[:, None, None]
"""Weights that make the first of equal candidates the largest (up to 64 candidates)."""


def _hit_or_inf(distance: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """`np.where(valid, distance, inf)` (`distance` is never NaN where `valid`), with float
    arithmetic, several times faster than a masked select: `np.fmax` with -inf keeps a valid
    distance and with +inf gives inf whatever the distance."""
    bound = (~valid).astype(np.float32)
    bound *= 2
    bound -= 1
    bound *= np.float32(np.inf)
    return np.fmax(distance, bound)


_ONE_HOT = np.array([*range(NUM_TAGS), -1])
"""The tag each of a ray's first 7 values flags: one per detectable tag, then -1 (nothing)."""


def encode(distance: np.ndarray, tag: np.ndarray) -> np.ndarray:
    """Frames in `RayPerceptionSensor`'s layout from `cast`'s output.

    Args:
        distance: (K, rays) hit distances (inf where nothing was hit).
        tag: (K, rays) the tag hit, or -1.

    Returns:
        (K, rays * 8) float32.
    """
    k, rays = distance.shape
    out = np.empty((k, rays, VALUES_PER_RAY), dtype=np.float32)
    out[..., :NUM_TAGS + 1] = tag[..., None] == _ONE_HOT
    # A hit lies within the ray's length: its fraction is at most 1; a miss (inf) gives 1.
    out[..., NUM_TAGS + 1] = np.fmin(distance / field.RAY_LENGTH, 1.0)
    return out.reshape(k, rays * VALUES_PER_RAY)


class FrameStack:
    """The last `STACKS` frames of each agent's two sensors, oldest first, kept as the stacked
    observation (forward frames, then backward frames), as ML-Agents' `StackingSensor` keeps them:
    a frame is taken at each decision and at the episode's end, and a new episode starts from
    zeros (the sensor's Reset), so its first observation is (0, 0, frame).

    Args:
        rows: the agents.
    """

    _SENSORS = ((0, FORWARD_RAYS * VALUES_PER_RAY), (FORWARD_SIZE, BACKWARD_RAYS * VALUES_PER_RAY))
    """(first column in the observation, values per frame) of each sensor."""

    def __init__(self, rows: int) -> None:
        self.stacked = np.zeros((rows, FORWARD_SIZE + BACKWARD_SIZE), np.float32)
        self._every = np.arange(rows)

    def push(self, rows: np.ndarray, frames: np.ndarray) -> np.ndarray:
        """Add a frame to some agents.

        Args:
            rows: the agents.
            frames: (len(rows), 14 * 8) their new frames.

        Returns:
            Their stacked observations, (len(rows), 264 + 72).
        """
        every = len(rows) == len(self._every) and np.array_equal(rows, self._every)
        stacked = self.stacked if every else self.stacked[rows]
        taken = 0
        for start, size in self._SENSORS:
            stacked[:, start:start + (STACKS - 1) * size] = stacked[:, start + size:
                                                                    start + STACKS * size]
            stacked[:, start + (STACKS - 1) * size:start + STACKS * size] = frames[
                :, taken:taken + size]
            taken += size
        if every:
            return stacked.copy()
        self.stacked[rows] = stacked
        return stacked

    def clear(self, rows: np.ndarray) -> None:
        """Start agents from zeros (a new episode).

        Args:
            rows: the agents.
        """
        self.stacked[rows] = 0.0
