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

Each ray is a sphere cast (radius 0.5, length 20) from 0.5 above the agent's centre. Like
Unity's sphere casts it does not report what the sphere overlaps where it starts (so an agent
never sees itself). The distance is how far the sphere's centre travels until it first touches
something.

Stacking (`StackingSensor`, 3 frames): the observation is the last three frames, oldest first;
a frame is taken at each decision and at the episode's end, and a new episode starts from zeros
(the sensor's Reset), so its first observation is (0, 0, frame).
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
    """Ray angles in degrees, centre first then alternating right and left
    (`GetRayAnglesAlternating`)."""
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
    """x and z components, each (K, 14), of the unit directions of the forward then the
    backward sensor's rays, for agents with headings `yaw` (K,)."""
    sin, cos = np.sin(yaw)[:, None], np.cos(yaw)[:, None]
    right_part, forward_part = _RIGHT_AND_FORWARD[:, 0], _RIGHT_AND_FORWARD[:, 1]
    # right = (cos yaw, -sin yaw), forward = (sin yaw, cos yaw)
    return right_part * cos + forward_part * sin, forward_part * cos - right_part * sin


def _first_circle_hits(x: np.ndarray, z: np.ndarray, dx: np.ndarray, dz: np.ndarray,
                       cx: np.ndarray, cz: np.ndarray, radius: np.ndarray) -> np.ndarray:
    """(K, rays, M) distance along each ray from (x, z) (K,) in directions (dx, dz) (K, rays)
    at which it first comes within `radius` (M,) of the centres (cx, cz) (K, M), or inf: never,
    beyond the ray's length, or already within at the start."""
    ox, oz = cx - x[:, None], cz - z[:, None]
    along = dx[:, :, None] * ox[:, None, :] + dz[:, :, None] * oz[:, None, :]
    outside = ox * ox + oz * oz - radius * radius  # > 0: the cast starts clear of it
    with np.errstate(invalid="ignore"):  # no real root: the ray misses (NaN fails the tests)
        distance = along - np.sqrt(along * along - outside[:, None, :])
    valid = (distance >= 0) & (distance <= _RAY_LENGTH) & (outside > 0)[:, None, :]
    return np.where(valid, distance, np.float32(np.inf))


# The casts run in float32 (the observations' precision; 2e-6 m at 20 m), half the memory
# traffic of float64 over the (agents, rays, pieces) arrays.
_FACE_CLEARANCE = field.WALL_HALF_THICKNESS + field.RAY_CAST_RADIUS
_NX, _NZ = field.WALL_NORMAL.T.astype(np.float32)
_UX, _UZ = field.WALL_DIRECTION.T.astype(np.float32)
_NORMAL_OFFSET = (np.einsum("pd,pd->p", field.WALL_CENTRE, field.WALL_NORMAL)
                  + _FACE_CLEARANCE).astype(np.float32)
_ALONG_OFFSET = np.einsum("pd,pd->p", field.WALL_CENTRE, field.WALL_DIRECTION).astype(np.float32)
_HALF_LENGTH = field.WALL_HALF_LENGTH.astype(np.float32)
_RAY_LENGTH = np.float32(field.RAY_LENGTH)


def _first_face_hits(x: np.ndarray, z: np.ndarray, dx: np.ndarray, dz: np.ndarray
                     ) -> np.ndarray:
    """(K, rays, pieces) distance along each ray at which the cast sphere first touches a static
    piece's play-area face, within the piece's length, or inf."""
    height = x[:, None] * _NX + z[:, None] * _NZ - _NORMAL_OFFSET  # (K, pieces)
    closing = dx[:, :, None] * _NX + dz[:, :, None] * _NZ  # (K, rays, pieces)
    with np.errstate(divide="ignore", invalid="ignore"):  # parallel rays give inf or NaN
        distance = -height[:, None, :] / closing
    along = ((x[:, None] * _UX + z[:, None] * _UZ - _ALONG_OFFSET)[:, None, :]
             + distance * (dx[:, :, None] * _UX + dz[:, :, None] * _UZ))
    valid = ((distance >= 0) & (distance <= _RAY_LENGTH) & (height > 0)[:, None, :]
             & (np.abs(along) <= _HALF_LENGTH))
    return np.where(valid, distance, np.float32(np.inf))


def cast(x: np.ndarray, z: np.ndarray, yaw: np.ndarray, body_x: np.ndarray,
         body_z: np.ndarray, body_radius: np.ndarray, body_tag: np.ndarray,
         wall_tag: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Cast every ray of K agents.

    Args:
        x, z: (K,) the agents' positions.
        yaw: (K,) their headings.
        body_x, body_z: (K, M) the moving bodies each agent may see (its own included: it is
            never seen, see the module docstring).
        body_radius: (M,) how far from a body's centre a cast first touches it
            (`field.RAY_AGENT_RADIUS`, `field.RAY_BALL_RADIUS`).
        body_tag: (K, M) each body's tag index for that agent.
        wall_tag: (K, pieces) each static piece's tag index for that agent.

    Returns:
        distance: (K, 14) float32 hit distance in metres (inf where nothing was hit);
        tag: (K, 14) the tag index of what was hit (-1 where nothing was).
    """
    dx, dz = (d.astype(np.float32) for d in ray_directions(yaw))
    x, z = x.astype(np.float32), z.astype(np.float32)
    candidates = np.concatenate([
        _first_circle_hits(x, z, dx, dz, body_x.astype(np.float32), body_z.astype(np.float32),
                           body_radius.astype(np.float32)),
        _first_face_hits(x, z, dx, dz),
    ], axis=2)
    tags = np.concatenate([body_tag, wall_tag], axis=1)
    first = np.argmin(candidates, axis=2)
    distance = np.take_along_axis(candidates, first[..., None], axis=2)[..., 0]
    tag = np.take_along_axis(tags, first, axis=1)
    return distance, np.where(np.isfinite(distance), tag, -1)


def encode(distance: np.ndarray, tag: np.ndarray) -> np.ndarray:
    """(K, rays * 8) float32 frames in `RayPerceptionSensor`'s layout from `cast`'s output."""
    k, rays = distance.shape
    out = np.zeros((k, rays, VALUES_PER_RAY), dtype=np.float32)
    hit = tag >= 0
    rows, columns = np.nonzero(hit)
    out[rows, columns, tag[hit]] = 1.0
    out[..., NUM_TAGS] = ~hit
    out[..., NUM_TAGS + 1] = np.where(hit, distance / field.RAY_LENGTH, 1.0)
    return out.reshape(k, rays * VALUES_PER_RAY)


class FrameStack:
    """The last `STACKS` frames of each of `rows` agents' two sensors, oldest first, as the
    stacked observation (forward frames, then backward frames)."""

    def __init__(self, rows: int) -> None:
        self.forward = np.zeros((rows, STACKS, FORWARD_RAYS * VALUES_PER_RAY), np.float32)
        self.backward = np.zeros((rows, STACKS, BACKWARD_RAYS * VALUES_PER_RAY), np.float32)

    def push(self, rows: np.ndarray, frames: np.ndarray) -> np.ndarray:
        """Add a frame (len(rows), 14 * 8) to each of `rows`; their stacked observations
        (len(rows), 264 + 72)."""
        split = FORWARD_RAYS * VALUES_PER_RAY
        for stack, part in ((self.forward, frames[:, :split]), (self.backward, frames[:, split:])):
            stack[rows, :-1] = stack[rows, 1:]
            stack[rows, -1] = part
        return np.concatenate([self.forward[rows].reshape(len(rows), -1),
                               self.backward[rows].reshape(len(rows), -1)], axis=1)

    def clear(self, rows: np.ndarray) -> None:
        """Start `rows` from zeros (a new episode)."""
        self.forward[rows] = 0.0
        self.backward[rows] = 0.0
