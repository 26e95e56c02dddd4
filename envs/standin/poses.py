"""The render side channel: the stand-in's Huggy pose data, as both ends read and write it.

Rendering draws frames from the stand-in's state, never inside the simulation. When the
environment parameter `render` is 1 (`UnityVectorEnv(render_mode="rgb_array")` sets it), the
stand-in adds one record on this side channel to every observation message, as a Unity scene
sends its own side channels: the pose of every agent after the reset or step (`POSE_SIZE`
float32 columns, below), with its agent id, and for each agent whose episode ended in that step
its last pose, taken before the dog respawned (with the finished agent's id). With the parameter
unset the messages are exactly what they are without rendering.

Record payload, little-endian: int32 version (1), int32 n, int32 m, n int64 ids, n x POSE_SIZE
float32 poses, m int64 finished ids, m x POSE_SIZE float32 last poses.
"""

from __future__ import annotations

import struct
import uuid
from typing import NamedTuple

import numpy as np

RENDER_CHANNEL_ID = uuid.UUID("4e683e21-8c91-485a-9ec3-02b07b41cedd")
"""The side channel's id (its own: it is no ML-Agents channel)."""
RENDER_PARAMETER = "render"
"""The environment parameter that turns the channel on (1) in the stand-in."""
VERSION = 1

# Pose columns (metres and radians, in the simulation's frame: x and z span the arena floor,
# y is up; the body's heading is (sin yaw, cos yaw) on the floor).
ARENA = 0  # half-width of the square arena
POSITION = slice(1, 4)  # body x, y (height), z
YAW, PITCH, ROLL = 4, 5, 6  # heading; nose up; roll toward the right
JOINTS = slice(7, 19)  # 12 joint rotations in [0, 1]: upper legs X (4), upper Y (4), lower X (4)
STRENGTH = slice(19, 27)  # 8 joint strengths in [0, 1]: upper, lower of each leg
FEET_DOWN = slice(27, 31)  # 4 flags: each lower leg reaches the ground
BODY_CONTACT = 31  # flag: nose or belly on the ground
STICK = slice(32, 34)  # stick x, z
POSE_SIZE = 34

_HEAD = struct.Struct("<iii")


class PoseMessage(NamedTuple):
    """One record: every agent's pose, and the last pose of agents that just finished."""

    ids: np.ndarray  # (n,) int64
    poses: np.ndarray  # (n, POSE_SIZE) float32
    final_ids: np.ndarray  # (m,) int64
    final_poses: np.ndarray  # (m, POSE_SIZE) float32


def encode_record(ids: np.ndarray, poses: np.ndarray, final_ids: np.ndarray,
                  final_poses: np.ndarray) -> bytes:
    """The side-channel bytes of one record.

    Args:
        ids: (n,) every agent's id.
        poses: (n, POSE_SIZE) their poses.
        final_ids: (m,) the ids of agents whose episode ended.
        final_poses: (m, POSE_SIZE) their last poses.

    Returns:
        The channel id, the payload's length and the payload.
    """
    payload = b"".join((
        _HEAD.pack(VERSION, len(ids), len(final_ids)),
        np.ascontiguousarray(ids, "<i8").tobytes(), np.ascontiguousarray(poses, "<f4").tobytes(),
        np.ascontiguousarray(final_ids, "<i8").tobytes(),
        np.ascontiguousarray(final_poses, "<f4").tobytes()))
    return RENDER_CHANNEL_ID.bytes_le + struct.pack("<i", len(payload)) + payload


def decode_payload(payload: bytes) -> PoseMessage:
    """The record of a side-channel payload.

    Args:
        payload: the bytes after the channel id and length.

    Returns:
        The record.

    Raises:
        ValueError: another version, or a size that does not match its counts.
    """
    version, n, m = _HEAD.unpack_from(payload, 0)
    expected = _HEAD.size + (n + m) * (8 + 4 * POSE_SIZE)
    if version != VERSION or len(payload) != expected:
        raise ValueError(f"expected a version {VERSION} pose record of {expected} bytes, got "
                         f"version {version} and {len(payload)} bytes")
    offset = _HEAD.size
    arrays = []
    for count, dtype, width in ((n, "<i8", 1), (n, "<f4", POSE_SIZE), (m, "<i8", 1),
                                (m, "<f4", POSE_SIZE)):
        size = count * width
        values = np.frombuffer(payload, dtype, size, offset)
        offset += size * values.itemsize
        arrays.append(values.astype(np.int64 if dtype == "<i8" else np.float32)
                      .reshape((count, width) if width > 1 else (count,)))
    return PoseMessage(*arrays)
